#!/usr/bin/env bash
# test_sim_accuracy.sh - owns the check of bench/sim_accuracy.sh: it takes the
# cells from the reports' decode and prompt tables by column name, counts one
# within 15% by the magnitude of its error (a +16% is out, a -15% in), skips
# cells without a simulated figure (plain, gate, '-') and runs without reports,
# and counts the decode stall apart.
# Env: WORKDIR.
set -u
: "${WORKDIR:?}"
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
W="$WORKDIR/sim_accuracy"
rm -rf "$W" && mkdir -p "$W/runs/a" "$W/runs/b"
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

cat >"$W/runs/a/report.md" <<'MD'
## a

| budget | variant | decode tok/s | x plain | simulated tok/s | sim error |
|---|---|---|---|---|---|
| 10% | plain | 0.2 [0.1-0.3] | 1.00 | - | - |
| 10% | guanaco | 9.41849 [9.2889-9.54808] | 41.50 | 10.28 | +9% |
| 25% | guanaco | 4.0 | 20.00 | 3.36 | -16% |
| 25% | guanaco+prefetch=gate | 4.1 | 20.50 | - (gate) | - |

| budget | variant | stall ms/token | simulated stall ms/token | prompt tok/s | simulated prompt tok/s | prompt sim error |
|---|---|---|---|---|---|---|
| 10% | guanaco | 50.2 [49.5-51] | 44.4 | 43.7002 [42.5-44.8] | 45.03 | +15% |
| 25% | guanaco | 26.4 | 31.0 | 40.0 | 46.40 | +16% |
| 25% | guanaco+prefetch=gate | 26.0 | - | 41.0 | - (gate) | - |
MD
# columns in another order, a decode table only
cat >"$W/runs/b/report.md" <<'MD'
| budget | variant | sim error | simulated tok/s | decode tok/s |
|---|---|---|---|---|
| 50% | guanaco | -15% | 0.85 | 1.0 |
MD

out=$(bash "$ROOT/bench/sim_accuracy.sh" "$W/runs" a b missing 2>&1)
check "sim_accuracy.sh runs" $? "$out"
check_has "a decode cell: the live median without its range, the simulated figure and the error" "| a | 10% | guanaco | decode | 9.42 | 10.28 | +9% |" "$out"
check_has "a prompt cell from the second table" "| a | 25% | guanaco | prompt | 40 | 46.40 | +16% |" "$out"
check_has "columns found by name, in any order" "| b | 50% | guanaco | decode | 1 | 0.85 | -15% |" "$out"
! grep -qE "plain|gate" <<<"$out"
check "plain and gate cells are not counted" $? "$out"
check_has "the count: +9% and -15% in, -16% and +16% out, +15% in" "**Simulator within 15% of live: 3 of 5 cells (60%; issue 8 asks for 80%)**: decode 2 of 3, prompt 1 of 2." "$out"
check_has "the stall apart: 44.4 against 50.2 in (-12%), 31.0 against 26.4 out (+17%), gate's '-' not counted" "The decode stall per token alone (simulated against live, the same cells): within 15% in 1 of 2." "$out"
! grep -qF "decode stall |" <<<"$out"
check "the stall is counted, not listed among the tok/s cells" $? "$out"

out=$(bash "$ROOT/bench/sim_accuracy.sh" "$W/runs" missing 2>&1)
check "runs without a report" $? "$out"
check_has "and says there is nothing to count" "no cell has a simulated figure" "$out"
out=$(bash "$ROOT/bench/sim_accuracy.sh" "$W/runs" 2>&1)
[ $? -eq 2 ] && grep -q usage <<<"$out"
check "no run named: usage, exit 2" $? "$out"
finish
