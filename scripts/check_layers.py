#!/usr/bin/env python3
"""Checks the include structure of include/resilience:

- every header includes only headers of its own layer or below (the layers are drawn in
  docs/architecture.md; this table is their definition, and a header missing from it is an error, so
  a new header is placed in a layer when it is added);
- a policy includes no other policy (except the parts of one design in POLICY_PARTS), and then only
  that policy's faces (its policy header, options.hpp, errors.hpp), never its internals;
- inside a policy's folder nothing includes a forwarding header of that policy back, and no header
  reaches itself through its includes (a circle);
- no folder reaches itself through its includes either (a folder and a top-level header are each one
  unit here): a folder's headers sit on one floor, so that `detail/` (standard library only) is under
  the core headers, and `engine/` (the call's machinery, which uses them) over them;
- no header is over MAX_LINES lines;
- every header with a mutex says, in a `/// Locking:` paragraph, what the mutex guards;
- every namespace the headers open is inside the ABI namespace `resilience::inline v<major>_<minor>`
  named after version.hpp, so that two versions in one program fail to link rather than mix.

A forwarding header is a top-level file whose code is one include of a file in a folder: that folder
is a policy's, and that file its policy header. Run from anywhere:

    python3 scripts/check_layers.py

Exit status 0 when all holds, 1 with one line per problem otherwise.
"""

import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent / "include" / "resilience"

# Layer number, name, and the headers in it (paths relative to include/resilience; a trailing "/"
# takes a whole folder).
LAYERS = [
    (1, "core", [
        "concepts.hpp", "random.hpp", "version.hpp", "error.hpp", "outcome.hpp", "task.hpp", "async_generator.hpp",
        "when_all.hpp", "event_loop.hpp", "context.hpp", "properties.hpp", "clock.hpp", "any_clock.hpp",
        "async_scope.hpp", "stop_token.hpp", "testing/",
        "detail/inlining.hpp", "detail/frame_allocator.hpp", "detail/inline_start.hpp", "detail/ring.hpp",
        "detail/time.hpp", "detail/timer_wheel.hpp", "detail/intrusive_list.hpp", "engine/waiter_queue.hpp",
        "detail/shared_handle.hpp", "detail/snapshot_cell.hpp", "detail/segment_grid.hpp", "engine/race.hpp",
        "detail/home_loop.hpp", "engine/default_clock.hpp", "detail/config.hpp", "detail/error_category.hpp",
        "engine/std_token.hpp",
    ]),
    (2, "protocol", [
        "policy.hpp", "policy_kit.hpp", "classifier.hpp", "backoff.hpp", "telemetry_event.hpp", "priority.hpp",
        "queue_discipline.hpp",
        "detail/label.hpp", "engine/action.hpp", "engine/driver.hpp", "engine/run_action.hpp", "engine/protocol.hpp",
        "detail/stages.hpp", "engine/frame_admission.hpp", "engine/frame_sleep.hpp", "engine/call_edges.hpp",
    ]),
    # A stateful policy is a folder with a forwarding header beside it; the others are one file each.
    (3, "policies", [
        "retry.hpp", "retry_stream.hpp", "timeout.hpp", "fallback.hpp", "chaos.hpp", "http.hpp",
        "detail/http_date.hpp",
        "circuit_breaker.hpp", "circuit_breaker/",
        "bulkhead.hpp", "adaptive_limit.hpp", "bulkhead/",
        "rate_limiter.hpp", "sliding_window_limiter.hpp", "limiter/",
        "adaptive_throttle.hpp", "adaptive_throttle/",
        "cache.hpp", "cache/",
        "hedge.hpp", "hedge/",
        "retry_budget.hpp", "retry_budget/",
        "single_flight.hpp", "single_flight/",
        "balancer.hpp", "balancer/",
    ]),
    (4, "composition", [
        "pipeline.hpp", "any_policy.hpp", "telemetry.hpp", "standard.hpp", "registry.hpp",
        "retry_by_request.hpp", "resilience.hpp", "src.hpp", "reloadable.hpp",
    ]),
    (5, "integrations", ["fmt.hpp", "asio.hpp", "asio/", "asio_flavour/", "boost_asio.hpp", "beast.hpp", "prometheus.hpp",
                          "grpc.hpp", "redis.hpp", "redis/"]),
]


# Policies are independent of one another, except these parts of one design (docs/architecture.md),
# named by their unit: a policy folder's name, or a one-file policy's stem.
POLICY_PARTS = {
    ("retry", "retry_budget"),
    ("hedge", "retry_budget"),
    ("cache", "single_flight"),  # a cache's refreshes are single flights
}

# What a policy folder shows other policies: its policy headers (those its forwarding headers name),
# its options and its errors. Everything else in the folder is its own business.
FOLDER_FACES = {"options.hpp", "errors.hpp"}

MAX_LINES = 650

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def layer_of(rel):
    best = None
    for number, name, members in LAYERS:
        for m in members:
            if rel == m or (m.endswith("/") and rel.startswith(m)):
                if best is None or len(m) > best[2]:
                    best = (number, name, len(m))
    return best


def includes_of(path):
    """The headers under include/resilience that `path` includes, as paths relative to it."""
    found = []
    for target in INCLUDE.findall(path.read_text()):
        try:
            found.append((path.parent / target).resolve().relative_to(ROOT).as_posix())
        except ValueError:
            pass
    return found


def forwarding_target(path):
    """For a forwarding header (a top-level file whose code is one include of a file in a folder), that
    file; else None."""
    if "/" in path.relative_to(ROOT).as_posix():
        return None
    code = [line for line in path.read_text().splitlines()
            if line.strip() and not line.lstrip().startswith("//") and line.strip() != "#pragma once"]
    if len(code) != 1:
        return None
    targets = includes_of(path)
    return targets[0] if len(targets) == 1 and "/" in targets[0] else None


def unit_of(rel, folders):
    """The policy a file belongs to: its folder's name, a forwarding header's folder, or a one-file
    policy's stem; None for detail/ and other shared files."""
    head = rel.split("/", 1)[0]
    if "/" in rel:
        return head if head in folders else None
    return folders.get(rel, rel[:-len(".hpp")])


def cycles(graph):
    """Each circle of a directed graph ({node: successors}) found by a depth-first walk, as a list of
    nodes that starts and ends with the same one."""
    found, state = [], {}

    def visit(node, path):
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                found.append(path[path.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return found


def circles(headers):
    """One line for each header that reaches itself through its includes (a header that includes what
    includes it back compiles only through #pragma once, in one order)."""
    graph = {p.relative_to(ROOT).as_posix(): includes_of(p) for p in headers}
    return ["include circle: " + " -> ".join(c) for c in cycles(graph)]


def unit_circles(headers):
    """One line for each circle of includes between units: a top-level header is a unit, and so is a
    folder with everything in it. The .ipp files (a header's definitions for the compiled mode, which
    include their header back) are left out."""
    def unit(rel):
        return rel.split("/", 1)[0] + "/" if "/" in rel else rel
    graph = {}
    for p in headers:
        rel = p.relative_to(ROOT).as_posix()
        for dep in includes_of(p):
            if dep.endswith(".hpp") and unit(dep) != unit(rel):
                graph.setdefault(unit(rel), set()).add(unit(dep))
    return ["include circle between folders: " + " -> ".join(c)
            + " (a folder's headers must sit on one floor: move the one that reaches up)" for c in cycles(graph)]


def abi_namespace():
    """The inline namespace every header opens, from version.hpp: v<major>_<minor>."""
    text = (ROOT / "version.hpp").read_text()
    major = re.search(r"#define RESILIENCE_VERSION_MAJOR (\d+)", text).group(1)
    minor = re.search(r"#define RESILIENCE_VERSION_MINOR (\d+)", text).group(1)
    return f"v{major}_{minor}"


def main():
    problems = []
    headers = sorted(ROOT.rglob("*.hpp"))
    abi = abi_namespace()
    # Forwarding headers, their folders, and each folder's policy headers.
    forwards = {}
    for path in headers:
        target = forwarding_target(path)
        if target:
            forwards[path.relative_to(ROOT).as_posix()] = target
    folder_of_forward = {rel: target.split("/", 1)[0] for rel, target in forwards.items()}
    folders = set(folder_of_forward.values())
    policy_headers = set(forwards.values())
    for path in headers:
        rel = path.relative_to(ROOT).as_posix()
        text = path.read_text()
        lines = text.count("\n")
        if re.search(r"std::(shared_)?mutex\b", text) and "/// Locking:" not in text:
            problems.append(f"include/resilience/{rel}: has a mutex and no '/// Locking:' paragraph under its file "
                            "comment (what each mutex guards; _locked functions are called holding it)")
        if lines > MAX_LINES:
            problems.append(f"include/resilience/{rel}: {lines} lines, over {MAX_LINES}: split it along a seam")
        for opened in re.findall(r"^namespace resilience\b[^{;=]*\{", text, re.M):
            if not opened.startswith(f"namespace resilience::inline {abi}"):
                problems.append(f"include/resilience/{rel}: '{opened}' is not in the ABI namespace: open "
                                f"'namespace resilience::inline {abi}' (version.hpp's major and minor)")
        mine = layer_of(rel)
        if mine is None:
            problems.append(f"include/resilience/{rel}: in no layer (add it to scripts/check_layers.py)")
            continue
        my_unit = unit_of(rel, {**{f: f for f in folders}, **folder_of_forward}) if mine[1] == "policies" else None
        for dep_rel in includes_of(path):
            theirs = layer_of(dep_rel)
            if theirs is None:
                continue  # reported on its own line
            if theirs[0] > mine[0]:
                problems.append(f"include/resilience/{rel} ({mine[1]}) includes {dep_rel} ({theirs[1]})")
                continue
            if not (mine[1] == theirs[1] == "policies"):
                continue
            their_unit = unit_of(dep_rel, {**{f: f for f in folders}, **folder_of_forward})
            if my_unit is None or their_unit is None:
                continue  # shared policy machinery in detail/
            if my_unit == their_unit:
                # Inside a policy nothing includes the headers at the old paths back; the folder's own
                # order is checked below, with every other include, for circles.
                if dep_rel in forwards and rel not in forwards:
                    problems.append(f"include/resilience/{rel} includes its own forwarding header {dep_rel} back")
                continue
            if (my_unit, their_unit) not in POLICY_PARTS:
                problems.append(f"include/resilience/{rel} (policy {my_unit}) includes another policy, {dep_rel}")
            elif "/" in dep_rel and dep_rel not in policy_headers and dep_rel.split("/")[-1] not in FOLDER_FACES:
                problems.append(f"include/resilience/{rel} includes {dep_rel}, an internal of policy {their_unit}")
    problems += circles(headers)
    problems += unit_circles(headers)
    for p in problems:
        print(p)
    if problems:
        print(f"check_layers: {len(problems)} problem(s); the layers are in docs/architecture.md")
        return 1
    print("check_layers: every include goes down or sideways, no policy includes itself back, "
          f"no circle of headers or folders, no header is over {MAX_LINES} lines, every namespace is in resilience::{abi}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
