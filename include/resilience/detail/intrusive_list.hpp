// SPDX-License-Identifier: MIT
/// \file detail/intrusive_list.hpp
/// `intrusive_list<Node>`: a doubly linked list threaded through its nodes' own `prev` and `next`, for
/// the library's lists of things that wait or run (the calls an event loop or an Asio context owns, the
/// callers attached to a shared call). Inserting and removing any node is constant time and allocates
/// nothing; a node is on one such list at a time. Not synchronised: its owner's mutex guards it and the
/// nodes' links, so its owner calls it holding that mutex.
#pragma once

#include <utility>

namespace resilience::inline v0_2::detail {

template <class Node>
class intrusive_list {
public:
    [[nodiscard]] Node* front() const noexcept { return head_; }
    [[nodiscard]] bool empty() const noexcept { return head_ == nullptr; }

    void push_front(Node& n) noexcept {
        n.prev = nullptr;
        n.next = head_;
        if (head_)
            head_->prev = &n;
        head_ = &n;
    }
    /// Precondition: `n` is on this list. Its links are cleared.
    void erase(Node& n) noexcept {
        if (n.prev)
            n.prev->next = n.next;
        else
            head_ = n.next;
        if (n.next)
            n.next->prev = n.prev;
        n.prev = n.next = nullptr;
    }
    /// The first node, taken off the list (its links cleared), or null when the list is empty.
    Node* pop_front() noexcept {
        Node* n = head_;
        if (n)
            erase(*n);
        return n;
    }
    /// Empties the list and returns its first node: the nodes keep their links, so the caller walks
    /// them by `next` (reading it before it lets a node go).
    Node* take_all() noexcept { return std::exchange(head_, nullptr); }

private:
    Node* head_ = nullptr;
};

} // namespace resilience::detail
