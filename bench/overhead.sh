#!/usr/bin/env bash
# overhead.sh - owns the "everything resident" measurement: what Guanaco costs
# when it has nothing to read. Plain llama.cpp with the model in the page cache
# against Guanaco with a 100% budget, after a prompt of --prompt tokens has
# made every expert the routing touches resident; decode is measured with
# llama-bench -r REPS, and the two alternate ROUNDS times in one invocation.
#
#   bench/overhead.sh --model M.gguf [--prompt 512] [--tokens 32] [--reps 3] [--rounds 2] [--load direct]
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN="$ROOT/build/cmake/bin"
MODEL="" PROMPT=512 TOKENS=32 REPS=3 ROUNDS=2 LOAD=direct
while [ $# -gt 0 ]; do
    case $1 in
    --model) MODEL=$2 ;; --prompt) PROMPT=$2 ;; --tokens) TOKENS=$2 ;; --reps) REPS=$2 ;; --rounds) ROUNDS=$2 ;;
    --load) LOAD=$2 ;;
    *) echo "overhead: unknown argument $1" >&2; exit 2 ;;
    esac
    shift 2
done
[ -f "$MODEL" ] || { echo "overhead: --model FILE is required" >&2; exit 2; }
tg_of() { awk -F'"?,"?' 'NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i }
    NR > 1 && $c["n_gen"] + 0 > 0 { gsub(/"/, "", $c["avg_ts"]); print $c["avg_ts"] }' "$1"; }
cat "$MODEL" >/dev/null # plain runs from a warm page cache
plain=() streamed=()
for round in $(seq 1 "$ROUNDS"); do
    "$BIN/llama-bench" -m "$MODEL" -p "$PROMPT" -n "$TOKENS" -r "$REPS" -nr -o csv >/tmp/overhead-plain.csv 2>/dev/null
    plain+=("$(tg_of /tmp/overhead-plain.csv)")
    "$BIN/llama-bench" -m "$MODEL" -p "$PROMPT" -n "$TOKENS" -r "$REPS" -nr -o csv --guanaco-streaming \
        --guanaco-ram 100000G --guanaco-load "$LOAD" >/tmp/overhead-guanaco.csv 2>/tmp/overhead-guanaco.err
    streamed+=("$(tg_of /tmp/overhead-guanaco.csv)")
    echo "round $round: plain ${plain[-1]} tok/s, guanaco ${streamed[-1]} tok/s; $(grep -o 'resident [0-9.]*% of [0-9]* accesses' /tmp/overhead-guanaco.err | tail -1)"
done
awk -v p="${plain[*]}" -v g="${streamed[*]}" 'BEGIN {
    n = split(p, a, " "); split(g, b, " "); for (i = 1; i <= n; i++) { sp += a[i]; sg += b[i] }
    printf "mean decode: plain %.3f tok/s, guanaco (everything resident) %.3f tok/s: overhead %+.1f%%\n",
        sp / n, sg / n, 100 * (sp - sg) / sp }'
