#!/usr/bin/env bash
# test_concurrent.sh - owns the end-to-end check that one Guanaco engine per
# loaded model is shared safely by every context created on it. One model,
# four contexts decoding from four threads at once (concurrent_decode), and
# each thread's logits compared with the same work done alone afterwards:
#   - streaming off (plain llama.cpp) and streaming without a budget;
#   - a budget of 15% of the expert bytes and at most 2 experts per layer, so
#     one context's router evicts experts while the others compute, with both
#     io backends, the lru and layer-lru policies and both load modes;
#   - the concurrent logits of every run equal plain llama.cpp's (cmp), so a
#     budget never changes them;
#   - Guanaco's final residency line shows that evictions really happened,
#     also in a run that does nothing but the concurrent phase;
#   - experts that run repacked refuse a second context by name, and
#     --guanaco-repack off shares a Q4_0 model as safely as the rest.
# Env: MKMODEL, CONCURRENT_DECODE, WORKDIR, VOCAB_DIR.
set -u
: "${MKMODEL:?}" "${CONCURRENT_DECODE:?}" "${WORKDIR:?}"
export GUANACO_VOCAB_DIR=${VOCAB_DIR:-${GUANACO_VOCAB_DIR:-}}
# Only the settings each run names: a GUANACO_* left in the caller's environment would change them.
for v in $(env | grep -oE '^(LLAMA_ARG_)?GUANACO_[A-Z_]+' | grep -v '^GUANACO_VOCAB_DIR$'); do
    unset "$v"
done
W="$WORKDIR/concurrent"
rm -rf "$W" && mkdir -p "$W"
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# The shape is spelled out so the budget below is an exact share of the expert bytes:
# 4 MoE layers x 16 experts x 3 slices (gate, up, down) of 256 x 256 Q8_0 (34 bytes per 32 weights).
m="$W/qwen3moe-Q8_0.gguf"
"$MKMODEL" --arch qwen3moe --quant Q8_0 --seed 21 --n-layer 4 --n-embd 256 --n-ff-exp 256 --n-expert 16 \
    --n-expert-used 2 -o "$m" >"$W/mkmodel.log" 2>&1
check "model written" $? "$(tail -2 "$W/mkmodel.log")"
expert_bytes=$((4 * 16 * 3 * 256 * 256 * 34 / 32))
budget=$((expert_bytes * 15 / 100))

# run NAME [ARGS...]: concurrent_decode on the model with the current environment; sets rc.
run() {
    local name=$1
    shift
    "$CONCURRENT_DECODE" "$m" --out "$W/$name.bin" "$@" >"$W/$name.log" 2>&1
    rc=$?
}
# The evictions of the final 'residency:' line (printed when the model is freed), or -1.
evictions() {
    grep '^guanaco: residency:' "$1" | grep -v 'residency: budget' | tail -1 |
        grep -oE '[0-9]+ evictions' | grep -oE '^[0-9]+' || echo -1
}

# Every run with a predictor reads ahead in every ubatch: the throttle would turn it off in some.
export GUANACO_PREFETCH_THROTTLE=off

# Plain llama.cpp: the reference, and proof that the harness itself sees no difference.
run plain
[ $rc -eq 0 ] && grep -q 'all logits equal the lone runs' "$W/plain.log" && ! grep -q '^guanaco: streaming' "$W/plain.log"
check "streaming off: 4 contexts decoding at once equal each alone" $? "rc=$rc $(grep -v '^guanaco: status' "$W/plain.log" | tail -3)"
grep -h 'all logits equal the lone runs' "$W/plain.log"

GUANACO_STREAMING=1 run streaming
[ $rc -eq 0 ] && grep -q 'all logits equal the lone runs' "$W/streaming.log" &&
    grep -q '^guanaco: streaming [0-9]* expert tensors' "$W/streaming.log" &&
    ! grep -q 'residency: budget' "$W/streaming.log" && cmp -s "$W/plain.bin" "$W/streaming.bin"
check "streaming, no budget: concurrent == alone == streaming off" $? "rc=$rc $(tail -3 "$W/streaming.log")"

# Under a budget: every context's router drives the one residency engine.
# The last field is the read-ahead predictor (into the page cache, or with direct loading into copies).
for spec in "lru io_uring direct pilot" "lru threads page-cache pilot" "layer-lru io_uring page-cache pilot" \
            "layer-lru threads direct none" "layer-lru threads page-cache none" "lru io_uring page-cache gate"; do
    set -- $spec
    policy=$1 io=$2 load=$3 name="budget-$1-$2-$3-$4"
    GUANACO_STREAMING=1 GUANACO_RAM=$budget GUANACO_MAX_EXPERTS=2 GUANACO_POLICY=$policy GUANACO_IO=$io \
        GUANACO_LOAD=$load GUANACO_PREFETCH=$4 run "$name"
    line=$(grep 'residency: budget' "$W/$name.log")
    # io_uring may be unavailable (old kernel, seccomp): the engine then says so and uses threads.
    want_io=$io
    grep -q 'io_uring is not available' "$W/$name.log" && want_io=threads
    e=$(evictions "$W/$name.log")
    [ $rc -eq 0 ] && grep -q 'all logits equal the lone runs' "$W/$name.log" &&
        [[ "$line" == *"policy $policy, io $want_io"* ]] && [[ "$line" == *"(15%)"* ]] &&
        [ "$e" -gt 0 ] && cmp -s "$W/plain.bin" "$W/$name.bin"
    check "budget 15% + 2 experts/layer, policy $policy, io $io, load $load, prefetch $4: concurrent == alone == streaming off ($e evictions)" $? \
        "rc=$rc evictions=$e budget line '$line' $(grep -E '^concurrent_decode|guanaco: error' "$W/$name.log" | head -5)"
done

# Evictions during the concurrent phase itself: no lone runs, so the summary covers only it.
GUANACO_STREAMING=1 GUANACO_RAM=$budget GUANACO_MAX_EXPERTS=2 run concurrent-only --no-sequential
e=$(evictions "$W/concurrent-only.log")
overlap=$(grep -oE '[0-9]+ router callbacks while another context decoded' "$W/concurrent-only.log" | grep -oE '^[0-9]+')
[ $rc -eq 0 ] && [ "$e" -gt 0 ] && [ "${overlap:-0}" -gt 0 ] && cmp -s "$W/plain.bin" "$W/concurrent-only.bin"
check "concurrent phase alone: $e evictions, ${overlap:-0} routings while another context decoded, logits == streaming off" $? \
    "rc=$rc evictions=$e $(grep -E '^concurrent_decode|guanaco: (error|residency)' "$W/concurrent-only.log" | head -5)"

# Repacked experts (--guanaco-repack on; x86 repacks Q4_0) serve one context at a time: an evicted
# arena slice reads as zeros, which a context computing it would use. A second context is refused with a message
# (exit 1, never a signal or a hang); --guanaco-repack off shares the model safely again, as above.
q="$W/qwen3moe-Q4_0.gguf"
"$MKMODEL" --arch qwen3moe --quant Q4_0 --seed 21 --n-layer 4 --n-embd 256 --n-ff-exp 256 --n-expert 16 \
    --n-expert-used 2 -o "$q" >"$W/mkmodel-q4.log" 2>&1
check "Q4_0 model written" $? "$(tail -2 "$W/mkmodel-q4.log")"
GUANACO_STREAMING=1 GUANACO_MAX_EXPERTS=2 GUANACO_REPACK=on timeout 300 "$CONCURRENT_DECODE" "$q" --out "$W/repacked.bin" \
    >"$W/repacked.log" 2>&1
rc=$?
if grep -q '[1-9][0-9]* expert tensors run repacked' "$W/repacked.log"; then
    [ $rc -eq 1 ] && grep -q 'serve one context at a time.*--guanaco-repack off' "$W/repacked.log"
    check "repacked experts: a second concurrent context is refused by name (rc=$rc)" $? "$(tail -3 "$W/repacked.log")"
else
    echo "SKIP repacked experts: this CPU has no repacked Q4_0 kernel"
fi
GUANACO_STREAMING=1 GUANACO_MAX_EXPERTS=2 GUANACO_REPACK=off "$CONCURRENT_DECODE" "$q" --out "$W/q4-off.bin" \
    >"$W/q4-off.log" 2>&1
rc=$?
e=$(evictions "$W/q4-off.log")
[ $rc -eq 0 ] && [ "$e" -gt 0 ] && grep -q 'all logits equal the lone runs' "$W/q4-off.log" &&
    grep -q 'so results equal --guanaco-reference' "$W/q4-off.log"
check "Q4_0, --guanaco-repack off: 4 contexts at once equal each alone, $e evictions" $? \
    "rc=$rc $(grep -E '^concurrent_decode|guanaco: (error|residency)' "$W/q4-off.log" | head -5)"

# Optional, opt-in: helgrind over a short budgeted run, for races in libguanaco's own state. valgrind
# cannot run the ggml-cpu this build makes (-march=native: AVX-512 raises SIGILL under valgrind), so
# it needs a ggml built with GGML_NATIVE=OFF, e.g. AVX2 only: HELGRIND_GGML_DIR=<folder holding that
# build's libggml-base.so.0 and libggml-cpu.so.0>. About 30 s per run on 2 cores, hence not by default.
# Reports of ggml reading the model's mapping are expected with load=direct: another context's call
# swaps the pages of an expert this one is computing with (same bytes, so never wrong weights; see
# residency.h). Only reports with a libguanaco frame fail.
if [ -z "${HELGRIND_GGML_DIR:-}" ]; then
    echo "SKIP helgrind: set HELGRIND_GGML_DIR to a GGML_NATIVE=OFF ggml build (valgrind cannot run -march=native ggml-cpu)"
elif ! command -v valgrind >/dev/null; then
    echo "SKIP helgrind: valgrind is not installed"
else
    for spec in "page-cache threads" "direct io_uring"; do
        set -- $spec
        load=$1 io=$2
        vg="$W/helgrind-$load.vg"
        LD_LIBRARY_PATH="$HELGRIND_GGML_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" GUANACO_STREAMING=1 GUANACO_RAM=$budget \
            GUANACO_MAX_EXPERTS=2 GUANACO_LOAD=$load GUANACO_IO=$io valgrind --tool=helgrind --log-file="$vg" \
            "$CONCURRENT_DECODE" "$m" --contexts 2 --prompt-tokens 16 --gen-tokens 2 --batch 16 --ubatch 8 \
            >"$W/helgrind-$load.log" 2>&1
        rc=$?
        # helgrind starts each report with a line of dashes and each thread announcement with
        # ---Thread-Announcement---: split at both; announcements are not reports.
        ours=$(awk '/^==[0-9]+== ---/ { if (b ~ /libguanaco/ && b !~ /Thread-Announcement|was created/) n++; b = ""; next }
                    { b = b "\n" $0 }
                    END { if (b ~ /libguanaco/ && b !~ /Thread-Announcement|was created/) n++; print n + 0 }' "$vg")
        summary=$(grep -oE 'ERROR SUMMARY: [0-9]+ errors from [0-9]+ contexts' "$vg")
        [ $rc -eq 0 ] && grep -q 'all logits equal the lone runs' "$W/helgrind-$load.log" && [ "$ours" -eq 0 ]
        check "helgrind, load $load, io $io: no report involving libguanaco (all: ${summary:-none})" $? \
            "rc=$rc, $ours reports involve libguanaco, see $vg; $(tail -2 "$W/helgrind-$load.log")"
    done
fi
finish
