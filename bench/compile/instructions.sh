#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Instructions g++'s compiler proper (cc1plus) executes on one file, by callgrind: exact where this
# machine's times move by 10 to 30% between runs (bench/README.md, "Build cost"). g++ only: clang
# compiles in its driver's process, which this does not look for.
#
#   bench/compile/instructions.sh bench/compile/include_only.cpp
#   bench/compile/instructions.sh bench/compile/five_policies.cpp -DRESILIENCE_SEPARATE_COMPILATION
#   RESILIENCE_INCLUDE=/tmp/old/include bench/compile/instructions.sh bench/compile/std_headers.cpp
#
# Prints billions of instructions. Needs valgrind; a file of one second takes about a minute.
set -euo pipefail

if [ "$#" -lt 1 ]; then
    echo "usage: $0 <file.cpp> [g++ flags...]" >&2
    exit 2
fi
if ! command -v valgrind > /dev/null; then
    echo "$0: needs valgrind (apt-get install -y valgrind)" >&2
    exit 2
fi
here=$(cd "$(dirname "$0")" && pwd)
file=$1
shift
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if ! valgrind --tool=callgrind --trace-children=yes --callgrind-out-file="$work/cg.%p" -q \
    g++ -std=c++20 -O2 -c -o /dev/null -I"${RESILIENCE_INCLUDE:-$here/../../include}" -I"$here" \
    -DASIO_STANDALONE "$@" "$file" > /dev/null 2> "$work/stderr"; then
    cat "$work/stderr" >&2
    exit 1
fi
found=0
for out in "$work"/cg.*; do
    if grep -q '^cmd:.*cc1plus' "$out"; then
        awk '/^summary:/ { printf "%.3f G\n", $2 / 1e9 }' "$out"
        found=1
    fi
done
if [ "$found" = 0 ]; then
    echo "$0: no cc1plus process was traced" >&2
    exit 1
fi
