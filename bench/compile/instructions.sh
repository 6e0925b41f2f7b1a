#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Instructions the compiler proper (g++'s cc1plus) executes on one file, by callgrind: exact where this
# machine's times move by 10 to 30% between runs (bench/README.md, "Build cost").
#
#   bench/compile/instructions.sh bench/compile/include_only.cpp
#   bench/compile/instructions.sh bench/compile/five_policies.cpp -DRESILIENCE_SEPARATE_COMPILATION
#   INCLUDE=/tmp/old/include bench/compile/instructions.sh bench/compile/std_headers.cpp
#
# Prints billions of instructions. Needs valgrind; a file of one second takes about a minute.
set -euo pipefail

if [ "$#" -lt 1 ]; then
    echo "usage: $0 <file.cpp> [compiler flags...]" >&2
    exit 2
fi
here=$(cd "$(dirname "$0")" && pwd)
file=$1
shift
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
valgrind --tool=callgrind --trace-children=yes --callgrind-out-file="$work/cg.%p" -q \
    "${CXX:-g++}" -std=c++20 -O2 -c -o /dev/null -I"${INCLUDE:-$here/../../include}" -I"$here" \
    -DASIO_STANDALONE "$@" "$file" > /dev/null 2>&1
for out in "$work"/cg.*; do
    if grep -q '^cmd:.*cc1plus' "$out"; then
        awk '/^summary:/ { printf "%.3f G\n", $2 / 1e9 }' "$out"
    fi
done
