#!/usr/bin/env bash
# run.sh - owns one CI run of a libFuzzer harness (ctest fuzz_*): first every
# saved crash of that target (tests/fuzz/crashes/TARGET/*) as a regression
# input, then SECONDS of fuzzing from the committed corpus
# (tests/fuzz/corpus/TARGET), with new inputs and any crash written to a fresh
# scratch directory, never into the source tree.
#
# usage: run.sh HARNESS TARGET SCRATCH_DIR SECONDS MAX_LEN
set -euo pipefail
harness=$1 target=$2 scratch=$3 seconds=$4 max_len=$5
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
rm -rf "$scratch"
mkdir -p "$scratch/corpus" "$scratch/artifacts"

shopt -s nullglob
crashes=("$here/crashes/$target"/*)
if [ ${#crashes[@]} -gt 0 ]; then
    echo "run.sh: $target: replaying ${#crashes[@]} saved crash input(s)"
    "$harness" -close_fd_mask=1 "${crashes[@]}"
fi

# -close_fd_mask=3: the targets print an error line per bad input; libFuzzer keeps its own reports.
set +e
"$harness" -close_fd_mask=3 -max_total_time="$seconds" -max_len="$max_len" -timeout=10 -print_final_stats=1 \
    -artifact_prefix="$scratch/artifacts/" "$scratch/corpus" "$here/corpus/$target" >"$scratch/log" 2>&1
status=$?
set -e
grep -E '^#[0-9]+[[:space:]]+(INITED|DONE)|^stat::number_of_executed_units|ERROR|runtime error|property failed|Test unit written|SUMMARY' \
    "$scratch/log" || true
if [ "$status" -ne 0 ]; then
    echo "run.sh: $target: the fuzzer stopped with status $status; full log: $scratch/log" >&2
    tail -40 "$scratch/log" >&2
fi
exit "$status"
