// SPDX-License-Identifier: MIT
// Must not compile: a fast policy whose enter may answer step::wait (it does not declare
// enter_never_waits) and that has no run of its own. It satisfies rs::policy, but the run it would
// inherit from policy_base enters it again: a call would recurse without end.
// expect: a policy whose enter may answer step::wait needs a run(next, ctx) of its own
#include <resilience/resilience.hpp>

#include <optional>

namespace rs = resilience;

class waits_without_run : public rs::policy_base<waits_without_run> {
public:
    struct call_state {};

    template <class R>
    rs::step enter(call_state&, const rs::context&, std::optional<rs::outcome<R>>&) const {
        return rs::step::wait; // cannot decide yet: the pipeline would call run
    }
    template <class R>
    rs::step leave(call_state&, const rs::context&, rs::outcome<R>&) const {
        return rs::step::proceed;
    }
};
static_assert(rs::policy<waits_without_run>);

rs::task<int> call(const rs::pipeline<rs::retry<>, waits_without_run>& p) {
    co_return co_await p.execute([]() -> rs::task<int> { co_return 1; });
}
