#!/usr/bin/env bash
# Instructions per decoded token, plain llama.cpp's default against Guanaco with every expert resident, counted by
# callgrind (deterministic: no timing noise). Each side decodes 2 and 18 tokens (llama-bench -p 0 -r 1 -t 1, plus
# its one-token warmup); the difference of the two runs' totals is 16 tokens' decode, load and set-up cancelling.
# Guanaco reads with the thread pool: valgrind does not complete io_uring's reads (the run hangs in io_cqring_wait).
#   run.sh MODEL.gguf [OUT_DIR]
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
MODEL=${1:?model}; OUT=${2:-/tmp/cp-callgrind}; mkdir -p "$OUT"
for side in plain guanaco; do
    args=()
    [ "$side" = guanaco ] && args=(--guanaco-streaming --guanaco-ram 8G --guanaco-io threads)
    for n in 2 18; do
        valgrind --tool=callgrind --callgrind-out-file="$OUT/$side-$n.out" "$ROOT/build/cmake/bin/llama-bench" \
            -m "$MODEL" -p 0 -n "$n" -r 1 -t 1 "${args[@]}" >"$OUT/$side-$n.log" 2>&1
    done
done
total() { callgrind_annotate "$1" | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}'; }
for side in plain guanaco; do
    echo "$side $(( ($(total "$OUT/$side-18.out") - $(total "$OUT/$side-2.out")) / 16 )) instructions per decoded token"
done
