// SPDX-License-Identifier: MIT
/// \file redis/resp.hpp
/// RESP, the protocol Redis speaks, apart from any socket: `redis::reply`, the reader that turns the
/// bytes a server sends into replies (hiredis's RESP reader building our tree), and the encoding of a
/// command.
#pragma once

#include <hiredis/hiredis.h> // HIREDIS_MAJOR
#include <hiredis/read.h>

#include <cstddef>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace resilience::inline v0_2::redis {

/// One RESP reply. Strings, statuses and errors keep their text in `str`; integers in `integer`;
/// arrays their elements. A `nil` is a null bulk string or a null array.
struct reply {
    enum class kind : unsigned char { string, array, integer, nil, status, error };
    kind type = kind::nil;
    std::string str{};
    long long integer = 0;
    std::vector<reply> elements{};

    [[nodiscard]] bool is_error() const noexcept { return type == kind::error; }
};

namespace detail {

// hiredis's reader builds our `reply` tree: a root is allocated, a child is constructed in place in
// its parent's elements (sized by the array header), so only roots are ever freed.
struct reply_builder {
    static reply* place(const redisReadTask* task) {
        if (task->parent != nullptr)
            return &static_cast<reply*>(task->parent->obj)->elements[static_cast<std::size_t>(task->idx)];
        return new reply;
    }
    static void* create_string(const redisReadTask* task, char* s, std::size_t n) noexcept {
        try {
            reply* r = place(task);
            r->type = task->type == REDIS_REPLY_ERROR    ? reply::kind::error
                      : task->type == REDIS_REPLY_STATUS ? reply::kind::status
                                                         : reply::kind::string;
            r->str.assign(s, n);
            return r;
        } catch (...) {
            return nullptr;
        }
    }
    // hiredis 1.0 changed the reader's callbacks: an array's size became a size_t, and RESP3's
    // doubles and booleans got callbacks of their own (never called here, as the connection speaks
    // RESP2; should one come, a double keeps its text and a boolean becomes 0 or 1).
#if defined(HIREDIS_MAJOR) && HIREDIS_MAJOR >= 1
    using array_size = std::size_t;
#else
    using array_size = int;
#endif
    static void* create_array(const redisReadTask* task, array_size n) noexcept {
        try {
            reply* r = place(task);
            r->type = reply::kind::array;
            r->elements.resize(static_cast<std::size_t>(n));
            return r;
        } catch (...) {
            return nullptr;
        }
    }
    static void* create_integer(const redisReadTask* task, long long v) noexcept {
        try {
            reply* r = place(task);
            r->type = reply::kind::integer;
            r->integer = v;
            return r;
        } catch (...) {
            return nullptr;
        }
    }
    static void* create_nil(const redisReadTask* task) noexcept {
        try {
            reply* r = place(task);
            r->type = reply::kind::nil;
            return r;
        } catch (...) {
            return nullptr;
        }
    }
    static void free_object(void* r) noexcept { delete static_cast<reply*>(r); }

#if defined(HIREDIS_MAJOR) && HIREDIS_MAJOR >= 1
    static void* create_double(const redisReadTask* task, double, char* s, std::size_t n) noexcept {
        try {
            reply* r = place(task);
            r->type = reply::kind::string;
            r->str.assign(s, n);
            return r;
        } catch (...) {
            return nullptr;
        }
    }
    static void* create_bool(const redisReadTask* task, int v) noexcept {
        return create_integer(task, v != 0);
    }

    static redisReplyObjectFunctions* functions() noexcept {
        static redisReplyObjectFunctions fns{&create_string, &create_array, &create_integer, &create_double,
                                             &create_nil,    &create_bool,  &free_object};
        return &fns;
    }
#else
    static redisReplyObjectFunctions* functions() noexcept {
        static redisReplyObjectFunctions fns{&create_string, &create_array, &create_integer, &create_nil,
                                             &free_object};
        return &fns;
    }
#endif
};

/// A command as RESP: an array of bulk strings.
inline void append_command(std::string& out, const std::vector<std::string>& args) {
    out += '*';
    out += std::to_string(args.size());
    out += "\r\n";
    for (const std::string& a : args) {
        out += '$';
        out += std::to_string(a.size());
        out += "\r\n";
        out += a;
        out += "\r\n";
    }
}

/// Reads replies out of the bytes a server sends, as they arrive: `feed` what a read returned, then
/// take the complete replies with `next` until it has none; a reply split across reads comes out
/// once its last byte is fed. Bytes that are not RESP fail the reader for good: `failed()` is true,
/// `error_text()` says why (hiredis's text), and `next` returns no more replies. Not thread-safe.
class reply_reader {
public:
    reply_reader() : reader_(redisReaderCreateWithFunctions(reply_builder::functions())) {
        if (!reader_)
            throw std::bad_alloc{};
    }
    reply_reader(const reply_reader&) = delete;
    reply_reader& operator=(const reply_reader&) = delete;
    ~reply_reader() { redisReaderFree(reader_); }

    /// Appends `bytes` to what is waiting to be parsed (ignored once failed).
    void feed(std::string_view bytes) {
        if (!failed_ && redisReaderFeed(reader_, bytes.data(), bytes.size()) != REDIS_OK)
            failed_ = true;
    }

    /// The next complete reply, or none: more bytes are needed, or the reader has failed.
    std::optional<reply> next() {
        if (failed_)
            return std::nullopt;
        void* raw = nullptr;
        if (redisReaderGetReply(reader_, &raw) != REDIS_OK) {
            failed_ = true;
            return std::nullopt;
        }
        if (raw == nullptr)
            return std::nullopt;
        std::unique_ptr<reply> r{static_cast<reply*>(raw)};
        return std::move(*r);
    }

    [[nodiscard]] bool failed() const noexcept { return failed_; }
    /// Why the reader failed; empty while it has not.
    [[nodiscard]] std::string_view error_text() const noexcept { return failed_ ? reader_->errstr : ""; }

private:
    redisReader* reader_;
    bool failed_ = false;
};

} // namespace detail

} // namespace resilience::redis
