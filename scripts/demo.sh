#!/usr/bin/env bash
# demo.sh - the README's first command: set up from nothing, write a synthetic
# qwen3moe (Qwen3-30B-A3B layer shapes, Q8_0) that is larger than the memory
# limit it then sets with a real cgroup, and run the patched llama-bench
# four ways, in one run:
#   1. everything in RAM (no limit), for scale;
#   2. plain llama.cpp inside the limit (streaming off);
#   3. Guanaco's lazy experts inside the same limit (--guanaco-streaming);
#   4. Guanaco's residency engine inside the same limit, budget derived from
#      the cgroup limit (--guanaco-ram auto).
# The model's pages are dropped from the page cache before each run, so every
# run starts cold.
#
# Knobs (environment): GUANACO_DEMO_LAYERS (default 12 layers, ~7.7 GB),
# GUANACO_DEMO_LIMIT (bytes; default half the file), GUANACO_DEMO_TOKENS
# (decode tokens, default 16), GUANACO_DEMO_DIR (where the model is written).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$ROOT/scripts/setup.sh"

BIN="$ROOT/build/cmake/bin"
DIR=${GUANACO_DEMO_DIR:-$ROOT/build/demo}
LAYERS=${GUANACO_DEMO_LAYERS:-12}
TOKENS=${GUANACO_DEMO_TOKENS:-16}
MODEL="$DIR/qwen3moe-30b-a3b-shape-${LAYERS}L-Q8_0.gguf"
export GUANACO_VOCAB_DIR="$ROOT/build/llama.cpp/models"
mkdir -p "$DIR"

if [ ! -f "$MODEL" ]; then
    echo "demo: writing $MODEL (synthetic weights, real tokenizer)"
    "$BIN/guanaco-mkmodel" --arch qwen3moe --preset qwen3-30b-a3b --n-layer "$LAYERS" --quant Q8_0 --seed 1 \
        -o "$MODEL.partial"
    mv "$MODEL.partial" "$MODEL"
fi
SIZE=$(stat -L -c %s "$MODEL")
LIMIT=${GUANACO_DEMO_LIMIT:-$((SIZE / 2))}
echo "demo: model $((SIZE / 1000000)) MB, memory limit $((LIMIT / 1000000)) MB (cgroup v1), $TOKENS decode tokens, 2 threads"

LOGS="$DIR/logs"
mkdir -p "$LOGS"
# run NAME LIMIT [guanaco flags...]: one llama-bench decode run, model evicted first.
run() {
    local name=$1 limit=$2
    shift 2
    local wrap=()
    if [ "$limit" != none ]; then
        wrap=(bash "$ROOT/tests/cgroup_run.sh" "$limit" --)
    fi
    "$BIN/evict_file" "$MODEL" >/dev/null
    local start=$SECONDS rc=0
    "${wrap[@]}" "$BIN/llama-bench" -m "$MODEL" -p 0 -n "$TOKENS" -r 1 -t 2 -o csv "$@" \
        >"$LOGS/$name.csv" 2>"$LOGS/$name.err" || rc=$?
    local tps
    tps=$(awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == "avg_ts") column = i }
                   NR == 2 && column { gsub(/"/, "", $column); print $column }' "$LOGS/$name.csv")
    if [ $rc -eq 77 ]; then
        printf '%-34s %s\n' "$name" "skipped: $(tail -1 "$LOGS/$name.err")"
    elif [ $rc -ne 0 ] || [ -z "$tps" ]; then
        printf '%-34s %s\n' "$name" "FAILED (rc=$rc), see $LOGS/$name.err"
        tail -5 "$LOGS/$name.err" | sed 's/^/    /'
    else
        printf '%-34s %10.2f tok/s decode   (%d s wall, incl. load)\n' "$name" "$tps" $((SECONDS - start))
    fi
    grep -hE '^(guanaco:|cgroup:)' "$LOGS/$name.err" "$LOGS/$name.csv" | sed 's/^/    /' || true
}

echo
printf '%-34s %s\n' "run" "result"
run "everything in RAM (no limit)" none
run "plain llama.cpp, limit" "$LIMIT"
run "guanaco lazy experts, limit" "$LIMIT" --guanaco-streaming
run "guanaco residency (auto), limit" "$LIMIT" --guanaco-streaming --guanaco-ram auto
echo
echo "demo: full logs in $LOGS"
