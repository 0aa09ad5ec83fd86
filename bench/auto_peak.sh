#!/usr/bin/env bash
# bench/auto_peak.sh - owns issue 8 item 8's check: `--guanaco-ram auto` uses the room its memory limit
# leaves. The real llama-bench, llama-cli and llama-server (several slots) each run once with
# `--guanaco-streaming --guanaco-ram auto` inside a real cgroup v1 memory limit, cold page cache, a prompt and
# then decoding, and the table gives the cgroup's peak against the limit, OOM kills, major faults, bytes read,
# and the budget auto chose (its "budget auto:" lines, before and after the contexts' buffers are known).
#
# Pass, per client: exit status 0, no OOM kill, and the peak within 10% of the limit (peak >= 90% of it).
#
# Usage: bench/auto_peak.sh --model GGUF [--replay TRACE] [--limit SIZE] [--prompt N] [--tokens N]
#                           [--slots N] [--threads N] [--clients "bench cli server"] [--out DIR]
#   --limit    the cgroup's memory limit, as 6G or 6144M (binary units; default 6G, the issue's)
#   --prompt   prompt tokens (default 256): llama-bench's -p, each server request's token ids; llama-cli's
#              prompt is text of about that many tokens
#   --tokens   tokens decoded after it (default 32); the server's requests each predict this many
#   --slots    llama-server's -np, one request per slot, all sent at once (default 4)
#   --replay   a routing trace replayed onto the model (--guanaco-trace-replay), for every client
# Run it under the bench lock: flock /tmp/guanaco-bench.lock bench/auto_peak.sh ...
# Needs root and cgroup v1 memory (tests/cgroup_run.sh), curl and jq. Output: DIR/summary.md (also printed) and
# each client's log. Exit status 0 when every client passes, 1 when one does not, 2 on a usage or setup error.
set -u

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=${LLAMA_BIN:-$ROOT/build/cmake/bin}
export GUANACO_VOCAB_DIR=${GUANACO_VOCAB_DIR:-$ROOT/build/llama.cpp/models}

MODEL='' REPLAY='' LIMIT=6G PROMPT=256 TOKENS=32 SLOTS=4 THREADS=2 CLIENTS="bench cli server" OUT=''
die() { echo "auto_peak: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
    case $1 in
        --model) MODEL=${2:-}; shift 2 ;;
        --replay) REPLAY=${2:-}; shift 2 ;;
        --limit) LIMIT=${2:-}; shift 2 ;;
        --prompt) PROMPT=${2:-}; shift 2 ;;
        --tokens) TOKENS=${2:-}; shift 2 ;;
        --slots) SLOTS=${2:-}; shift 2 ;;
        --threads) THREADS=${2:-}; shift 2 ;;
        --clients) CLIENTS=${2:-}; shift 2 ;;
        --out) OUT=${2:-}; shift 2 ;;
        *) die "unknown argument '$1' (see the header of bench/auto_peak.sh)" ;;
    esac
done
[ -f "$MODEL" ] || die "--model: '$MODEL' is not a file"
[ -z "$REPLAY" ] || [ -f "$REPLAY" ] || die "--replay: '$REPLAY' is not a file"
for n in "$PROMPT" "$TOKENS" "$SLOTS" "$THREADS"; do
    case $n in ''|*[!0-9]*|0) die "--prompt, --tokens, --slots and --threads take positive integers" ;; esac
done
case $LIMIT in
    *[0-9]G) LIMIT_BYTES=$(( ${LIMIT%G} << 30 )) ;;
    *[0-9]M) LIMIT_BYTES=$(( ${LIMIT%M} << 20 )) ;;
    *) die "--limit takes a size such as 6G or 6144M, got '$LIMIT'" ;;
esac
for client in $CLIENTS; do
    case $client in bench|cli|server) ;; *) die "--clients: '$client' is not bench, cli or server" ;; esac
done
for exe in llama-bench llama-cli llama-server evict_file; do
    [ -x "$BIN/$exe" ] || die "$BIN/$exe is missing (build guanaco-all, or set LLAMA_BIN)"
done
for tool in curl jq; do command -v $tool >/dev/null || die "$tool is not installed"; done
[ -w /sys/fs/cgroup/memory ] || die "needs cgroup v1 memory at /sys/fs/cgroup/memory, writable (root)"
OUT=${OUT:-$ROOT/build/bench/auto-peak}
rm -rf "$OUT"
mkdir -p "$OUT" || die "cannot create $OUT"

GUANACO=(--guanaco-streaming --guanaco-ram auto)
[ -n "$REPLAY" ] && GUANACO+=(--guanaco-trace-replay "$REPLAY")
# every client starts cold: the model's pages cached by an earlier run belong to another cgroup
in_limit() { GUANACO_EVICT_FILES=$MODEL GUANACO_EVICT_TOOL=$BIN/evict_file bash "$ROOT/tests/cgroup_run.sh" "$LIMIT_BYTES" -- "$@"; }

run_bench() {
    in_limit "$BIN/llama-bench" -m "$MODEL" -p "$PROMPT" -n "$TOKENS" -r 1 -t "$THREADS" -o csv "${GUANACO[@]}" \
        >"$OUT/bench.out" 2>"$OUT/bench.log"
}

run_cli() {
    # words that tokenize to about one token each; the count is llama-cli's own (its timings line)
    awk -v n="$PROMPT" 'BEGIN { split("the of and to in is that it was for on are as with his they at be this from", w, " ")
        srand(7); for (i = 0; i < n; i++) printf "%s ", w[1 + int(rand() * 20)]; print "" }' >"$OUT/prompt.txt"
    in_limit "$BIN/llama-cli" -m "$MODEL" -f "$OUT/prompt.txt" -n "$TOKENS" -t "$THREADS" -st --ignore-eos \
        --temp 0 "${GUANACO[@]}" </dev/null >"$OUT/cli.out" 2>"$OUT/cli.log"
}

run_server() {
    local port pid_file="$OUT/server.pid" wrapper pid rc=0 i clients
    port=$((20000 + RANDOM % 20000))
    # shellcheck disable=SC2016 # $$ and $@ belong to the inner bash
    in_limit bash -c 'echo $$ >"$0"; exec "$@"' "$pid_file" "$BIN/llama-server" -m "$MODEL" --host 127.0.0.1 \
        --port "$port" -c $((SLOTS * (PROMPT + TOKENS + 64))) -np "$SLOTS" -t "$THREADS" --cache-ram 0 \
        "${GUANACO[@]}" >"$OUT/server.out" 2>"$OUT/server.log" &
    wrapper=$!
    for _ in $(seq 600); do curl -sf --max-time 2 "127.0.0.1:$port/health" >/dev/null && break
        kill -0 "$wrapper" 2>/dev/null || break; sleep 1; done
    pid=$(cat "$pid_file" 2>/dev/null)
    if ! curl -sf --max-time 2 "127.0.0.1:$port/health" >/dev/null; then
        echo "auto_peak: llama-server did not come up" >>"$OUT/server.log"
        [ -n "$pid" ] && kill "$pid" 2>/dev/null
        wait "$wrapper"
        return 1
    fi
    # token ids past the control and byte tokens, and the reply held to printable ASCII by a grammar: random
    # weights otherwise emit invalid UTF-8 (byte tokens, and BPE pieces of one character), whose parse
    # llama-server answers with a 500 (Dec 5: one of 4 requests, "does not match the expected Content-only
    # format"; banning the byte tokens was not enough)
    for i in $(seq "$SLOTS"); do
        awk -v n="$PROMPT" -v t="$TOKENS" -v s="$i" 'BEGIN { srand(s); p = ""
            for (k = 0; k < n; k++) p = p (k ? "," : "") 300 + int(rand() * 20000)
            printf "{\"prompt\":[%s],\"n_predict\":%d,\"temperature\":0,\"ignore_eos\":true,\"cache_prompt\":false,\"grammar\":\"root ::= [ -~]+\"}\n", p, t }' \
            >"$OUT/request-$i.json"
    done
    clients=()
    for i in $(seq "$SLOTS"); do
        curl -s --max-time 1800 -H 'Content-Type: application/json' --data-binary "@$OUT/request-$i.json" \
            "http://127.0.0.1:$port/completion" >"$OUT/response-$i.json" &
        clients+=($!)
    done
    wait "${clients[@]}"
    for i in $(seq "$SLOTS"); do
        [ "$(jq -r '.tokens_predicted // "bad"' "$OUT/response-$i.json" 2>/dev/null)" = "$TOKENS" ] || {
            echo "auto_peak: request $i did not predict $TOKENS tokens: $(head -c 300 "$OUT/response-$i.json")" >>"$OUT/server.log"
            rc=1; }
    done
    kill -TERM "$pid" 2>/dev/null
    wait "$wrapper" || true
    return $rc
}

{
    echo "## \`--guanaco-ram auto\` in a ${LIMIT}iB cgroup limit: $(basename "$MODEL")"
    echo
    echo "- machine: $(nproc) CPUs, $(awk '/^MemTotal/ { printf "%.1f GiB", $2 / 1048576 }' /proc/meminfo) RAM, kernel $(uname -r)"
    routing="the model's own"
    [ -n "$REPLAY" ] && routing="replayed $(basename "$REPLAY")"
    echo "- routing: $routing; prompt $PROMPT tokens, then $TOKENS decoded; $THREADS threads"
    echo "- llama-bench \`-p $PROMPT -n $TOKENS -r 1\`; llama-cli \`-st -f\` (text of about $PROMPT tokens); llama-server \`-np $SLOTS\`, $SLOTS requests of $PROMPT token ids at once"
    echo "- pass: exit 0, no OOM kill, peak >= 90% of the limit"
    echo
    echo "| client | rc | peak GiB | of the limit | OOM kills | major faults | read GB | budget auto GiB, at load / as contexts come and go | prompts stream (each decision) | prompt / decode tok/s | wall s | pass |"
    echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
} >"$OUT/summary.md"

# "prompt / decode" tok/s as each client reports them; the server's over its slots together: all their tokens over
# the longest slot's time
rates_of() {
    case $1 in
        bench) awk -F'"?,"?' 'NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next }
            $c["n_prompt"] > 0 { p = $c["avg_ts"] } $c["n_gen"] > 0 { d = $c["avg_ts"] }
            END { printf "%.1f / %.2f", p, d }' "$OUT/bench.out" ;;
        cli) sed -n 's/.*Prompt: \([0-9.]*\) t\/s | Generation: \([0-9.]*\) t\/s.*/\1 \/ \2/p' "$OUT/cli.out" "$OUT/cli.log" |
            tail -1 ;;
        server) awk '/prompt eval time =/ { pt += $(NF - 10); if ($(NF - 13) > pm) pm = $(NF - 13) }
            / eval time =/ && !/prompt/ { dt += $(NF - 10); if ($(NF - 13) > dm) dm = $(NF - 13) }
            END { if (pm > 0 && dm > 0) printf "%.1f / %.2f", 1000 * pt / pm, 1000 * dt / dm }' "$OUT/server.log" ;;
    esac
}

fails=0
for client in $CLIENTS; do
    start=$(date +%s.%N)
    "run_$client"
    rc=$?
    wall=$(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN { printf "%.0f", e - s }')
    log="$OUT/$client.log"
    cg=$(grep -h '^cgroup:' "$log" "$OUT/$client.out" 2>/dev/null | tail -1)
    field() { sed -n "s/.* $1=\([0-9-]*\).*/\1/p" <<<"$cg"; }
    peak=$(field max_usage) oom=$(field oom_kill) maj=$(field pgmajfault) rd=$(field read_bytes)
    budgets=$(grep -ho 'budget auto: .*= [0-9.]* GiB' "$log" | sed 's/.*= \([0-9.]*\) GiB/\1/' | paste -sd/ -)
    # each decision in order (at load, with the contexts, as they go): buffers, buffers with a loan, page cache
    stream=$(grep -ho 'prompts stream \(with O_DIRECT\|through the page cache\).*' "$log" | sed -n \
        -e 's/.*, \([0-9.]*\) GiB of it lent by the budget.*/buffers, \1 GiB lent/p' \
        -e '/lent by the budget/b' -e 's/^prompts stream with O_DIRECT.*/buffers/p' \
        -e 's/^prompts stream through the page cache.*/page cache/p' | paste -sd/ -)
    share=$(awk -v p="${peak:-0}" -v l="$LIMIT_BYTES" 'BEGIN { printf "%.0f%%", 100 * p / l }')
    rates=$(rates_of "$client")
    pass=yes
    if [ "$rc" -ne 0 ] || [ "${oom:-1}" != 0 ] || [ -z "$peak" ] || [ $((peak * 10)) -lt $((LIMIT_BYTES * 9)) ]; then
        pass=no; fails=$((fails + 1))
    fi
    printf '| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n' "llama-$client" "$rc" \
        "$(awk -v p="${peak:-0}" 'BEGIN { printf "%.2f", p / 1073741824 }')" "$share" "${oom:--}" "${maj:--}" \
        "$(awk -v r="${rd:-0}" 'BEGIN { printf "%.1f", r / 1e9 }')" "${budgets:--}" "${stream:--}" "${rates:--}" "$wall" "$pass" >>"$OUT/summary.md"
done
cat "$OUT/summary.md"
[ "$fails" -eq 0 ]
