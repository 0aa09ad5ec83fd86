#!/usr/bin/env bash
# test_rpc.sh - owns device offload tested without a GPU: llama.cpp's ggml-rpc-server on a loopback port is the
# "device", the model runs with --rpc --n-gpu-layers 99 --cpu-moe (attention and router on the device, the experts
# in host memory where Guanaco streams them), and:
#   - logits with streaming on under a budget equal the same offload configuration without streaming;
#   - the hook really copied the router's ids out of device memory (its one "router ids ... live in RPC" line),
#     and a replayed trace written back into device memory routes as the same replay all-local;
#   - offload leaves no more of the model file in the page cache (fincore) than all-local streaming, and the
#     weights uploaded to the device leave it after upload (streaming drops them).
# Skips (77) when ggml-rpc-server was not built (GGML_RPC off).
# Env: MKMODEL, LOGITS_DUMP, WORKDIR, VOCAB_DIR, LLAMA_BIN (holds ggml-rpc-server), EVICT_TOOL.
set -u
: "${MKMODEL:?}" "${LOGITS_DUMP:?}" "${WORKDIR:?}"
export GUANACO_VOCAB_DIR=${VOCAB_DIR:-${GUANACO_VOCAB_DIR:-}}
RPC_SERVER=${RPC_SERVER:-${LLAMA_BIN:-}/ggml-rpc-server}
if [ ! -x "$RPC_SERVER" ]; then
    echo "SKIP: no ggml-rpc-server at '$RPC_SERVER' (build with GGML_RPC=ON)"
    exit 77
fi
W="$WORKDIR/rpc"
rm -rf "$W" && mkdir -p "$W"
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# A free loopback port: the kernel picks one for a socket that is closed at once; rpc-server binds it right after.
# A lost race shows as rpc-server exiting, and is retried with another port.
free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
server_pid=""
stop_server() {
    [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null
    server_pid=""
}
trap stop_server EXIT
for attempt in 1 2 3; do
    port=$(free_port)
    "$RPC_SERVER" -H 127.0.0.1 -p "$port" -t 1 >"$W/rpc-server.log" 2>&1 &
    server_pid=$!
    # listening once a connect succeeds; a connect without a request is dropped by the server harmlessly
    for _ in $(seq 100); do
        kill -0 "$server_pid" 2>/dev/null || break
        (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break 2
        sleep 0.1
    done
    stop_server
done
[ -n "$server_pid" ]
check "ggml-rpc-server listening on 127.0.0.1:${port:-?}" $? "$(tail -3 "$W/rpc-server.log")"
[ -n "$server_pid" ] || finish
OFFLOAD=(--rpc "127.0.0.1:$port" --n-gpu-layers 99 --cpu-moe)

# Experts are 3/4 of this file and the non-expert weights (embeddings, attention, output) a quarter: both large
# enough for fincore to tell apart. Q8_0: x86 never repacks it, so local runs use the same kernels as streaming.
m="$W/model.gguf"
"$MKMODEL" --arch qwen3moe --quant Q8_0 --n-layer 4 --n-embd 512 --n-ff-exp 256 --n-expert 16 --seed 5 -o "$m" \
    >"$W/mkmodel.log" 2>&1
check "model written" $? "$(tail -2 "$W/mkmodel.log")"
evict() { [ -n "${EVICT_TOOL:-}" ] && [ -x "$EVICT_TOOL" ] && "$EVICT_TOOL" "$m" >/dev/null 2>&1; }
cached() { fincore --bytes --noheadings --output RES "$m" 2>/dev/null | tr -d ' '; }

# run NAME STREAMING(0|1) [logits_dump args]: a cold run; its log in $W/NAME.log, the page cache after it in CACHED_NAME
declare -A CACHED
run() {
    local name=$1 streaming=$2
    shift 2
    evict
    if [ "$streaming" = 1 ]; then
        GUANACO_STREAMING=1 GUANACO_RAM=4M GUANACO_MAX_EXPERTS=4 "$LOGITS_DUMP" "$m" "$W/$name.bin" "$@" \
            >"$W/$name.log" 2>&1
    else
        env -u GUANACO_STREAMING "$LOGITS_DUMP" "$m" "$W/$name.bin" "$@" >"$W/$name.log" 2>&1
    fi
    local rc=$?
    command -v fincore >/dev/null && CACHED[$name]=$(cached)
    return $rc
}

run rpc.off 0 --no-repack "${OFFLOAD[@]}"
check "offload, streaming off: decoded" $? "$(tail -3 "$W/rpc.off.log")"
LOGITS_DUMP_VERBOSE=1 run rpc.on 1 "${OFFLOAD[@]}"
rc=$?
[ $rc -eq 0 ] && grep -q "residency: budget" "$W/rpc.on.log"
check "offload, streaming on under a 4 MiB budget (a sixth of the experts): decoded" $? \
    "rc=$rc $(grep -E 'guanaco|logits_dump' "$W/rpc.on.log" | tail -3)"
cmp -s "$W/rpc.off.bin" "$W/rpc.on.bin"
check "offload: logits with streaming == without" $? "$(cmp "$W/rpc.off.bin" "$W/rpc.on.bin" 2>&1)"
line=$(grep -m1 'router ids of .* live in RPC' "$W/rpc.on.log")
check "the hook copied router ids out of device memory (${line#*guanaco: })" $? \
    "no such line: $(grep -c 'ffn_moe_topk' "$W/rpc.on.log") topk lines in the log"

# The same with everything local, for the page cache comparison and as a cross-check of the remote kernels.
run local.on 1
check "local, streaming on: decoded" $? "$(tail -3 "$W/local.on.log")"
cmp -s "$W/local.on.bin" "$W/rpc.on.bin"
check "offload's logits == all-local streaming's" $? "$(cmp "$W/local.on.bin" "$W/rpc.on.bin" 2>&1)"
! grep -q 'router ids of .* live in' "$W/local.on.log"
check "all-local: no ids copied off a device" $? "$(grep 'router ids' "$W/local.on.log")"

# Replay writes ids back into device memory (overwrite_router_ids through the device copy): model B replaying
# the recording of model A (same shape, other weights) computes the same logits offloaded as all-local, and
# they differ from B's own, so the written ids reached the device's MUL_MAT_ID inputs.
b="$W/b.gguf"
"$MKMODEL" --arch qwen3moe --quant Q8_0 --n-layer 4 --n-embd 512 --n-ff-exp 256 --n-expert 16 --seed 6 -o "$b" \
    >>"$W/mkmodel.log" 2>&1
GUANACO_STREAMING=1 GUANACO_TRACE_OUT="$W/a.trace" "$LOGITS_DUMP" "$m" "$W/a.bin" >"$W/a.log" 2>&1 &&
    GUANACO_STREAMING=1 "$LOGITS_DUMP" "$b" "$W/b.bin" >"$W/b.log" 2>&1 &&
    GUANACO_STREAMING=1 GUANACO_TRACE_REPLAY="$W/a.trace" "$LOGITS_DUMP" "$b" "$W/b-replay.local.bin" \
        >"$W/b-replay.local.log" 2>&1 &&
    GUANACO_STREAMING=1 GUANACO_TRACE_REPLAY="$W/a.trace" GUANACO_RAM=4M "$LOGITS_DUMP" "$b" "$W/b-replay.rpc.bin" \
        "${OFFLOAD[@]}" >"$W/b-replay.rpc.log" 2>&1
check "replay runs (record A, replay onto B local and offloaded)" $? \
    "$(tail -2 "$W/a.log" "$W/b.log" "$W/b-replay.local.log" "$W/b-replay.rpc.log" 2>&1 | grep -v '^$')"
cmp -s "$W/b-replay.local.bin" "$W/b-replay.rpc.bin" && ! cmp -s "$W/b.bin" "$W/b-replay.rpc.bin"
check "offloaded replay: ids written into device memory route as all-local replay does" $? \
    "$(cmp "$W/b-replay.local.bin" "$W/b-replay.rpc.bin" 2>&1; cmp "$W/b.bin" "$W/b-replay.rpc.bin" 2>&1 || true)"

# Page cache left of the model file after each cold run (fincore). Offloaded, llama.cpp reads the device's weights
# (attention, router, output) once through the mapping to upload them, then munmaps those ranges; munmap does not
# drop pages from the page cache, and the pinned release has no POSIX_FADV_DONTNEED after upload (llama-mmap.cpp,
# llama-model-loader.cpp), so streaming drops them itself after the load.
# Asserted: offload leaves no more of the file cached than all-local streaming does, and less by at least half
# the uploaded bytes.
if command -v fincore >/dev/null && [ -n "${EVICT_TOOL:-}" ]; then
    mib() { awk -v b="${1:-0}" 'BEGIN { printf "%.1f", b / 1048576 }'; }
    uploaded=$(grep -o 'RPC0\[[^]]*\] model buffer size = *[0-9.]* MiB' "$W/rpc.on.log" |
        awk '{ s += $(NF-1) } END { printf "%d", s * 1048576 }')
    local_cached=${CACHED[local.on]:-0} rpc_cached=${CACHED[rpc.on]:-0}
    echo "page cache of the $(mib "$(stat -c %s "$m")") MiB file after a cold run with streaming: all-local" \
         "$(mib "$local_cached") MiB, offloaded $(mib "$rpc_cached") MiB" \
         "($(mib "$uploaded") MiB uploaded to the device;" \
         "offloaded without streaming: $(mib "${CACHED[rpc.off]:-0}") MiB)"
    [ "$uploaded" -gt 0 ] && [ "$rpc_cached" -gt 0 ] && [ "$rpc_cached" -le $((local_cached + 1048576)) ]
    check "offload leaves no more of the file in the page cache than all-local streaming" $? \
        "uploaded=$uploaded offloaded=$rpc_cached local=$local_cached"
    # Streaming drops them (engine.c, drop_uploaded_weights): the offloaded run keeps at least half the uploaded
    # bytes less of the file cached than the all-local one, and says how much it dropped.
    [ "$rpc_cached" -le $((local_cached - uploaded / 2)) ] && grep -q 'weights uploaded to a device' "$W/rpc.on.log"
    check "weights uploaded to the device leave the host's page cache" $? \
        "uploaded=$uploaded offloaded=$rpc_cached local=$local_cached; $(grep -o 'dropped.*page cache' "$W/rpc.on.log")"
else
    echo "SKIP page cache: needs fincore (util-linux) and EVICT_TOOL"
fi
stop_server
finish
