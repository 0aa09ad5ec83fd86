#!/usr/bin/env bash
# test_readme_table.sh - owns the check of bench/readme_table.sh: the README's
# summary cells come from the reports' first tables (the default variant
# against plain, ratio and share of the limit, by column name), a missing
# report or budget stays empty, and --into replaces only what lies between the
# markers, the same way twice, and refuses a file without them.
# Env: WORKDIR.
set -u
: "${WORKDIR:?}"
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
W="$WORKDIR/readme_table"
rm -rf "$W" && mkdir -p "$W/runs/qwen3-random" "$W/runs/qwen3-24-own"
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

header="| budget | variant | decode tok/s | x plain | prompt tok/s | physical limit tok/s | % of limit | sim error |"
cat >"$W/runs/qwen3-random/report.md" <<MD
## test

- disk: test; fio randread 1 MiB, io_uring, QD16, O_DIRECT on the model file: **0.880092231 GB/s**
- reps per cell: 1, variants alternating within each rep

$header
|---|---|---|---|---|---|---|---|
| 10% | plain | 0.070065 | 1.00 | - | - | - | - |
| 10% | guanaco | 3.898 | 55.63 | - | 4.97 | 78 | +7% |
| 100% | plain | 4.37855 | 1.00 | - | - | - | - |
| 100% | guanaco | 8.15057 | 1.86 | - | 11.19 | 73 | - |

| budget | variant | stall ms/token | decode tok/s |
|---|---|---|---|
| 10% | guanaco | 121.6 | 999 |
MD
# a table whose rows carry ranges, and a default variant that is not called guanaco
cat >"$W/runs/qwen3-24-own/report.md" <<MD
- disk: test; fio randread 1 MiB, io_uring, QD16, O_DIRECT on the model file: **0.98 GB/s**
- reps per cell: 3, variants alternating within each rep

$header
|---|---|---|---|---|---|---|---|
| 25% | plain | 1.00729 [0.89198-1.08302] | 1.00 | 13.1 | - | - | - |
| 25% | guanaco+prefetch=none | 4.93581 [2.60-5.97] | 4.90 | 23.9 | 8.59 | 57 | +27% |
| 25% | guanaco+prefetch=pilot | 6.09919 [2.69869-6.199] | 6.06 | 24.7 | 8.77 | 70 | +1% |
MD
table=$(bash "$ROOT/bench/readme_table.sh" "$W/runs" 2>&1)
check "readme_table.sh runs" $? "$table"
row() { grep -F "| $1 |" <<<"$table"; }
[ "$(row "Qwen3-30B-A3B Q4_0 17.2 GB, llama-bench's routing")" = \
  "| Qwen3-30B-A3B Q4_0 17.2 GB, llama-bench's routing | 3.9 vs 0.0701: **55.6x**, 78% |  |  | 8.15 vs 4.38: **1.86x**, 73% | 1, 0.88 |" ]
check "a row: each budget's default against plain, an absent budget empty" $? "$table"
[ "$(row "the same model, its own routing")" = \
  "| the same model, its own routing |  | 6.1 vs 1.01: **6.06x**, 70% |  |  | 3, 0.98 |" ]
check "the pilot row, not prefetch=none's, and ranges cut from the median" $? "$table"
! grep -q "Mixtral" <<<"$table"
check "a run without a report has no row" $? "$table"

printf 'intro\n<!-- benchmarks:begin -->\nold table\n<!-- benchmarks:end -->\noutro\n' >"$W/README.md"
bash "$ROOT/bench/readme_table.sh" "$W/runs" --into "$W/README.md" >/dev/null
check "--into runs" $? ""
expected=$(printf 'intro\n<!-- benchmarks:begin -->\n%s\n<!-- benchmarks:end -->\noutro' "$table")
[ "$(cat "$W/README.md")" = "$expected" ]
check "--into replaces only what lies between the markers" $? "$(cat "$W/README.md")"
bash "$ROOT/bench/readme_table.sh" "$W/runs" --into "$W/README.md" >/dev/null
[ "$(cat "$W/README.md")" = "$expected" ]
check "and again gives the same file" $? "$(cat "$W/README.md")"
printf 'no markers\n' >"$W/plain.md"
out=$(bash "$ROOT/bench/readme_table.sh" "$W/runs" --into "$W/plain.md" 2>&1)
[ $? -ne 0 ] && grep -q "no benchmarks:begin / benchmarks:end markers" <<<"$out" && [ "$(cat "$W/plain.md")" = "no markers" ]
check "a file without markers is refused and left alone" $? "$out"
finish
