#!/usr/bin/env bash
# test_benchmarks_assemble.sh - owns the check that BENCHMARKS.md and the
# README's table are what `bench/benchmarks.sh --assemble` makes from the
# committed reports in docs/bench/tables: a clean checkout reassembles both
# byte for byte, a table whose report is gone drops out of BENCHMARKS.md
# alone, and a missing required report refuses without touching either file.
# Runs on a copy of the tree, never on the checkout itself. Env: WORKDIR.
set -u
: "${WORKDIR:?}"
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
W="$WORKDIR/benchmarks_assemble"
rm -rf "$W" && mkdir -p "$W"
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

copy_tree() { # copy_tree DEST: what --assemble reads and writes
    rm -rf "$1" && mkdir -p "$1/docs"
    cp -r "$ROOT/bench" "$1/bench"
    cp -r "$ROOT/docs/bench" "$1/docs/bench"
    cp "$ROOT/BENCHMARKS.md" "$ROOT/README.md" "$1/"
}
title_of() { head -1 "$ROOT/docs/bench/tables/$1/report.md" | sed 's/^## /### /'; }

copy_tree "$W/same"
out=$(cd "$W/same" && bash bench/benchmarks.sh --assemble 2>&1)
check "--assemble runs on a copy of the checkout" $? "$out"
cmp -s "$ROOT/BENCHMARKS.md" "$W/same/BENCHMARKS.md"
check "BENCHMARKS.md is what --assemble makes from docs/bench/tables, byte for byte" $? \
    "$(diff "$ROOT/BENCHMARKS.md" "$W/same/BENCHMARKS.md" | head -8)"
cmp -s "$ROOT/README.md" "$W/same/README.md"
check "the README's table is what --assemble makes, byte for byte" $? "$(diff "$ROOT/README.md" "$W/same/README.md" | head -8)"

copy_tree "$W/dropped"
rm -r "$W/dropped/docs/bench/tables/mixtral-prefetch-ab"
out=$(cd "$W/dropped" && bash bench/benchmarks.sh --assemble 2>&1)
check "--assemble without one table's report runs" $? "$out"
grep -qxF "$(title_of mixtral-prefetch-ab)" "$ROOT/BENCHMARKS.md" &&
    ! grep -qxF "$(title_of mixtral-prefetch-ab)" "$W/dropped/BENCHMARKS.md" &&
    grep -qxF "$(title_of qwen3-prefetch-ab)" "$W/dropped/BENCHMARKS.md"
check "a table without a report drops out of BENCHMARKS.md, and only that one" $? "$(title_of mixtral-prefetch-ab)"

copy_tree "$W/refused"
rm "$W/refused/docs/bench/tables/sim-qwen3.txt"
echo "edited by hand" >>"$W/refused/BENCHMARKS.md"
cp "$W/refused/BENCHMARKS.md" "$W/refused.before"
out=$(cd "$W/refused" && bash bench/benchmarks.sh --assemble 2>&1)
[ $? -ne 0 ] && grep -q "sim-qwen3.txt is missing" <<<"$out" && cmp -s "$W/refused/BENCHMARKS.md" "$W/refused.before"
check "a missing required report is refused by name, and BENCHMARKS.md is left alone" $? "$out"
finish
