#!/usr/bin/env bash
# warm_start.sh - owns the warm-start check: with the model already in the page
# cache (a second run, a restarted server), time to first token of Guanaco with
# a budget against plain llama.cpp, alternating, and what each read from disk.
#
#   bench/warm_start.sh --model M.gguf [--ram 16G] [--reps 3] [--prompt 16] [--repack]
#
# Time to first token here is the wall time of `llama-bench -p PROMPT -n 1 -r 1
# --no-warmup`: load, one prompt ubatch and one token. The model is read into
# the page cache (cat) before every run, so both start warm; disk reads are
# the run's read_bytes from /proc (children included). Both sides run with -nr
# (nothing repacked) unless --repack: then as users run them, plain llama.cpp
# repacking at load and Guanaco repacking the experts it adopts
# (--guanaco-repack auto). Prints one line per run and the medians.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN="$ROOT/build/cmake/bin"
MODEL="" RAM=16G REPS=3 PROMPT=16 NO_REPACK=-nr
while [ $# -gt 0 ]; do
    case $1 in
    --model) MODEL=$2; shift 2 ;;
    --ram) RAM=$2; shift 2 ;;
    --reps) REPS=$2; shift 2 ;;
    --prompt) PROMPT=$2; shift 2 ;;
    --repack) NO_REPACK=""; shift ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "warm_start: unknown argument $1" >&2; exit 2 ;;
    esac
done
[ -f "$MODEL" ] || { echo "warm_start: --model FILE is required" >&2; exit 2; }
[[ $REPS =~ ^[1-9][0-9]*$ && $PROMPT =~ ^[1-9][0-9]*$ ]] || { echo "warm_start: --reps and --prompt are whole numbers" >&2; exit 2; }

run() { # run NAME ENV...: prints "NAME seconds read_bytes"
    local name=$1; shift
    cat "$MODEL" >/dev/null
    local start end before after
    before=$(awk '/^read_bytes/ { print $2 }' /proc/self/io)
    start=$(date +%s.%N)
    env "$@" "$BIN/llama-bench" -m "$MODEL" -p "$PROMPT" -n 1 -r 1 --no-warmup $NO_REPACK -o csv >/dev/null 2>"$LOGS/$name.err"
    end=$(date +%s.%N)
    after=$(awk '/^read_bytes/ { print $2 }' /proc/self/io)
    echo "$name $(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.2f", b - a }') $((after - before))"
}

LOGS=$(mktemp -d)
results=()
for rep in $(seq "$REPS"); do
    results+=("$(run "plain-$rep" GUANACO_LOG=0)")
    results+=("$(run "guanaco-$rep" GUANACO_STREAMING=1 GUANACO_RAM="$RAM")")
    printf '%s\n' "${results[@]: -2}"
    grep -hE 'warm start|preload:' "$LOGS/guanaco-$rep.err" | sed 's/^/    /'
done
median() { sort -n | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
plain=$(printf '%s\n' "${results[@]}" | awk '$1 ~ /^plain/ { print $2 }' | median)
guanaco=$(printf '%s\n' "${results[@]}" | awk '$1 ~ /^guanaco/ { print $2 }' | median)
echo "median time to first token: plain ${plain} s, guanaco --guanaco-ram $RAM ${guanaco} s, ratio $(awk -v g="$guanaco" -v p="$plain" 'BEGIN { printf "%.2f", g / p }')"
rm -rf "$LOGS"
