// SPDX-License-Identifier: MIT
/// \file detail/ring.hpp
/// A growable FIFO ring buffer: a queue whose steady state allocates nothing.
#pragma once

#include <cstddef>
#include <memory>
#include <utility>

namespace resilience::inline v0_2::detail {

template <class T>
class ring {
public:
    bool empty() const noexcept { return size_ == 0; }
    std::size_t size() const noexcept { return size_; }

    void push(T v) {
        if (size_ == cap_)
            grow();
        data_[(head_ + size_) & (cap_ - 1)] = std::move(v);
        ++size_;
    }
    T pop() noexcept {
        T v = std::move(data_[head_]);
        head_ = (head_ + 1) & (cap_ - 1);
        --size_;
        return v;
    }

private:
    void grow() {
        const std::size_t cap = cap_ ? cap_ * 2 : 64;
        auto data = std::make_unique<T[]>(cap);
        for (std::size_t i = 0; i < size_; ++i)
            data[i] = std::move(data_[(head_ + i) & (cap_ - 1)]);
        data_ = std::move(data);
        cap_ = cap;
        head_ = 0;
    }

    std::unique_ptr<T[]> data_;
    std::size_t cap_ = 0, head_ = 0, size_ = 0;
};

} // namespace resilience::detail
