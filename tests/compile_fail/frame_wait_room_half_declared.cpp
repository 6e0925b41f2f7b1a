// SPDX-License-Identifier: MIT
// Must not compile: a policy's frame_wait that asks for room after itself (`extra_bytes`) with only part
// of what that takes (here no `extra_bytes() const` and no constructor taking the room). Made without its
// room, it would write past the block the pipeline made it in.
// expect: a frame_wait that asks for room needs
#include <resilience/resilience.hpp>

#include <coroutine>
#include <cstddef>
#include <optional>

namespace rs = resilience;

class half_room : public rs::policy_base<half_room> {
public:
    struct call_state {};

    template <class R>
    rs::step enter(call_state&, const rs::context&, std::optional<rs::outcome<R>>&) const {
        return rs::step::wait;
    }
    template <class R>
    rs::step leave(call_state&, const rs::context&, rs::outcome<R>&) const {
        return rs::step::proceed;
    }
    bool waits_in_frame(const rs::context&) const noexcept { return true; }
    template <class Next>
    rs::task<rs::next_outcome_t<Next>> run(Next next, const rs::context& ctx) const {
        co_return co_await next(ctx);
    }

    template <class R>
    class frame_wait {
    public:
        frame_wait(const half_room&, call_state&, const rs::context&, std::optional<rs::outcome<R>>&) {}
        static std::size_t extra_bytes(const half_room&, call_state&, const rs::context&) { return 64; }
        bool await_ready() const noexcept { return true; }
        void await_suspend(std::coroutine_handle<>) const noexcept {}
        rs::step await_resume() const noexcept { return rs::step::proceed; }
    };
};
static_assert(rs::policy<half_room>);

rs::task<int> call(const rs::pipeline<half_room>& p) {
    co_return co_await p.execute([]() -> rs::task<int> { co_return 1; });
}
