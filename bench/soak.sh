#!/usr/bin/env bash
# bench/soak.sh - owns issue 10's soak: llama-server with --guanaco-streaming and a budget, inside a real
# cgroup v1 memory limit at most a third of the model file, serving a long run of mixed requests from
# parallel clients over loopback; then the verdict and the RSS curve (docs/soak-rss.png).
#
# Pass means, all of:
#   - every request answered: HTTP 200, no curl error, no "error" in the JSON, a string "content", and exactly
#     n_predict tokens (every request sets ignore_eos, so a shorter answer is a failure too);
#   - RSS flat after warm-up: every VmRSS sample (/proc/PID/status of the server, once a second) after the
#     first 10% of the requests lies within --rss-tolerance (5%) of the warm-up reference, the median of the
#     samples taken while the next 10% ran; RssAnon and the cgroup's memory.usage_in_bytes are sampled and
#     plotted beside it (the cgroup counts the model's page cache charged to it as well as the process);
#   - the budget held on every status line: --guanaco-audit on puts "RAM: accounted A MiB, mincore M MiB" on
#     each --guanaco-status-every line, and M (mincore over every expert tensor's pages) must stay within the
#     budget plus one MoE layer's experts (the bound README.md documents: the layer computing now is never
#     evicted); how many lines stayed within the budget alone is reported too;
#   - greedy outputs identical: --greedy requests (temperature 0, fixed seed, no prompt cache) are sent one at
#     a time to the soak server once the load is over (still in its limit, after the whole run's churn), and
#     then to a second server on the same model with streaming off and no limit; the completion text and the
#     token ids must be equal. One at a time, because llama.cpp's CPU kernels are not batch-invariant: the same
#     prompt batched with other slots' tokens can round differently (a near-tie then flips a greedy token), with
#     or without Guanaco. The same requests also ran inside the load; how many of those match is reported, not
#     judged;
#   - SIGTERM ends the soak server with exit status 0, Guanaco's "guanaco: summary:" line printed, and the
#     cgroup never OOM-killed it.
#
# Usage: bench/soak.sh [--model GGUF] [--limit SIZE] [--budget SIZE] [--requests N] [--slots N]
#                      [--greedy N] [--threads N] [--status-every N] [--out DIR] [--png PATH]
#                      [--max-minutes N] [--seed N] [--rss-tolerance PERCENT] [--nice N]
#   Defaults reproduce issue 10's check: a 872 MiB synthetic qwen3moe (16 layers, 512 experts of 0.1 MiB, top-2;
#   written by guanaco-mkmodel under /var/tmp/guanaco-soak if missing, never in the repository), a 256 MiB
#   limit (3.4x smaller than the file), a 64 MiB budget, 1000 requests from 4 clients on 4 slots, 20 of them
#   greedy, prompts of 8-200 tokens and n_predict 1-64, one compute thread, niced by 5. Many small experts and
#   top-2 keep a request's reads (what it misses) near 0.1 GiB, so 1000 requests took 14 minutes on 2 shared
#   cores; 16 layers of 128 experts, top-8, read 1.6 GiB per request and would have taken over an hour.
#   Requests: prompts are token ids drawn from a Zipf law over the vocabulary (as text is), so their lengths
#   are exact; every request sets ignore_eos (exactly n_predict tokens) and holds the reply to printable
#   ASCII with a grammar: random weights otherwise emit invalid UTF-8, which llama-server's output parser
#   answers with a 500 ("does not match the expected Content-only format") with or without Guanaco. Banning
#   the 256 byte tokens was not enough: BPE pieces of one character can be half of one too (bench/auto_peak.sh
#   met it on Dec 5, one request in 4). Sampled requests use
#   temperature 0.8 and their own seed. llama-server runs with --cache-ram 0: its host-memory prompt cache
#   (8 GiB by default) would otherwise grow inside the limit, which is llama-server's memory, not Guanaco's.
#   The model must be at least 3x the limit: a smaller one is refused.
#   Run it under the bench lock, as every timed run on this machine: flock /tmp/guanaco-bench.lock bench/soak.sh
#   Needs root and cgroup v1 memory (tests/cgroup_run.sh), curl, jq and gnuplot.
# Output: DIR/summary.md (also printed), DIR/rss.csv, DIR/results.txt, DIR/server.log, DIR/reference.log,
#   DIR/soak-rss.png, copied to --png (default docs/soak-rss.png). Exit status 0 on pass, 1 on fail, 2 on a
#   usage or setup error.
set -u

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=${LLAMA_BIN:-$ROOT/build/cmake/bin}
export GUANACO_VOCAB_DIR=${GUANACO_VOCAB_DIR:-$ROOT/build/llama.cpp/models}

MODEL=
LIMIT=256M
BUDGET=64M
REQUESTS=1000
SLOTS=4
GREEDY=20
THREADS=1
STATUS_EVERY=128
OUT=
PNG=$ROOT/docs/soak-rss.png
MAX_MINUTES=25
SEED=10
RSS_TOLERANCE=5
NICE=5

die() { echo "soak: $*" >&2; exit 2; }
usage() { sed -n '/^# Usage:/,/^#   usage or setup error/p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

# SIZE: digits with an optional K/M/G suffix (powers of 1024), as --guanaco-ram reads them
bytes_of() {
    local v=$1 n
    case "$v" in
        *[kK]) n=${v%?}; m=1024 ;; *[mM]) n=${v%?}; m=$((1024 * 1024)) ;; *[gG]) n=${v%?}; m=$((1024 * 1024 * 1024)) ;;
        *) n=$v; m=1 ;;
    esac
    case "$n" in ''|*[!0-9]*) return 1 ;; esac
    echo $((n * m))
}
count_of() { case "$2" in ''|*[!0-9]*) die "$1 takes a positive integer, got '$2'" ;; esac; [ "$2" -gt 0 ] || die "$1 must be > 0"; }

while [ $# -gt 0 ]; do
    [ $# -ge 2 ] || { [ "$1" = -h ] || [ "$1" = --help ] || die "$1 needs a value"; usage; }
    case "$1" in
        --model) MODEL=$2 ;;
        --limit) LIMIT=$2 ;;
        --budget) BUDGET=$2 ;;
        --requests) count_of "$1" "$2"; REQUESTS=$2 ;;
        --slots) count_of "$1" "$2"; SLOTS=$2 ;;
        --greedy) case "$2" in ''|*[!0-9]*) die "--greedy takes an integer, got '$2'" ;; esac; GREEDY=$2 ;;
        --threads) count_of "$1" "$2"; THREADS=$2 ;;
        --status-every) count_of "$1" "$2"; STATUS_EVERY=$2 ;;
        --out) OUT=$2 ;;
        --png) PNG=$2 ;;
        --max-minutes) count_of "$1" "$2"; MAX_MINUTES=$2 ;;
        --seed) count_of "$1" "$2"; SEED=$2 ;;
        --rss-tolerance) count_of "$1" "$2"; RSS_TOLERANCE=$2 ;;
        --nice) case "$2" in ''|*[!0-9]*) die "--nice takes 0-19, got '$2'" ;; esac; NICE=$2 ;;
        *) echo "soak: unknown argument '$1'" >&2; usage ;;
    esac
    shift 2
done
LIMIT_BYTES=$(bytes_of "$LIMIT") || die "--limit takes a size such as 256M, got '$LIMIT'"
BUDGET_BYTES=$(bytes_of "$BUDGET") || die "--budget takes a size such as 64M, got '$BUDGET'"
[ "$GREEDY" -le "$REQUESTS" ] || die "--greedy ($GREEDY) cannot exceed --requests ($REQUESTS)"
for tool in curl jq gnuplot; do command -v $tool >/dev/null || die "$tool is not installed"; done
for exe in llama-server guanaco-mkmodel evict_file; do [ -x "$BIN/$exe" ] || die "$BIN/$exe is missing (build guanaco-all, or set LLAMA_BIN)"; done

SCRATCH=/var/tmp/guanaco-soak
mkdir -p "$SCRATCH" || die "cannot create $SCRATCH"
if [ -z "$MODEL" ]; then
    MODEL=$SCRATCH/soak-qwen3moe-16x512.gguf
    if [ ! -s "$MODEL" ]; then
        echo "soak: writing $MODEL" >&2
        # a small vocab keeps the non-expert weights (token embedding, output) at 35 MiB of the limit
        "$BIN/guanaco-mkmodel" --arch qwen3moe --quant Q8_0 --seed 7 --vocab "$GUANACO_VOCAB_DIR/ggml-vocab-llama-spm.gguf" \
            --n-layer 16 --n-embd 512 --n-ff-exp 64 --n-expert 512 --n-expert-used 2 --threads 2 -o "$MODEL.tmp" >&2 ||
            die "guanaco-mkmodel failed"
        mv "$MODEL.tmp" "$MODEL" || die "cannot move $MODEL.tmp into place"
    fi
fi
[ -r "$MODEL" ] || die "--model: cannot read '$MODEL'"
MODEL_BYTES=$(stat -L -c %s "$MODEL")
[ "$MODEL_BYTES" -ge $((3 * LIMIT_BYTES)) ] ||
    die "--model: $MODEL is $((MODEL_BYTES / 1048576)) MiB, less than 3x the --limit of $((LIMIT_BYTES / 1048576)) MiB"

OUT=${OUT:-$SCRATCH/run-$(date -u +%Y%m%dT%H%M%S)}
mkdir -p "$OUT/req" "$OUT/resp" "$OUT/ref" || die "cannot create $OUT"
: >"$OUT/results.txt"
echo "soak: out dir $OUT" >&2

# Run a snapshot of the binaries: others rebuild build/cmake while a soak runs, and a library replaced under a
# running server (or a half-linked one at the reference's start) would end the run for reasons of its own. The
# copy is taken under the shared build lock when it comes within a minute; otherwise (a long queue of builds
# and tests) it is taken when no file changed during the copy, and the copy must run.
mkdir -p "$OUT/bin" || die "cannot create $OUT/bin"
copy_bins() { cp -L "$BIN/llama-server" "$BIN/evict_file" "$BIN"/lib*.so* "$OUT/bin/"; }
stamp() { stat -L -c '%n %Y %s' "$BIN/llama-server" "$BIN"/lib*.so* | md5sum; }
if ! (flock -w 60 9 && copy_bins) 9>>/tmp/guanaco-build.lock; then
    copied=0
    for _ in 1 2 3 4 5; do
        before=$(stamp); copy_bins && sleep 2 && [ "$(stamp)" = "$before" ] && { copied=1; break; }
        sleep 10
    done
    [ $copied = 1 ] || die "cannot take a stable copy of the binaries from $BIN"
fi
LD_LIBRARY_PATH=$OUT/bin "$OUT/bin/llama-server" --version >/dev/null 2>&1 || die "the copied llama-server does not run"
export LD_LIBRARY_PATH=$OUT/bin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}   # ahead of the binaries' RUNPATH
BUILT_FROM="$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null) + $(git -C "$ROOT" status --short -- src include patches tools 2>/dev/null | wc -l) uncommitted files in src, include, patches, tools"
BIN_RUN=$OUT/bin

# ---- processes we start, stopped by pid on any exit -------------------------------------------------------
SERVER_WRAPPER='' SERVER_PID='' SAMPLER_PID='' REF_PID=''
cleanup() {
    [ -n "$SAMPLER_PID" ] && kill "$SAMPLER_PID" 2>/dev/null
    [ -n "$REF_PID" ] && kill -TERM "$REF_PID" 2>/dev/null
    [ -n "$SERVER_PID" ] && kill -TERM "$SERVER_PID" 2>/dev/null
    [ -n "$SERVER_WRAPPER" ] && wait "$SERVER_WRAPPER" 2>/dev/null
    [ -n "$REF_PID" ] && wait "$REF_PID" 2>/dev/null
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() {
    local p
    for _ in $(seq 50); do
        p=$((20000 + RANDOM % 20000))
        curl -s -o /dev/null --max-time 1 "127.0.0.1:$p/" || { echo "$p"; return; }
    done
    die "no free loopback port found"
}
wait_up() {   # PORT PID LOG
    for _ in $(seq 1 180); do
        curl -sf --max-time 2 "127.0.0.1:$1/health" >/dev/null && return 0
        kill -0 "$2" 2>/dev/null || break
        sleep 1
    done
    echo "soak: the server on port $1 did not come up; last lines of $3:" >&2
    tail -5 "$3" >&2
    return 1
}

# ---- the soak server, in its cgroup -----------------------------------------------------------------------
PORT=$(free_port)
# the flags both servers share (PORT): 1024 tokens of context per slot hold the longest request (200 + 64)
server_flags() { SERVER_FLAGS=(-m "$MODEL" --host 127.0.0.1 --port "$1" -c $((1024 * SLOTS)) -np "$SLOTS" -t "$THREADS" --no-warmup --cache-ram 0); }
server_flags "$PORT"
# cgroup_run runs its command as a child; `exec` keeps the pid written here that of llama-server itself.
# The model's page cache is dropped first (cgroup_run's GUANACO_EVICT_FILES): pages cached by an earlier run or by
# guanaco-mkmodel belong to another cgroup, and mincore would count them against the budget though the engine
# never read them.
# shellcheck disable=SC2016 # $$ and $@ belong to the inner bash
GUANACO_EVICT_FILES=$MODEL GUANACO_EVICT_TOOL=$BIN_RUN/evict_file nice -n "$NICE" bash "$ROOT/tests/cgroup_run.sh" "$LIMIT_BYTES" -- bash -c 'echo $$ >"$0"; exec "$@"' "$OUT/server.pid" \
    "$BIN_RUN/llama-server" "${SERVER_FLAGS[@]}" --guanaco-streaming --guanaco-ram "$BUDGET_BYTES" \
    --guanaco-audit on --guanaco-status-every "$STATUS_EVERY" >"$OUT/server.log" 2>&1 &
SERVER_WRAPPER=$!
for _ in $(seq 50); do [ -s "$OUT/server.pid" ] && break; sleep 0.1; done
SERVER_PID=$(cat "$OUT/server.pid" 2>/dev/null)
[ -n "$SERVER_PID" ] || die "the server did not start: $(tail -3 "$OUT/server.log")"
grep -q '^SKIP' "$OUT/server.log" && die "$(cat "$OUT/server.log")"
wait_up "$PORT" "$SERVER_PID" "$OUT/server.log" || exit 1
CG_DIR=/sys/fs/cgroup/memory$(awk -F: '$2 ~ /(^|,)memory(,|$)/ { print $3; exit }' "/proc/$SERVER_PID/cgroup")
[ -r "$CG_DIR/memory.usage_in_bytes" ] || die "cannot read the server's cgroup at $CG_DIR"
N_VOCAB=$(curl -s "127.0.0.1:$PORT/v1/models" | jq -r '.data[0].meta.n_vocab // empty')
[ -n "$N_VOCAB" ] || die "the server did not report n_vocab"

# ---- the requests: token-id prompts, so their lengths are exact ------------------------------------------
# Prompt ids skip the first 300 (control and byte tokens) and follow a Zipf law (exponent 1) over the rest,
# ranks shuffled onto ids. The greedy ones are spread evenly through the run.
awk -v n="$REQUESTS" -v g="$GREEDY" -v seed="$SEED" -v vocab="$N_VOCAB" -v dir="$OUT/req" '
function zipf(   u, lo, hi, mid) {   # a rank in 1..top with probability 1/rank, by bisection on the CDF
    u = rand() * cdf[top]; lo = 1; hi = top
    while (lo < hi) { mid = int((lo + hi) / 2); if (cdf[mid] < u) lo = mid + 1; else hi = mid }
    return lo
}
BEGIN {
    srand(seed); top = (vocab < 32000 ? vocab : 32000) - 300
    for (r = 1; r <= top; r++) { cdf[r] = cdf[r - 1] + 1 / r; id[r] = 299 + r }
    for (r = top; r > 1; r--) { k = 1 + int(rand() * r); t = id[r]; id[r] = id[k]; id[k] = t }
    ascii = "\"grammar\":\"root ::= [ -~]+\""
    every = g > 0 ? int(n / g) : 0
    for (i = 1; i <= n; i++) {
        plen = 8 + int(rand() * 193); npred = 1 + int(rand() * 64)
        greedy = every > 0 && i % every == 0 && i / every <= g
        p = ""
        for (k = 0; k < plen; k++) p = p (k ? "," : "") id[zipf()]
        if (greedy)
            body = sprintf("{\"prompt\":[%s],\"n_predict\":%d,\"temperature\":0,\"seed\":42,\"cache_prompt\":false,\"ignore_eos\":true,\"return_tokens\":true,%s}", p, npred, ascii)
        else
            body = sprintf("{\"prompt\":[%s],\"n_predict\":%d,\"temperature\":0.8,\"seed\":%d,\"ignore_eos\":true,%s}", p, npred, i, ascii)
        f = sprintf("%s/%d.json", dir, i); print body > f; close(f)
        printf "%d %d %d %d\n", i, plen, npred, greedy > (dir "/../plan.txt")
    }
}'
grep -c ' 1$' "$OUT/plan.txt" >"$OUT/greedy.count"

# one request: "i http_code curl_rc start end ok tokens_predicted" appended as one short line (atomic append)
cat >"$OUT/one.sh" <<'EOF'
#!/usr/bin/env bash
i=$1 port=$2 out=$3 deadline=$4 respdir=$5
if [ "$(date +%s)" -ge "$deadline" ]; then echo "$i skipped 0 0 0 0 0" >>"$out/results.txt"; exit 0; fi
start=$(date +%s.%N)
code=$(curl -s -o "$respdir/$i.json" -w '%{http_code}' --max-time 600 -H 'Content-Type: application/json' \
    --data-binary "@$out/req/$i.json" "http://127.0.0.1:$port/completion")
rc=$?
end=$(date +%s.%N)
want=$(awk -v i="$i" '$1 == i { print $3 }' "$out/plan.txt")
got=$(jq -r 'if (.error == null) and (.content | type == "string") then .tokens_predicted else "bad" end' \
    "$respdir/$i.json" 2>/dev/null)
ok=0; [ "$code" = 200 ] && [ "$rc" = 0 ] && [ "$got" = "$want" ] && ok=1
echo "$i $code $rc $start $end $ok ${got:-none}" >>"$out/results.txt"
EOF
chmod +x "$OUT/one.sh"

# ---- the RSS sampler: once a second, the server's VmRSS/RssAnon/RssFile and the cgroup's usage --------
sampler() {
    local t0 mem cg finished
    t0=$(date +%s.%N)
    echo "# seconds vmrss_kib rssanon_kib rssfile_kib cgroup_usage_bytes requests_done" >"$OUT/rss.csv"
    while [ -r "/proc/$SERVER_PID/status" ]; do
        # one awk, not bash's read loop: that lost a field (read as 0) in 11 of 844 samples of a soak
        mem=$(awk '/^VmRSS:/ { r = $2 } /^RssAnon:/ { a = $2 } /^RssFile:/ { f = $2 } END { print r + 0, a + 0, f + 0 }' \
            "/proc/$SERVER_PID/status" 2>/dev/null) || break
        cg=$(cat "$CG_DIR/memory.usage_in_bytes" 2>/dev/null || echo 0)
        finished=$(wc -l <"$OUT/results.txt")
        echo "$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') $mem $cg $finished" >>"$OUT/rss.csv"
        sleep 1
    done
}
sampler &
SAMPLER_PID=$!

# ---- the soak ---------------------------------------------------------------------------------------------
DEADLINE=$(($(date +%s) + MAX_MINUTES * 60))
echo "soak: $REQUESTS requests ($(cat "$OUT/greedy.count") greedy) from $SLOTS clients to port $PORT, budget $BUDGET, limit $LIMIT, model $((MODEL_BYTES / 1048576)) MiB" >&2
SOAK_START=$(date +%s.%N)
seq 1 "$REQUESTS" | nice -n "$NICE" xargs -P "$SLOTS" -I{} "$OUT/one.sh" {} "$PORT" "$OUT" "$DEADLINE" "$OUT/resp"
SOAK_END=$(date +%s.%N)
sleep 2   # two more samples after the last request
cp "$CG_DIR/memory.max_usage_in_bytes" "$OUT/cgroup.max_usage" 2>/dev/null

# the greedy sample again, one at a time (see the header); the server is still in its limit
send_alone() {   # PORT DIR: each greedy request alone, in order
    local i
    while read -r i; do
        curl -s -o "$2/$i.json" --max-time 600 -H 'Content-Type: application/json' \
            --data-binary "@$OUT/req/$i.json" "http://127.0.0.1:$1/completion"
    done < <(awk '$4 == 1 { print $1 }' "$OUT/plan.txt")
}
mkdir -p "$OUT/alone"
send_alone "$PORT" "$OUT/alone"
cp "$CG_DIR/memory.max_usage_in_bytes" "$OUT/cgroup.max_usage" 2>/dev/null

# ---- SIGTERM ----------------------------------------------------------------------------------------------
kill -TERM "$SERVER_PID"
for _ in $(seq 120); do kill -0 "$SERVER_WRAPPER" 2>/dev/null || break; sleep 0.5; done
if kill -0 "$SERVER_WRAPPER" 2>/dev/null; then
    echo "soak: the server did not exit within 60 s of SIGTERM" >&2
    kill -KILL "$SERVER_PID" 2>/dev/null
fi
wait "$SERVER_WRAPPER"
WRAPPER_RC=$?
SERVER_PID='' SERVER_WRAPPER=''
wait "$SAMPLER_PID" 2>/dev/null
SAMPLER_PID=
CGROUP_LINE=$(grep '^cgroup: limit=' "$OUT/server.log" | tail -1)

# ---- the reference: same model, streaming off, no limit, the greedy requests again ------------------------
REF_PORT=$(free_port)
server_flags "$REF_PORT"
nice -n "$NICE" "$BIN_RUN/llama-server" "${SERVER_FLAGS[@]}" >"$OUT/reference.log" 2>&1 &
REF_PID=$!
GREEDY_SAME=0 GREEDY_DIFF='' LOADED_SAME=0 LOADED_DIFF=''
same_answer() {   # A B: the same text and the same, non-empty, token ids
    local a b
    a=$(jq -c '[.content, .tokens]' "$1" 2>/dev/null)
    b=$(jq -c '[.content, .tokens]' "$2" 2>/dev/null)
    [ -n "$a" ] && [ "$a" = "$b" ] && [ "$(jq '.[1] | length' <<<"$a" 2>/dev/null)" != 0 ]
}
if wait_up "$REF_PORT" "$REF_PID" "$OUT/reference.log"; then
    send_alone "$REF_PORT" "$OUT/ref"
    while read -r i; do
        if same_answer "$OUT/alone/$i.json" "$OUT/ref/$i.json"; then
            GREEDY_SAME=$((GREEDY_SAME + 1))
        else
            GREEDY_DIFF="$GREEDY_DIFF $i"
        fi
        if same_answer "$OUT/resp/$i.json" "$OUT/ref/$i.json"; then
            LOADED_SAME=$((LOADED_SAME + 1))
        else
            LOADED_DIFF="$LOADED_DIFF $i"
        fi
    done < <(awk '$4 == 1 { print $1 }' "$OUT/plan.txt")
fi
kill -TERM "$REF_PID" 2>/dev/null && wait "$REF_PID" 2>/dev/null
REF_PID=

# ---- the verdict ------------------------------------------------------------------------------------------
GREEDY_N=$(cat "$OUT/greedy.count")
read -r DONE FAILED SKIPPED < <(awk '{ n++; if ($2 == "skipped") s++; else if ($6 != 1) f++ } END { print n + 0, f + 0, s + 0 }' "$OUT/results.txt")
RAN=$((DONE - SKIPPED))
MINUTES=$(awk -v a="$SOAK_START" -v b="$SOAK_END" 'BEGIN { printf "%.2f", (b - a) / 60 }')
PER_MIN=$(awk -v n="$RAN" -v m="$MINUTES" 'BEGIN { printf "%.1f", (m > 0 ? n / m : 0) }')
TOKENS=$(awk '$6 == 1 { t += $7 } END { print t + 0 }' "$OUT/results.txt")
PROMPT_TOKENS=$(awk 'NR == FNR { p[$1] = $2; next } $6 == 1 { t += p[$1] } END { print t + 0 }' "$OUT/plan.txt" "$OUT/results.txt")

# RSS: warm-up ends after the first 10% of the requests; its reference is the median over the next 10%.
# rss.csv columns: 1 seconds, 2 VmRSS KiB, 3 RssAnon KiB, 4 RssFile KiB, 5 cgroup bytes, 6 requests done.
rss_stats() {   # COLUMN SCALE -> "reference end max_deviation_percent samples_after_warmup"
    awk -v c="$1" -v scale="$2" -v n="$REQUESTS" '
    function median(a, k,   i, j, t) {
        for (i = 2; i <= k; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] > t; j--) a[j + 1] = a[j]; a[j + 1] = t }
        return k % 2 ? a[(k + 1) / 2] : (a[k / 2] + a[k / 2 + 1]) / 2
    }
    !/^#/ && $c > 0 {   # a zero is a lost reading (see the sampler), not a value
        v = $c / scale
        if ($6 >= 0.1 * n) { after[++na] = v; if ($6 < 0.2 * n) ref[++nr] = v }
        if ($6 >= 0.9 * n) last[++nl] = v
    }
    END {
        if (nr == 0 || nl == 0) { print "0 0 100 0"; exit }
        r = median(ref, nr); e = median(last, nl)
        for (i = 1; i <= na; i++) { d = after[i] - r; if (d < 0) d = -d; d = 100 * d / r; if (d > worst) worst = d }
        printf "%.1f %.1f %.2f %d\n", r, e, worst, na
    }' "$OUT/rss.csv"
}
read -r RSS_REF RSS_END RSS_DEV RSS_N < <(rss_stats 2 1024)
read -r ANON_REF ANON_END ANON_DEV _ < <(rss_stats 3 1024)
read -r CG_REF CG_END CG_DEV _ < <(rss_stats 5 1048576)
RSS_MAX=$(awk '!/^#/ && $2 > m { m = $2 } END { printf "%.1f", m / 1024 }' "$OUT/rss.csv")

# Status lines: mincore within budget + one MoE layer's experts (the documented bound), and within the budget.
LAYER_BYTES=$(grep -o 'streaming [0-9]* expert tensors ([0-9.]* GiB' "$OUT/server.log" | head -1 |
    awk -v layers="$(grep -o '[0-9]* layers ([0-9]* MoE)' "$OUT/server.log" | head -1 | grep -o '([0-9]*' | tr -d '(')" \
        '{ g = $5; sub(/\(/, "", g); if (layers > 0) printf "%d", g * 1073741824 / layers }')
read -r ST_N ST_BUDGET ST_BOUND ST_PEAK ST_GAP < <(grep -o 'RAM: accounted [0-9.]* MiB, mincore [0-9.]* MiB' "$OUT/server.log" |
    awk -v b="$BUDGET_BYTES" -v layer="${LAYER_BYTES:-0}" '
    { a = $3; m = $6; n++; if (m * 1048576 <= b) inb++; if (m * 1048576 <= b + layer) inbound++
      if (m > peak) peak = m; d = m - a; if (d < 0) d = -d; if (d > gap) gap = d }
    END { printf "%d %d %d %.1f %.1f\n", n, inb, inbound, peak, gap }')

SUMMARY_LINE=$(grep -c 'guanaco: summary:' "$OUT/server.log")
OOM_KILL=$(sed -n 's/.*oom_kill=\([0-9na/]*\).*/\1/p' <<<"$CGROUP_LINE")

pass=1
verdict() {   # NAME OK: sets V_NAME to pass or FAIL, and pass=0 on a failure
    if [ "$2" = 1 ]; then printf -v "V_$1" pass; else printf -v "V_$1" '**FAIL**'; pass=0; fi
}
verdict REQ "$([ "$FAILED" = 0 ] && [ "$SKIPPED" = 0 ] && [ "$RAN" -ge "$REQUESTS" ] && echo 1)"
verdict RSS "$(awk -v d="$RSS_DEV" -v t="$RSS_TOLERANCE" -v n="$RSS_N" 'BEGIN { print ((n > 0 && d <= t) ? 1 : 0) }')"
verdict BUDGET "$([ "${ST_N:-0}" -gt 0 ] && [ "$ST_BOUND" = "$ST_N" ] && echo 1)"
verdict GREEDY "$([ "$GREEDY_N" -gt 0 ] && [ "$GREEDY_SAME" = "$GREEDY_N" ] && echo 1)"
verdict TERM "$([ "$WRAPPER_RC" = 0 ] && [ "$SUMMARY_LINE" -ge 1 ] && [ "${OOM_KILL:-0}" = 0 ] && echo 1)"

# ---- the RSS curve ----------------------------------------------------------------------------------------
WARM_MIN=$(awk -v n="$REQUESTS" '!/^#/ && $6 >= 0.1 * n { printf "%.3f", $1 / 60; exit }' "$OUT/rss.csv")
gnuplot <<EOF 2>"$OUT/gnuplot.err"
set terminal pngcairo noenhanced size 1000,560 font "sans,10"
set output "$OUT/soak-rss.png"
set title "llama-server soak: $RAN requests, $SLOTS slots, budget $BUDGET, cgroup limit $LIMIT, model $((MODEL_BYTES / 1048576)) MiB"
set xlabel "minutes since the server came up"
set ylabel "MiB"
set key outside bottom center horizontal
set grid
set yrange [0:$((LIMIT_BYTES / 1048576 + 32))]
set arrow from ${WARM_MIN:-0}, graph 0 to ${WARM_MIN:-0}, graph 1 nohead dt 2 lc rgb "#555555"
set label "warm-up: first 10% of the requests" at ${WARM_MIN:-0}, graph 0.05 offset 0.5, 0 font "sans,9"
lo = $RSS_REF * (1 - $RSS_TOLERANCE / 100.0); hi = $RSS_REF * (1 + $RSS_TOLERANCE / 100.0)
plot "$OUT/rss.csv" using (\$1/60):(\$5 > 0 ? \$5/1048576 : 1/0) with lines lw 1.5 lc rgb "#999999" title "cgroup memory.usage_in_bytes", \
     "$OUT/rss.csv" using (\$1/60):(\$2 > 0 ? \$2/1024 : 1/0) with lines lw 2 lc rgb "#1f77b4" title "server VmRSS (/proc/PID/status)", \
     "$OUT/rss.csv" using (\$1/60):(\$3 > 0 ? \$3/1024 : 1/0) with lines lw 1.5 lc rgb "#2ca02c" title "server RssAnon", \
     lo with lines dt 2 lc rgb "#1f77b4" title "warm-up RSS +-$RSS_TOLERANCE%", hi with lines dt 2 lc rgb "#1f77b4" notitle, \
     $((LIMIT_BYTES / 1048576)) with lines lw 1.5 lc rgb "#d62728" title "cgroup limit", \
     $((BUDGET_BYTES / 1048576)) with lines dt 3 lc rgb "#ff7f0e" title "Guanaco budget (expert bytes)"
EOF
[ -s "$OUT/soak-rss.png" ] && [ -n "$PNG" ] && mkdir -p "$(dirname "$PNG")" && cp "$OUT/soak-rss.png" "$PNG"

{
    echo "## Soak: llama-server in a memory limit"
    echo
    echo "Model $(basename "$MODEL"), $((MODEL_BYTES / 1048576)) MiB ($(awk -v m="$MODEL_BYTES" -v l="$LIMIT_BYTES" 'BEGIN { printf "%.1f", m / l }')x the limit);"
    echo "cgroup v1 limit $((LIMIT_BYTES / 1048576)) MiB, budget $((BUDGET_BYTES / 1048576)) MiB, $SLOTS slots, $SLOTS clients, -t $THREADS, nice $NICE;"
    echo "prompts of 8-200 tokens, n_predict 1-64, seed $SEED. Binaries built from $BUILT_FROM. Started $(date -u -d "@${SOAK_START%.*}" +'%Y-%m-%d %H:%M UTC')."
    echo
    echo "| check | result | verdict |"
    echo "|---|---|---|"
    echo "| requests | $RAN of $REQUESTS ran in $MINUTES min: **$PER_MIN requests/min**, $FAILED failed, $SKIPPED not sent (deadline); $PROMPT_TOKENS prompt tokens, $TOKENS generated | $V_REQ |"
    echo "| RSS flat after warm-up (VmRSS) | warm-up $RSS_REF MiB, end $RSS_END MiB, max deviation $RSS_DEV% over $RSS_N samples (max $RSS_MAX MiB) | $V_RSS |"
    echo "| RssAnon | warm-up $ANON_REF MiB, end $ANON_END MiB, max deviation $ANON_DEV% | - |"
    echo "| cgroup memory.usage_in_bytes | warm-up $CG_REF MiB, end $CG_END MiB, max deviation $CG_DEV%; max_usage $(awk '{ printf "%.1f", $1 / 1048576 }' "$OUT/cgroup.max_usage" 2>/dev/null) MiB | - |"
    echo "| budget held (mincore) | ${ST_BOUND:-0} of ${ST_N:-0} status lines within budget + one layer ($(( (BUDGET_BYTES + ${LAYER_BYTES:-0}) / 1048576 )) MiB), ${ST_BUDGET:-0} within the budget alone; peak ${ST_PEAK:-?} MiB, accounting vs mincore within ${ST_GAP:-?} MiB | $V_BUDGET |"
    echo "| greedy identical to streaming off (each alone, after the load) | $GREEDY_SAME of $GREEDY_N${GREEDY_DIFF:+ (differ:$GREEDY_DIFF)} | $V_GREEDY |"
    echo "| the same greedy requests inside the load, against streaming off alone | $LOADED_SAME of $GREEDY_N${LOADED_DIFF:+ (differ:$LOADED_DIFF)}; batch composition differs, see the header | - |"
    echo "| SIGTERM | exit status $WRAPPER_RC, summary line printed $SUMMARY_LINE time(s), oom_kill=${OOM_KILL:-?} | $V_TERM |"
    echo
    echo "\`$CGROUP_LINE\`"
    echo
    echo "Verdict: $([ $pass = 1 ] && echo PASS || echo FAIL). RSS curve: $OUT/soak-rss.png${PNG:+ (copied to ${PNG#"$ROOT"/})}."
} | tee "$OUT/summary.md"
[ $pass = 1 ]
