#!/usr/bin/env bash
# test_server.sh - owns the llama-server check: the real server with
# --guanaco-streaming answers a greedy completion over loopback with exactly
# the tokens the server without streaming gives, from several parallel slots,
# also under a budget; /metrics carries Guanaco's counters (guanaco_*) and they
# move with the requests; the server prints Guanaco's summary when it shuts down.
# Env: MKMODEL, LLAMA_BIN, WORKDIR, VOCAB_DIR.
set -u
: "${MKMODEL:?}" "${LLAMA_BIN:?}" "${WORKDIR:?}"
export GUANACO_VOCAB_DIR=${VOCAB_DIR:-${GUANACO_VOCAB_DIR:-}}
command -v curl >/dev/null || { echo "SKIP: curl is not installed"; exit 77; }
W="$WORKDIR/server"
rm -rf "$W" && mkdir -p "$W"
server_pid=""
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
stop_server() { [ -n "$server_pid" ] && kill -INT "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null; server_pid=""; }
trap stop_server EXIT

"$MKMODEL" --arch qwen3moe --quant Q8_0 --seed 5 -o "$W/model.gguf" >/dev/null 2>&1
check "tiny qwen3moe written" $? "mkmodel failed"

# serve NAME [flags]: start the server on a free loopback port, ask 3 prompts concurrently, stop it.
serve() {
    local name=$1; shift
    local port=$((20000 + RANDOM % 20000))
    "$LLAMA_BIN/llama-server" -m "$W/model.gguf" --host 127.0.0.1 --port "$port" -c 512 -np 3 -t 2 "$@" \
        >"$W/$name.log" 2>&1 &
    server_pid=$!
    local up=1
    for _ in $(seq 1 60); do
        curl -sf "127.0.0.1:$port/health" >/dev/null && { up=0; break; }
        kill -0 "$server_pid" 2>/dev/null || break
        sleep 1
    done
    check "$name: server up" $up "$(tail -3 "$W/$name.log")"
    curl -s "127.0.0.1:$port/metrics" >"$W/$name.metrics.before" 2>/dev/null
    local i
    for i in 1 2 3; do
        curl -s --max-time 120 "127.0.0.1:$port/completion" \
            -d "{\"prompt\":\"Prompt number $i about experts\",\"n_predict\":12,\"temperature\":0,\"cache_prompt\":false}" \
            | grep -o '"content":"[^"]*"' >"$W/$name.$i.txt" &
    done
    wait $(jobs -p | grep -v "^$server_pid$") 2>/dev/null
    curl -s "127.0.0.1:$port/metrics" >"$W/$name.metrics.after" 2>/dev/null
    stop_server
}
serve off
serve on --guanaco-streaming
serve budget --guanaco-streaming --guanaco-ram 1M --metrics
for i in 1 2 3; do
    [ -s "$W/on.$i.txt" ] && cmp -s "$W/off.$i.txt" "$W/on.$i.txt"
    check "prompt $i: same greedy tokens with streaming" $? "off=$(cat "$W/off.$i.txt") on=$(cat "$W/on.$i.txt")"
done
for i in 1 2 3; do
    [ -s "$W/budget.$i.txt" ] && cmp -s "$W/off.$i.txt" "$W/budget.$i.txt"
    check "prompt $i: same greedy tokens under a 1 MiB budget" $? "off=$(cat "$W/off.$i.txt") budget=$(cat "$W/budget.$i.txt")"
done
# /metrics: llama-server's own counters, then Guanaco's, all present and moving with the requests
metric() { grep -E "^$1\{" "$2" | awk '{ print $2 }'; }
missing=""
for name in tokens_total expert_accesses_total hits_total resident_ratio loads_total bytes_read_total read_seconds_total \
            stall_seconds_total evictions_total churn_loads_total budget_bytes resident_bytes \
            prefetch_issued_bytes_total prefetch_used_bytes_total prefetch_wasted_bytes_total; do
    grep -qE "^# TYPE guanaco_$name (counter|gauge)$" "$W/budget.metrics.after" &&
        [ -n "$(metric "guanaco_$name" "$W/budget.metrics.after")" ] || missing="$missing $name"
done
grep -q '^llamacpp:' "$W/budget.metrics.after" && [ -z "$missing" ]
check "/metrics carries llama-server's counters and every guanaco_* one" $? "missing:$missing"
moved=""
for name in tokens_total expert_accesses_total loads_total bytes_read_total evictions_total; do
    before=$(metric "guanaco_$name" "$W/budget.metrics.before") after=$(metric "guanaco_$name" "$W/budget.metrics.after")
    awk -v b="${before:-0}" -v a="${after:-0}" 'BEGIN { exit !(a > b) }' || moved="$moved $name:${before:-?}->${after:-?}"
done
[ -z "$moved" ]
check "/metrics: Guanaco's counters moved with the requests" $? "did not move:$moved"
budget=$(metric guanaco_budget_bytes "$W/budget.metrics.after")
[ "$budget" = 1048576 ]
check "/metrics: the budget is the one asked for ($budget)" $? "guanaco_budget_bytes=$budget"
! grep -q '^guanaco_' "$W/on.metrics.after" 2>/dev/null
check "/metrics without a budget, or without --metrics, shows no guanaco_* lines" $? "$(grep '^guanaco_' "$W/on.metrics.after" | head -2)"
grep -q 'guanaco: summary: ' "$W/on.log"
check "summary printed at shutdown" $? "$(grep guanaco "$W/on.log")"
finish
