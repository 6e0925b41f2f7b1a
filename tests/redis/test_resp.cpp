// SPDX-License-Identifier: MIT
// The RESP reply handling of redis::connection, on byte strings, without a socket or a server: every kind
// of reply, nested arrays, replies split across reads or sharing one, bytes that are not RESP, and the
// encoding of a command.
#include "catch.hpp"

#include <resilience/redis/resp.hpp>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace redis_test_resp {

namespace redis = resilience::redis;
using redis::detail::reply_reader;
using kind = redis::reply::kind;

namespace {

// The one reply in `bytes`, which must hold exactly one.
redis::reply only_reply(std::string_view bytes) {
    reply_reader reader;
    reader.feed(bytes);
    std::optional<redis::reply> r = reader.next();
    REQUIRE(r.has_value());
    CHECK(!reader.next().has_value());
    CHECK(!reader.failed());
    return std::move(*r);
}

} // namespace

TEST_CASE("redis resp: a simple string is a status", "[redis][resp]") {
    const redis::reply r = only_reply("+OK\r\n");
    CHECK(r.type == kind::status);
    CHECK(r.str == "OK");
    CHECK(!r.is_error());
}

TEST_CASE("redis resp: an error reply keeps its text and says it is an error", "[redis][resp]") {
    const redis::reply r = only_reply("-ERR unknown command 'FOO'\r\n");
    CHECK(r.type == kind::error);
    CHECK(r.is_error());
    CHECK(r.str == "ERR unknown command 'FOO'");
}

TEST_CASE("redis resp: integers, negative ones included", "[redis][resp]") {
    const redis::reply r = only_reply(":1000\r\n");
    CHECK(r.type == kind::integer);
    CHECK(r.integer == 1000);
    CHECK(only_reply(":-42\r\n").integer == -42);
    CHECK(only_reply(":9223372036854775807\r\n").integer == 9223372036854775807LL);
}

TEST_CASE("redis resp: bulk strings, empty and binary ones included, and the null bulk string",
          "[redis][resp]") {
    const redis::reply hello = only_reply("$5\r\nhello\r\n");
    CHECK(hello.type == kind::string);
    CHECK(hello.str == "hello");
    const redis::reply empty = only_reply("$0\r\n\r\n");
    CHECK(empty.type == kind::string);
    CHECK(empty.str.empty());
    // The length, not a line end, says where a bulk string ends.
    const redis::reply binary = only_reply(std::string_view{"$5\r\na\r\n\0b\r\n", 11});
    CHECK(binary.str == std::string("a\r\n\0b", 5));
    const redis::reply null = only_reply("$-1\r\n");
    CHECK(null.type == kind::nil);
    CHECK(null.str.empty());
}

TEST_CASE("redis resp: arrays of mixed elements, the empty array and the null array", "[redis][resp]") {
    const redis::reply r = only_reply("*4\r\n:1\r\n$3\r\ntwo\r\n+three\r\n$-1\r\n");
    REQUIRE(r.type == kind::array);
    REQUIRE(r.elements.size() == 4);
    CHECK(r.elements[0].type == kind::integer);
    CHECK(r.elements[0].integer == 1);
    CHECK(r.elements[1].type == kind::string);
    CHECK(r.elements[1].str == "two");
    CHECK(r.elements[2].type == kind::status);
    CHECK(r.elements[2].str == "three");
    CHECK(r.elements[3].type == kind::nil);
    const redis::reply empty = only_reply("*0\r\n");
    CHECK(empty.type == kind::array);
    CHECK(empty.elements.empty());
    CHECK(only_reply("*-1\r\n").type == kind::nil);
}

TEST_CASE("redis resp: nested arrays keep their shape", "[redis][resp]") {
    // [[1, [two]], [], -ERR inner]: what EVAL of a script returning nested tables looks like.
    const redis::reply r = only_reply("*3\r\n*2\r\n:1\r\n*1\r\n$3\r\ntwo\r\n*0\r\n-ERR inner\r\n");
    REQUIRE(r.type == kind::array);
    REQUIRE(r.elements.size() == 3);
    const redis::reply& first = r.elements[0];
    REQUIRE(first.type == kind::array);
    REQUIRE(first.elements.size() == 2);
    CHECK(first.elements[0].integer == 1);
    REQUIRE(first.elements[1].type == kind::array);
    REQUIRE(first.elements[1].elements.size() == 1);
    CHECK(first.elements[1].elements[0].str == "two");
    CHECK(r.elements[1].type == kind::array);
    CHECK(r.elements[1].elements.empty());
    CHECK(r.elements[2].is_error()); // an error inside an array is an element, not the reply's failure
    CHECK(!r.is_error());
}

TEST_CASE("redis resp: a reply split across two reads comes out once its last byte is fed", "[redis][resp]") {
    reply_reader reader;
    SECTION("a bulk string cut in its data") {
        reader.feed("$11\r\nhello ");
        CHECK(!reader.next().has_value());
        reader.feed("world\r\n");
        const std::optional<redis::reply> r = reader.next();
        REQUIRE(r.has_value());
        CHECK(r->str == "hello world");
    }
    SECTION("an array cut between its header's \\r and \\n") {
        reader.feed("*2\r");
        CHECK(!reader.next().has_value());
        reader.feed("\n:1\r\n:2\r\n");
        const std::optional<redis::reply> r = reader.next();
        REQUIRE(r.has_value());
        REQUIRE(r->elements.size() == 2);
        CHECK(r->elements[1].integer == 2);
    }
    SECTION("a nested array fed one byte at a time") {
        const std::string_view bytes = "*2\r\n*1\r\n+a\r\n$1\r\nb\r\n";
        for (std::size_t i = 0; i + 1 < bytes.size(); ++i) {
            reader.feed(bytes.substr(i, 1));
            CHECK(!reader.next().has_value());
        }
        reader.feed(bytes.substr(bytes.size() - 1));
        const std::optional<redis::reply> r = reader.next();
        REQUIRE(r.has_value());
        REQUIRE(r->elements.size() == 2);
        CHECK(r->elements[0].elements.at(0).str == "a");
        CHECK(r->elements[1].str == "b");
    }
    CHECK(!reader.next().has_value());
    CHECK(!reader.failed());
}

TEST_CASE("redis resp: replies that share a read come out one by one, in order", "[redis][resp]") {
    reply_reader reader;
    reader.feed("+first\r\n:2\r\n$5\r\nthi");
    std::optional<redis::reply> r = reader.next();
    REQUIRE(r.has_value());
    CHECK(r->str == "first");
    r = reader.next();
    REQUIRE(r.has_value());
    CHECK(r->integer == 2);
    CHECK(!reader.next().has_value()); // the third is not complete yet
    reader.feed("rd\r\n");
    r = reader.next();
    REQUIRE(r.has_value());
    CHECK(r->str == "third");
}

TEST_CASE("redis resp: bytes that are not RESP fail the reader for good, after the replies before them",
          "[redis][resp]") {
    reply_reader reader;
    CHECK(reader.error_text().empty());
    reader.feed("+OK\r\n?what\r\n");
    const std::optional<redis::reply> ok = reader.next();
    REQUIRE(ok.has_value()); // the reply before the bad byte is whole and comes out
    CHECK(ok->str == "OK");
    CHECK(!reader.failed());
    CHECK(!reader.next().has_value());
    CHECK(reader.failed());
    // hiredis's text, which the connection puts in its errc::protocol error.
    INFO(std::string{reader.error_text()});
    CHECK(reader.error_text().find("Protocol error") != std::string_view::npos);
    // Nothing more comes out, however good the bytes after.
    reader.feed("+OK\r\n");
    CHECK(!reader.next().has_value());
    CHECK(reader.failed());
}

TEST_CASE("redis resp: a bad length in a header fails the reader", "[redis][resp]") {
    reply_reader reader;
    reader.feed("$abc\r\nxyz\r\n");
    CHECK(!reader.next().has_value());
    CHECK(reader.failed());
    CHECK(!reader.error_text().empty());
}

TEST_CASE("redis resp: a command is an array of bulk strings, which the reader reads back", "[redis][resp]") {
    std::string out;
    redis::detail::append_command(out, {"SET", "key", "a\r\nb"});
    CHECK(out == "*3\r\n$3\r\nSET\r\n$3\r\nkey\r\n$4\r\na\r\nb\r\n");
    redis::detail::append_command(out, {}); // appended, not replacing
    CHECK(out.ends_with("\r\n*0\r\n"));
    reply_reader reader;
    reader.feed(out);
    const std::optional<redis::reply> r = reader.next();
    REQUIRE(r.has_value());
    REQUIRE(r->elements.size() == 3);
    CHECK(r->elements[2].str == "a\r\nb");
    const std::optional<redis::reply> none = reader.next();
    REQUIRE(none.has_value());
    CHECK(none->elements.empty());
}

} // namespace redis_test_resp
