// SPDX-License-Identifier: MIT
/// \file circuit_breaker/call.hpp
/// `breaker_call`: one call's hold on a `circuit_breaker`, from its admission to its recorded result.
#pragma once

#include "../detail/shared_handle.hpp"
#include "../telemetry_event.hpp" // listener_ref
#include "state.hpp"

#include <exception>
#include <utility>

namespace resilience::inline v0_2::detail {

/// Records a call's result once, through the breaker that admitted it (`finish`). A call that ends
/// without one (the classifier threw, the coroutine was destroyed) is recorded as ignored, so a probe
/// slot is never lost: only a probe needs that (an ignored closed-state result changes nothing), so
/// only a probe holds the breaker's state, and the destruction of any other call touches nothing.
/// Holds nothing until `start`.
template <class C>
class breaker_call {
public:
    using admission = typename breaker_core<C>::admission;

    breaker_call() noexcept {}
    breaker_call(const breaker_call&) = delete;
    breaker_call& operator=(const breaker_call&) = delete;
    ~breaker_call() {
        if (breaker_core<C>* core = probe_.get())
            core->record(admission_, breaker_verdict::ignored, nullptr, sink_); // then the hold goes
    }
    /// The call admitted by `a` is under way; its result is recorded by `finish` or, for a probe,
    /// the destructor.
    void start(breaker_core<C>& core, const admission& a, detail::listener_ref sink) noexcept {
        admission_ = a;
        sink_ = sink;
        if (a.probe) [[unlikely]]
            probe_.take(core);
    }
    /// The options the call was admitted under (after `start`): it is judged under them to the end.
    const typename breaker_core<C>::config_block& config() const noexcept { return *admission_.config; }
    /// `core`: the breaker passed to `start`.
    void finish(breaker_core<C>& core, breaker_verdict v, const std::exception_ptr& error) {
        const state_hold<breaker_core<C>> held = std::move(probe_); // given back once recorded, or thrown
        core.record(admission_, v, error, sink_);
    }

private:
    state_hold<breaker_core<C>> probe_; // a probe's hold on the breaker
    admission admission_;
    detail::listener_ref sink_{}; // the call's listener, for the state changes it makes
};

} // namespace resilience::detail
