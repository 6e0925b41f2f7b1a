// SPDX-License-Identifier: MIT
// Must not compile: a fast policy with an `again` that is not of the protocol's form (it answers a
// step rather than an entry, and has no frame_wait). The pipeline would never ask it, and the call
// would end at its `leave`, the stages outside it never leaving.
// expect: a policy's `again` must be `entry again(call_state&, const context&, outcome<R>&) const`
#include <resilience/resilience.hpp>

#include <optional>

namespace rs = resilience;

class goes_round_wrongly : public rs::policy_base<goes_round_wrongly> {
public:
    static constexpr bool enter_never_waits = true;
    struct call_state {};

    template <class R>
    rs::step enter(call_state&, const rs::context&, std::optional<rs::outcome<R>>&) const {
        return rs::step::proceed;
    }
    template <class R>
    rs::step leave(call_state&, const rs::context&, rs::outcome<R>&) const {
        return rs::step::wait; // go on in `again`
    }
    template <class R>
    rs::step again(call_state&, const rs::context&, rs::outcome<R>&) const {
        return rs::step::done;
    }
};
static_assert(rs::policy<goes_round_wrongly>);

rs::task<int> call(const rs::pipeline<rs::fallback<int>, goes_round_wrongly>& p) {
    co_return co_await p.execute([]() -> rs::task<int> { co_return 1; });
}
