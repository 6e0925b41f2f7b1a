#!/usr/bin/env python3
"""Checks that every header under include/resilience includes only headers of its own layer or below.

The layers are drawn in docs/architecture.md; this table is their definition, and a header missing from
it is an error, so a new header is placed in a layer when it is added. Run from anywhere:

    python3 scripts/check_layers.py

Exit status 0 when every include goes down or sideways, 1 with one line per offending include otherwise.
"""

import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent / "include" / "resilience"

# Layer number, name, and the headers in it (paths relative to include/resilience; a trailing "/"
# takes a whole folder).
LAYERS = [
    (1, "core", [
        "concepts.hpp", "random.hpp", "error.hpp", "outcome.hpp", "task.hpp", "async_generator.hpp",
        "when_all.hpp", "event_loop.hpp", "context.hpp", "properties.hpp", "clock.hpp", "any_clock.hpp", "async_scope.hpp",
        "detail/inlining.hpp", "detail/frame_allocator.hpp", "detail/inline_start.hpp", "detail/ring.hpp",
        "detail/stop.hpp", "detail/time.hpp", "detail/timer_wheel.hpp", "detail/waiter_queue.hpp",
        "detail/shared_handle.hpp", "detail/snapshot_cell.hpp", "detail/race.hpp", "detail/home_loop.hpp", "detail/default_clock.hpp", "detail/config.hpp", "testing/",
    ]),
    (2, "protocol", [
        "policy.hpp", "policy_kit.hpp", "classifier.hpp", "backoff.hpp", "telemetry_event.hpp", "priority.hpp",
        "detail/label.hpp", "detail/action.hpp", "detail/driver.hpp", "detail/protocol.hpp",
        "detail/stages.hpp", "detail/frame_admission.hpp",
    ]),
    (3, "policies", [
        "retry.hpp", "retry_budget.hpp", "retry_stream.hpp", "timeout.hpp", "circuit_breaker.hpp",
        "bulkhead.hpp", "adaptive_limit.hpp", "bulkhead/", "rate_limiter.hpp", "sliding_window_limiter.hpp",
        "adaptive_throttle.hpp", "hedge.hpp", "fallback.hpp", "single_flight.hpp", "chaos.hpp", "http.hpp",
        "cache.hpp", "detail/cache_state.hpp",
        "detail/breaker_window.hpp", "detail/breaker_state.hpp", "detail/breaker_call.hpp", "detail/breaker_options.hpp", "detail/hedge_race.hpp", "detail/http_date.hpp",
        "detail/limiter_state.hpp", "detail/limiter_handle.hpp", "detail/token_bucket.hpp",
        "detail/window_counter.hpp",
    ]),
    (4, "composition", [
        "pipeline.hpp", "any_policy.hpp", "telemetry.hpp", "standard.hpp", "registry.hpp",
        "retry_by_request.hpp", "resilience.hpp", "src.hpp", "reloadable.hpp",
    ]),
    (5, "integrations", ["fmt.hpp", "asio.hpp", "asio/", "boost_asio.hpp", "beast.hpp", "prometheus.hpp",
                          "grpc.hpp", "redis.hpp", "redis/"]),
]


# Policies are independent of one another, except these parts of one design (docs/architecture.md).
# An entry ending in "/" takes a policy's folder; the files of one folder may include one another.
POLICY_PARTS = {
    ("retry.hpp", "retry_budget.hpp"),
    ("hedge.hpp", "retry_budget.hpp"),
    ("bulkhead.hpp", "bulkhead/"),        # forwarding headers
    ("adaptive_limit.hpp", "bulkhead/"),
    ("cache.hpp", "single_flight.hpp"),  # a cache's refreshes are single flights
}


def matches(rel, entry):
    return rel == entry or (entry.endswith("/") and rel.startswith(entry))


def parts_of_one_design(rel, dep_rel):
    if "/" in rel and "/" in dep_rel and rel.split("/")[0] == dep_rel.split("/")[0]:
        return True  # one policy's folder
    return any(matches(rel, a) and matches(dep_rel, b) for a, b in POLICY_PARTS)


def layer_of(rel):
    best = None
    for number, name, members in LAYERS:
        for m in members:
            if rel == m or (m.endswith("/") and rel.startswith(m)):
                if best is None or len(m) > best[2]:
                    best = (number, name, len(m))
    return best


def main():
    include = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
    problems = []
    for path in sorted(ROOT.rglob("*.hpp")):
        rel = path.relative_to(ROOT).as_posix()
        mine = layer_of(rel)
        if mine is None:
            problems.append(f"include/resilience/{rel}: in no layer (add it to scripts/check_layers.py)")
            continue
        for target in include.findall(path.read_text()):
            dep = (path.parent / target).resolve()
            try:
                dep_rel = dep.relative_to(ROOT).as_posix()
            except ValueError:
                continue
            theirs = layer_of(dep_rel)
            if theirs is None:
                continue  # reported on its own line
            if theirs[0] > mine[0]:
                problems.append(f"include/resilience/{rel} ({mine[1]}) includes {dep_rel} ({theirs[1]})")
            elif (mine[1] == theirs[1] == "policies" and not dep_rel.startswith("detail/")
                  and not rel.startswith("detail/") and rel != dep_rel and not parts_of_one_design(rel, dep_rel)):
                problems.append(f"include/resilience/{rel} (a policy) includes another policy, {dep_rel}")
    for p in problems:
        print(p)
    if problems:
        print(f"check_layers: {len(problems)} problem(s); the layers are in docs/architecture.md")
        return 1
    print("check_layers: every include goes down or sideways")
    return 0


if __name__ == "__main__":
    sys.exit(main())
