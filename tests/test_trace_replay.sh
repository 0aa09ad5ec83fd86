#!/usr/bin/env bash
# test_trace_replay.sh - owns the end-to-end checks of --guanaco-trace-out
# and --guanaco-trace-replay through a real decode (logits_dump):
#   - a recording holds exactly the routings Guanaco counted;
#   - replaying model A's recording onto model B (same shape, other weights)
#     makes B route exactly as A did, and changes B's logits;
#   - replaying A's own recording onto A changes nothing (bit-identical);
#   - with streaming off, the replay drives plain llama.cpp the same way;
#   - a recording of another shape is refused with a message, exit non-zero.
# Env: MKMODEL, LOGITS_DUMP, WORKDIR, VOCAB_DIR.
set -u
: "${MKMODEL:?}" "${LOGITS_DUMP:?}" "${WORKDIR:?}"
export GUANACO_VOCAB_DIR=${VOCAB_DIR:-${GUANACO_VOCAB_DIR:-}}
W="$WORKDIR/trace-replay"
rm -rf "$W" && mkdir -p "$W"
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
records() { tail -c +121 "$1"; } # the records, without the 120-byte header (its source text differs)

"$MKMODEL" --arch qwen3moe --quant Q8_0 --seed 1 -o "$W/a.gguf" >/dev/null 2>&1 &&
"$MKMODEL" --arch qwen3moe --quant Q8_0 --seed 2 -o "$W/b.gguf" >/dev/null 2>&1 &&
"$MKMODEL" --arch qwen3moe --n-expert 16 --quant Q8_0 --seed 1 -o "$W/other-shape.gguf" >/dev/null 2>&1
check "models written" $? "mkmodel failed"

dump() { # dump NAME MODEL [env...]
    local name=$1 model=$2; shift 2
    env GUANACO_STREAMING=1 "$@" "$LOGITS_DUMP" "$model" "$W/$name.bin" >"$W/$name.log" 2>&1
}
dump a "$W/a.gguf" GUANACO_TRACE_OUT="$W/a.trace"
check "A decodes while recording" $? "$(tail -2 "$W/a.log")"
accesses=$(grep -o '[0-9]* expert accesses' "$W/a.log" | cut -d' ' -f1)
top_k=$(grep -o 'top-[0-9]*' "$W/a.log" | head -1 | cut -d- -f2)
size=$(stat -c %s "$W/a.trace" 2>/dev/null || echo 0)
record_bytes=$((12 + 4 * ((top_k + 1) / 2) + 4 * top_k))
[ -n "$accesses" ] && [ $(((size - 120) / record_bytes * top_k)) -eq "$accesses" ] && [ $(((size - 120) % record_bytes)) -eq 0 ]
check "the recording holds every counted routing ($accesses accesses)" $? "trace $size bytes, $record_bytes per record"

dump b "$W/b.gguf"
check "B decodes" $? "$(tail -2 "$W/b.log")"
dump b-replay "$W/b.gguf" GUANACO_TRACE_REPLAY="$W/a.trace" GUANACO_TRACE_OUT="$W/b-replay.trace"
check "B decodes replaying A's routing" $? "$(tail -2 "$W/b-replay.log")"
grep -q 'replay: [0-9]* routings overwritten' "$W/b-replay.log"
check "the replay reports what it overwrote" $? "$(grep guanaco "$W/b-replay.log")"
cmp -s <(records "$W/a.trace") <(records "$W/b-replay.trace")
check "B routed exactly as A did" $? "recordings differ"
! cmp -s "$W/b.bin" "$W/b-replay.bin"
check "replay changed B's logits" $? "identical logits: the replay did nothing"

# Streaming off: plain llama.cpp (--no-repack) driven by the same routing, which is what benchmarks compare.
env -u GUANACO_STREAMING GUANACO_TRACE_REPLAY="$W/a.trace" GUANACO_TRACE_OUT="$W/b-plain-replay.trace" \
    "$LOGITS_DUMP" "$W/b.gguf" "$W/b-plain-replay.bin" >"$W/b-plain-replay.log" 2>&1
check "plain B decodes replaying A's routing" $? "$(tail -2 "$W/b-plain-replay.log")"
grep -q "streaming off: experts load as in plain llama.cpp" "$W/b-plain-replay.log" &&
    cmp -s <(records "$W/a.trace") <(records "$W/b-plain-replay.trace") &&
    cmp -s "$W/b-replay.bin" "$W/b-plain-replay.bin"
check "plain B replays A's routing: same routing and logits as streaming B" $? \
    "$(grep guanaco "$W/b-plain-replay.log" | head -3)"

dump a-replay "$W/a.gguf" GUANACO_TRACE_REPLAY="$W/a.trace"
cmp -s "$W/a.bin" "$W/a-replay.bin"
check "replaying A's own routing onto A is bit-identical" $? "logits differ"

dump mismatch "$W/other-shape.gguf" GUANACO_TRACE_REPLAY="$W/a.trace"
rc=$?
[ $rc -ne 0 ] && [ $rc -lt 128 ] && grep -q "refusing to replay" "$W/mismatch.log"
check "a recording of another shape is refused" $? "rc=$rc: $(grep -i 'guanaco' "$W/mismatch.log" | head -3)"
finish
