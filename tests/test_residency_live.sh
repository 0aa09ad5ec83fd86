#!/usr/bin/env bash
# test_residency_live.sh - owns the end-to-end checks of the residency engine
# (--guanaco-ram / --guanaco-max-experts) through a real decode:
#   - logits under a budget far below the expert bytes are bit-identical to
#     streaming off --no-repack, for several architectures (fused gate_up
#     included), both io backends and every policy;
#   - the budget is real without any cgroup: the model file's page cache,
#     sampled with fincore while the decode runs, never exceeds the non-expert
#     weights + the budget + one layer's working set;
#   - absurd budgets are refused by name.
# Env: MKMODEL, LOGITS_DUMP, WORKDIR, VOCAB_DIR, EVICT_TOOL.
set -u
: "${MKMODEL:?}" "${LOGITS_DUMP:?}" "${WORKDIR:?}"
export GUANACO_VOCAB_DIR=${VOCAB_DIR:-${GUANACO_VOCAB_DIR:-}}
W="$WORKDIR/residency-live"
rm -rf "$W" && mkdir -p "$W"
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# Logits: on with a budget == off --no-repack (the reference for streamed experts).
for spec in "qwen3moe Q8_0" "gpt-oss MXFP4" "qwen35moe Q4_0" "mixtral Q4_K"; do
    set -- $spec
    arch=$1 quant=$2 m="$W/$1-$2.gguf"
    "$MKMODEL" --arch "$arch" --quant "$quant" --seed 11 -o "$m" >/dev/null 2>&1
    check "$arch $quant written" $? "mkmodel failed"
    env -u GUANACO_STREAMING "$LOGITS_DUMP" "$m" "$W/$arch.off.bin" --no-repack >"$W/$arch.off.log" 2>&1
    check "$arch $quant off" $? "$(tail -2 "$W/$arch.off.log")"
    for run in "guanaco uring 3M" "lru threads 3M" "layer-lru uring 2M" "lfu threads 4M"; do
        set -- $run
        GUANACO_STREAMING=1 GUANACO_POLICY=$1 GUANACO_IO=$2 GUANACO_RAM=$3 GUANACO_MAX_EXPERTS=6 \
            "$LOGITS_DUMP" "$m" "$W/$arch.$1.bin" >"$W/$arch.$1.log" 2>&1
        rc=$?
        grep -q "residency: budget" "$W/$arch.$1.log" && [ $rc -eq 0 ] && cmp -s "$W/$arch.off.bin" "$W/$arch.$1.bin"
        check "$arch $quant: budget $3, policy $1, io $2 == off --no-repack" $? \
            "rc=$rc $(grep -E 'guanaco: (error|residency)' "$W/$arch.$1.log" | head -3)"
    done
done

# The budget is real: page cache of the model file, sampled from outside while decoding, no cgroup.
if command -v fincore >/dev/null; then
    m="$W/mid.gguf"
    "$MKMODEL" --arch qwen3moe --quant Q8_0 --n-layer 8 --n-embd 1024 --n-ff-exp 384 --n-expert 32 --seed 3 \
        -o "$m" >/dev/null 2>&1
    size=$(stat -c %s "$m")
    [ -n "${EVICT_TOOL:-}" ] && "$EVICT_TOOL" "$m" >/dev/null
    budget=$((64 * 1024 * 1024))
    GUANACO_STREAMING=1 GUANACO_RAM=$budget "$LOGITS_DUMP" "$m" "$W/mid.bin" --gen-tokens 24 >"$W/mid.log" 2>&1 &
    pid=$!
    peak=0
    while kill -0 $pid 2>/dev/null; do
        now=$(fincore --bytes --noheadings --output RES "$m" 2>/dev/null | tr -d ' ')
        [ -n "$now" ] && [ "$now" -gt "$peak" ] && peak=$now
        sleep 0.05
    done
    wait $pid
    check "mid-size decode under a 64 MiB budget" $? "$(tail -3 "$W/mid.log")"
    experts=$(grep -o 'streaming [0-9]* expert tensors ([0-9.]* GiB' "$W/mid.log" | grep -o '[0-9.]* GiB' | cut -d' ' -f1)
    # One layer's working set: 48 prompt tokens touch every expert of a layer (32 x 3 slices of 1024x384 Q8_0).
    layer_set=$((32 * 3 * 1024 * 384 * 34 / 32))
    non_expert=$(awk -v s="$size" -v e="$experts" 'BEGIN { printf "%d", s - e * 1073741824 }')
    allowed=$((non_expert + budget + layer_set + 8 * 1024 * 1024))
    [ "$peak" -gt 0 ] && [ "$peak" -le "$allowed" ]
    check "page cache of the file peaked at $((peak / 1048576)) MiB <= non-expert $((non_expert / 1048576)) + budget 64 + one layer $((layer_set / 1048576)) MiB (file $((size / 1048576)) MiB)" $? \
        "peak $peak > allowed $allowed"
else
    echo "SKIP budget-is-real: fincore (util-linux) is not installed"
fi

GUANACO_STREAMING=1 GUANACO_RAM=12Q "$LOGITS_DUMP" "$W/qwen3moe-Q8_0.gguf" "$W/bad.bin" >"$W/bad.log" 2>&1
rc=$?
[ $rc -ne 0 ] && [ $rc -lt 128 ] && grep -q "GUANACO_RAM" "$W/bad.log"
check "an absurd GUANACO_RAM is refused by name" $? "rc=$rc $(tail -2 "$W/bad.log")"
finish
