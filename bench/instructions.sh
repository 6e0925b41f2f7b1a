#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Instructions per call of rows of bench_policies, by callgrind: each row runs twice, for a short and a
# longer time, and the figure is the difference in instructions over the difference in calls of the
# benchmark's dependency (so start-up, warm-up and reporting cancel out). Steady where times are not:
# the same binary gives the same count on a loaded machine.
#
#   bench/instructions.sh build/release/bench/bench_policies bare_call pipeline_of_five
#
# Needs valgrind and python3. Each row takes about a minute.
set -euo pipefail

if [ "$#" -lt 2 ]; then
    echo "usage: $0 <bench_policies binary> <row> [row...]" >&2
    exit 2
fi
binary=$1
shift
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

for row in "$@"; do
    for t in 0.05 0.2; do
        valgrind --tool=callgrind --callgrind-out-file="$work/$t.out" "$binary" \
            --benchmark_filter="^${row}\$" --benchmark_min_time="$t" >/dev/null 2>&1
    done
    python3 - "$work" "$row" <<'EOF'
import collections, re, sys

def read(path):
    """Total instructions, and calls made to each function (by name)."""
    names, calls, total, callee = {}, collections.Counter(), 0, None
    with open(path) as f:
        for line in f:
            if line.startswith(("summary:", "totals:")):
                total = int(line.split()[1])
                continue
            m = re.match(r"(c?fn)=\((\d+)\)(?: (.*))?", line)
            if m:
                if m.group(3):
                    names[m.group(2)] = m.group(3).strip()
                callee = names.get(m.group(2)) if m.group(1) == "cfn" else None
            elif line.startswith("calls=") and callee:
                calls[callee] += int(line.split("=")[1].split()[0])
                callee = None
    return total, calls

work, row = sys.argv[1], sys.argv[2]
short_total, short_calls = read(f"{work}/0.05.out")
long_total, long_calls = read(f"{work}/0.2.out")
# The dependency's coroutine (`dependency()` in policies.cpp) runs once per iteration. Count the
# part the compiler made that runs exactly once per coroutine: its ramp (the function itself), else
# its destroy clone. Not the resume part: callgrind may count it twice per call (g++ 12 calls it
# again from the destroy clone, and callgrind then names a recursion cycle `...'2`).
def made(pick):
    return [long_calls[n] - short_calls.get(n, 0) for n in long_calls if "dependency(" in n and pick(n)]
ramp = made(lambda n: n.endswith("dependency()"))
destroy = made(lambda n: "[clone .destroy]" in n and not n.endswith("'2"))
calls = max(ramp or destroy or made(lambda n: True), default=0)
if calls <= 0:
    sys.exit(f"{row}: no calls of the dependency found (is the row's name right?)")
print(f"{row:<40} {(long_total - short_total) / calls:8.0f} instructions per call")
EOF
done
