// SPDX-License-Identifier: MIT
// The definitions of <resilience/clock.hpp> that do not depend on a user's type: included by the
// header (header-only), or compiled once into resilience::compiled (detail/config.hpp).
#pragma once

#include "../clock.hpp"

namespace resilience::inline v0_2::detail {

// Declared `inline` (header-only) and `noinline` in the class: the two keep clang from inlining a
// sleep's start and end into every coroutine that sleeps, as it did not when they were defined there.
sleep_awaiter::~sleep_awaiter() {
    stop_listening();
    if (node().armed())
        at_.remove(&node());
}

void sleep_awaiter::await_suspend(std::coroutine_handle<> h) {
    if (!at_.loop() && !at_.foreign())
        throw std::logic_error("resilience: a sleep needs an event loop: run the coroutine under "
                               "sync_wait, event_loop::run or testing::simulation, or start the call "
                               "with rs::asio::execute / rs::boost_asio::execute");
    waiter_ = h;
    node().fire = [](timer_node* n) {
        auto* self = static_cast<sleep_awaiter*>(n);
        if (!self->claimed_.exchange(true, std::memory_order_acq_rel))
            self->waiter_.resume();
    };
    at_.add(&node());
    // Listed after the timer is armed: a token stopped meanwhile runs `on_stop` right here. The
    // flag is set first, as nothing here may be touched once listed (a stop may end the sleep);
    // `remove` is harmless on a node that `add` did not list.
    if (stop_state* s = stop_access::state(token_); s && s->stop_possible()) {
        listening_ = true;
        s->add(this);
    }
}

RESILIENCE_DECL void sleep_awaiter::on_stop(stop_callback_node* n) noexcept {
    auto* self = static_cast<sleep_awaiter*>(n);
    if (!self->claimed_.exchange(true, std::memory_order_acq_rel))
        self->at_.post(job{&sleep_awaiter::cancelled, self});
}

RESILIENCE_DECL void sleep_awaiter::cancelled(void* p) {
    auto* self = static_cast<sleep_awaiter*>(p);
    self->at_.remove(&self->node());
    self->waiter_.resume();
}

} // namespace resilience::detail
