#!/usr/bin/env bash
# side_by_side.sh - owns the live benchmark: plain llama.cpp against Guanaco on
# one model, in one invocation, interleaved, under the same real cgroup v1
# memory limit per budget, with the page cache of the model dropped before
# every limited run and filled before the in-RAM reference. It writes the raw
# runs (runs.csv), a Markdown report (report.md: medians, ranges, ratios
# against plain llama.cpp, the physical limit, compute under the engine, and
# the simulator's prediction of the same runs) and a gnuplot PNG.
#
#   bench/side_by_side.sh --model M.gguf [--replay TRACE] [--budgets "10 25 50 100"]
#       [--variants "ram plain lazy guanaco"] [--reps N] [--tokens N] [--prompt N]
#       [--margin-mib N] [--compute-ms X] [--threads N] [--repack] [--resident] [--out DIR] [--title TEXT]
#       [--read-cap GBPS] [--report-only]
# --report-only writes the report of the runs already in --out again, with the same other arguments: it
# runs nothing, takes fio from the run's samples, and reads the prompt columns from the logs again.
#
# A budget B% means: Guanaco may keep B% of the model's expert bytes resident
# (--guanaco-ram), and every variant runs in a cgroup limit of
#   non-expert bytes + B% of expert bytes + margin (default 1536 MiB: KV cache,
#   compute buffers, one layer's working set in flight, the process itself).
# Variants (each runs with -nr: no CPU repacking, so plain llama.cpp can
# stream Q4_0 at all, and both compute on the same layout; with --repack the
# ram and guanaco variants run without -nr, as users run them: plain llama.cpp's
# default repacks in RAM, and Guanaco repacks what it reads, --guanaco-repack):
#   ram              the WARM in-RAM reference: the whole model is read into the page
#                    cache first (cat), then llama-bench runs with streaming off and no
#                    binding limit (a cgroup at MemTotal, only to measure reads and peak).
#                    Once per rep, before that rep's limited runs; skipped when the model
#                    + 1 GiB exceeds MemAvailable; refused unless >= 99% of the model is
#                    cached when it starts
#   plain            plain llama.cpp, mmap, streaming off
#   lazy[+SET...]    --guanaco-streaming only (experts not read at load)
#   guanaco[:POLICY[:LOAD[:IO]]][+SET...]   the residency engine with budget B%
#   +SET             +KEY=VALUE, repeatable: the run gets the environment variable
#                    GUANACO_KEY=VALUE (KEY upper-cased, '-' read as '_'). KEY is
#                    [a-z][a-z0-9_-]*, VALUE is [A-Za-z0-9._/-]+ (no ',', ':' or '+').
#                    prefetch takes none|pilot|gate (the engine's default is pilot), e.g.
#                      guanaco+prefetch=none                           default configuration, prefetch off
#                      guanaco+prefetch=pilot                          default configuration, prefetch on
#                      guanaco:layer-lru:page-cache:io_uring+prefetch=none
#                    Settings come after the script's own GUANACO_STATUS_EVERY=1,
#                    GUANACO_AUDIT=0 and GUANACO_TRACE_OUT, so they override them (the
#                    miss, stall and prompt columns need STATUS_EVERY=1).
# --read-cap GBPS caps every read of the model's disk by this script and its children (fio, cat, every variant) at
# GBPS GB/s, with cgroup v1's blkio throttle (blkio.throttle.read_bps_device on the disk that holds the model). This
# VM's disk moved 0.24-3 GB/s within an hour, partly when the host's cache served reads; below the cap the rate no
# longer depends on that cache, so fio, the limits and the runs agree. A disk slower than the cap still shows.
# --resident adds, at the end of every rep, one run of the default guanaco at budget 100 (every expert resident,
# nothing read while decoding): compute under the engine, measured in the same table. The simulator takes its time
# outside the stall as its compute per token (report.sh) where the warm ram run, plain llama.cpp's page cache, on
# this VM swung 1.2-1.75x between tables of one benchmark run while Guanaco's own compute held. It is not a judged
# cell. A table with guanaco at budget 100 among its --budgets has that run already.
# Every limited run (all but ram) starts from a dropped page cache, checked:
# a warm ram run never leaks into the runs after it. Each rep runs ram, then
# every budget x variant in the order given, so variants alternate across reps.
# With --replay, every variant (plain included: the hook then only replays)
# routes by the recorded trace instead of the synthetic router.
#
# Definitions used in the report (report.sh's header has the derived ones):
#   decode tok/s     llama-bench tg (after its warmup), median over reps, [min-max]
#   prompt tok/s     llama-bench pp of --prompt tokens (after its warmup prompt); TTFT = prompt/pp + 1/tg
#   disk read        bytes the run submitted to the block layer (/proc/PID/io, children included)
#   peak memory      the cgroup's max_usage_in_bytes
#   miss bytes/token Guanaco's bytes read over the last --tokens status lines (the measured decode)
#   stall ms/token   Guanaco's stall (compute waiting on residency) over the same status lines
#   prompt bytes     Guanaco's bytes read over the status lines of the measured prompt, one per ubatch
#                    of 512 tokens (-ub 512), found by position; empty unless the run printed exactly the
#                    lines llama-bench's warmup and measured prompts and decode give
#   compute/token    warm in-RAM compute per decode token: 1000 / the warm ram runs' median decode
#                    tok/s, unless --compute-ms is given
#   physical limit   OVERLAPPED: 1 / max(miss bytes per token / fio bandwidth, compute per token);
#                    the serial limit 1 / (miss / fio + compute) is printed beside it
#   prompt limit     prompt / max(prompt bytes / fio bandwidth, prompt / warm ram prompt tok/s)
#   outside stall    1 / decode tok/s - stall per token: compute under the engine plus the engine's
#                    own work outside the stall; flagged where it exceeds warm compute by > 10%
#   PMD-mapped       the ram runs' peak FilePmdMapped (smaps_rollup every 3 s): how much of the warm
#                    reference ran on 2 MiB mappings (two warm decodes differed 1.47x with 16 and 0.28 GB)
#   fio bandwidth    fio randread, 1 MiB blocks, io_uring, queue depth 16, O_DIRECT, on the model
#                    file: Guanaco's read size and depth; the higher of a sample before and after the runs
# The report is refused when a limited run did not start cold (more than 1% of
# the model cached), the ram run did not start warm (less than 99% cached), or
# a run ran without its limit in force.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN="$ROOT/build/cmake/bin"

MODEL="" REPLAY="" BUDGETS="10 25 50 100" VARIANTS="ram plain lazy guanaco" REPS=1 TOKENS=16 PROMPT=32
MARGIN_MIB=1536 COMPUTE_MS="" OUT="" TITLE="" THREADS=$(nproc) REPACK=0 RESIDENT=0 READ_CAP=""
UBATCH=512     # llama-bench's default -ub, passed explicitly: the prompt's status lines come one per ubatch
WARM_PCT=99    # the ram run must start with at least this much of the model cached
COLD_PCT=1     # every other run with at most this much
die() { echo "side_by_side: $*" >&2; exit 2; }
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }
while [ $# -gt 0 ]; do
    case $1 in
    --model) MODEL=$2; shift 2 ;;
    --replay) REPLAY=$2; shift 2 ;;
    --budgets) BUDGETS=$2; shift 2 ;;
    --variants) VARIANTS=$2; shift 2 ;;
    --reps) REPS=$2; shift 2 ;;
    --tokens) TOKENS=$2; shift 2 ;;
    --prompt) PROMPT=$2; shift 2 ;;
    --margin-mib) MARGIN_MIB=$2; shift 2 ;;
    --compute-ms) COMPUTE_MS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --title) TITLE=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --repack) REPACK=1; shift ;;
    --resident) RESIDENT=1; shift ;;
    --report-only) REPORT_ONLY=1; shift ;;
    --read-cap) READ_CAP=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
    esac
done

# variant_parse VARIANT: sets V_KIND V_POLICY V_LOAD V_IO and V_ENV (GUANACO_KEY=VALUE words); dies on a bad one
variant_parse() {
    local variant=$1 base settings rest kv key name
    local -a parts=()
    base=${variant%%+*}
    settings=${variant:${#base}}
    IFS=: read -r V_KIND V_POLICY V_LOAD V_IO rest <<<"$base"
    V_ENV=()
    case $V_KIND in
    ram | plain) [ "$variant" = "$V_KIND" ] || die "variant '$variant': $V_KIND takes no :FIELDS and no +KEY=VALUE" ;;
    lazy) [ "$base" = lazy ] || die "variant '$variant': lazy takes no :FIELDS (only +KEY=VALUE)" ;;
    guanaco) [ -z "$rest" ] || die "variant '$variant': guanaco takes at most :POLICY:LOAD:IO" ;;
    *) die "unknown variant '$variant' (see --help)" ;;
    esac
    [ -z "$settings" ] && return 0
    [[ $settings =~ ^(\+[a-z][a-z0-9_-]*=[A-Za-z0-9._/-]+)+$ ]] ||
        die "variant '$variant': settings are +KEY=VALUE, KEY [a-z][a-z0-9_-]*, VALUE [A-Za-z0-9._/-]+"
    IFS=+ read -ra parts <<<"${settings#+}"
    for kv in "${parts[@]}"; do
        key=${kv%%=*}
        case $key in
        prefetch) [[ ${kv#*=} =~ ^(none|pilot|gate)$ ]] || die "variant '$variant': prefetch is none, pilot or gate" ;;
        esac
        name=${key^^}
        V_ENV+=("GUANACO_${name//-/_}=${kv#*=}")
    done
}

[ -f "$MODEL" ] || die "--model FILE is required and must exist"
if [ -n "$READ_CAP" ]; then
    [[ $READ_CAP =~ ^[0-9]+([.][0-9]+)?$ ]] && awk -v c="$READ_CAP" 'BEGIN { exit !(c > 0 && c < 1000) }' ||
        die "--read-cap takes GB/s, a number above 0 and below 1000, got '$READ_CAP'"
fi
[ -z "$REPLAY" ] || [ -f "$REPLAY" ] || die "--replay $REPLAY: no such file"
for n in $REPS $TOKENS $PROMPT $MARGIN_MIB $BUDGETS; do
    [[ $n =~ ^[0-9]+$ ]] || die "expected whole numbers, got '$n'"
done
for b in $BUDGETS; do
    if [ "$b" -lt 1 ] || [ "$b" -gt 100 ]; then die "budgets are 1..100 (% of expert bytes)"; fi
done
read -ra VARIANT_LIST <<<"$VARIANTS"
[ ${#VARIANT_LIST[@]} -gt 0 ] || die "--variants is empty"
for variant in "${VARIANT_LIST[@]}"; do variant_parse "$variant"; done # before an hour of runs, not during
OUT=${OUT:-$ROOT/build/bench/$(basename "$MODEL" .gguf)${REPLAY:+-replay}}
SIZE=$(stat -L -c %s "$MODEL")
MEMTOTAL=$(($(awk '/MemTotal/ { print $2 }' /proc/meminfo) * 1024))
RUNS="$OUT/runs.csv"
if [ "${REPORT_ONLY:-0}" = 1 ]; then
    [ -f "$RUNS" ] && [ -f "$OUT/logs/probe.err" ] && [ -f "$OUT/logs/fio-before.json" ] ||
        die "--report-only: no earlier runs in $OUT (runs.csv, logs/probe.err, logs/fio-before.json)"
else
    [ -w /sys/fs/cgroup/memory ] || die "needs cgroup v1 memory at /sys/fs/cgroup/memory, writable (root)"
    command -v fio >/dev/null || die "needs fio"
    command -v fincore >/dev/null || die "needs fincore (util-linux)"
    mkdir -p "$OUT/logs"
    echo "budget_pct,variant,rep,limit_bytes,tg_ts,pp_ts,read_bytes,max_usage,resident_pct,guanaco_read_gib,guanaco_gbps,\
miss_bytes_per_token,stall_ms_per_token,prompt_read_bytes,prompt_stall_ms_per_token,cached_before,cached_pct,rc,\
pmd_mapped_bytes" >"$RUNS"
fi

# The disk that holds the model, as major:minor: a partition's disk, whose sysfs holds the read-ahead and whose
# queue the read cap throttles (bios are issued there).
DISK_DEVNUM=$(stat -L -c '%Hd:%Ld' "$MODEL")
[ -e "/sys/dev/block/$DISK_DEVNUM/partition" ] && DISK_DEVNUM=$(cat "/sys/dev/block/$DISK_DEVNUM/../dev")

# ---- the read cap: this shell joins a blkio cgroup, so every command it starts from here on is throttled ----
DISK_TEXT_CAP=""
if [ -n "$READ_CAP" ]; then
    CAP_BYTES=$(awk -v c="$READ_CAP" 'BEGIN { printf "%.0f", c * 1e9 }')
    DISK_TEXT_CAP="; **reads capped at $READ_CAP GB/s** (cgroup v1 blkio.throttle.read_bps_device on $DISK_DEVNUM, every run and fio)"
    if [ "${REPORT_ONLY:-0}" != 1 ]; then
        BLKIO=/sys/fs/cgroup/blkio
        [ -w "$BLKIO" ] || die "--read-cap needs cgroup v1 blkio at $BLKIO, writable (root)"
        CAP_GROUP="$BLKIO/guanaco-read-cap-$$"
        mkdir "$CAP_GROUP" || die "cannot create $CAP_GROUP"
        # on exit this shell leaves the group, which can then go: a cgroup with a member cannot be removed
        trap 'echo $$ > "$BLKIO/cgroup.procs" 2>/dev/null; rmdir "$CAP_GROUP" 2>/dev/null' EXIT
        echo "$DISK_DEVNUM $CAP_BYTES" >"$CAP_GROUP/blkio.throttle.read_bps_device" ||
            die "cannot cap reads of $DISK_DEVNUM at $CAP_BYTES bytes/s"
        echo $$ >"$CAP_GROUP/cgroup.procs" || die "cannot join $CAP_GROUP"
        echo "side_by_side: reads of $DISK_DEVNUM capped at $READ_CAP GB/s ($CAP_GROUP)"
    fi
fi

# ---- the model's split: one lazy load that evaluates a single token ----
probe_log="$OUT/logs/probe.err"
if [ "${REPORT_ONLY:-0}" != 1 ]; then
    GUANACO_STREAMING=1 "$BIN/llama-bench" -m "$MODEL" -p 1 -n 0 -r 1 -t "$THREADS" --no-warmup -o csv \
        >/dev/null 2>"$probe_log" || die "cannot load $MODEL: $(tail -3 "$probe_log")"
fi
EXPERT_BYTES=$(grep -o 'streaming [0-9]* expert tensors ([0-9.]* GiB' "$probe_log" |
    awk '{ gsub(/\(/, "", $5); printf "%.0f", $5 * 1073741824 }')
[ -n "$EXPERT_BYTES" ] || die "no expert tensors in $MODEL"
NON_EXPERT=$((SIZE - EXPERT_BYTES))
MARGIN=$((MARGIN_MIB * 1048576))

# ---- the disk, for Guanaco's read size and depth: sampled before and after the runs ----
# This disk is shared: one sample has read 0.34 GB/s and the next 1.4. The report takes the higher of the
# two, which makes the physical limit higher and Guanaco's share of it lower, never flattering.
measure_fio() { # measure_fio NAME: prints GB/s
    fio --name=guanaco-reads --filename="$MODEL" --allow_file_create=0 --rw=randread --bs=1m --direct=1 \
        --ioengine=io_uring --iodepth=16 --time_based --ramp_time=1 --runtime=8 --output-format=json \
        >"$OUT/logs/$1.json"
    fio_of "$1"
}
fio_of() { jq '.jobs[0].read.bw_bytes / 1e9' "$OUT/logs/$1.json" 2>/dev/null || echo 0; }
if [ "${REPORT_ONLY:-0}" = 1 ]; then
    FIO_BEFORE=$(fio_of fio-before)
else
    FIO_BEFORE=$(measure_fio fio-before)
fi
FIO_GBPS=$FIO_BEFORE

MACHINE="$(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')), \
$(awk '/MemTotal/ { printf "%.1f GiB RAM", $2 / 1048576 }' /proc/meminfo), kernel $(uname -r)"
DEVICE=$(df --output=source "$MODEL" | tail -1)
# The device's read-ahead decides how plain llama.cpp's page faults stream the file (8 MiB reads it in 2 MiB
# page-cache folios); sysfs, as opening the device itself may be refused. A partition reads its disk's.
READAHEAD=$(cat "/sys/dev/block/$DISK_DEVNUM/queue/read_ahead_kb" 2>/dev/null || echo "?")

model_cached() { fincore --bytes --noheadings --output RES "$MODEL" | tr -d ' '; }

# prompt_columns ERR: "bytes stall_ms_per_token" of the measured prompt, from a run's status lines, or nothing.
# llama-bench prints status lines in this order: the warmup prompt's, the measured prompt's, then (with TOKENS > 0)
# the decode warmup's one and the measured decode's TOKENS. A line counts the tokens that reached the last MoE
# layer, which keeps only the rows that give logits (one in a prompt's last ubatch): a prompt of k = ceil(PROMPT /
# UBATCH) ubatches prints one line for all of them (seen with 1024 tokens, k = 2), or k where each ubatch gives a
# row. The lines are told apart by position, and only when there are exactly 2 + or 2k + the decode's.
# Stall per prompt token: each line's stall per token times its tokens, over PROMPT.
prompt_columns() {
    grep -h 'guanaco: status at token' "$1" |
        sed -n 's/.*status at token [0-9]*: \([0-9]*\) tokens,.* \([0-9.]*\) GiB read at.*stall \([0-9.]*\) ms\/token.*/\1 \2 \3/p' |
        awk -v p="$PROMPT" -v ub="$UBATCH" -v tg="$TOKENS" '{ n++; t[n] = $1; g[n] = $2; s[n] = $3 }
            END { k = int((p + ub - 1) / ub); after = tg > 0 ? tg + 1 : 0
                  if (n == 2 + after) k = 1
                  else if (n != 2 * k + after) exit
                  for (i = k + 1; i <= 2 * k; i++) { gib += g[i]; st += s[i] * t[i] }
                  printf "%.0f %.1f\n", gib * 1073741824, st / p }' || true
}

# ---- one run ----
# run BUDGET VARIANT REP: appends one row to runs.csv
run() {
    local budget=$1 variant=$2 rep=$3
    local name="b${budget}-${variant//:/-}-r$rep" limit flags=() env_extra=()
    local budget_bytes=$((EXPERT_BYTES * budget / 100))
    limit=$(((NON_EXPERT + budget_bytes + MARGIN) / 4096 * 4096)) # the kernel keeps whole pages
    variant_parse "$variant"
    case $V_KIND in
    ram) limit=$((MEMTOTAL / 4096 * 4096)) ;; # measured the same way, never binding
    plain) ;;
    lazy) flags=(--guanaco-streaming) ;;
    guanaco)
        flags=(--guanaco-streaming --guanaco-ram "$budget_bytes")
        [ -n "${V_POLICY:-}" ] && flags+=(--guanaco-policy "$V_POLICY")
        [ -n "${V_LOAD:-}" ] && flags+=(--guanaco-load "$V_LOAD")
        [ -n "${V_IO:-}" ] && flags+=(--guanaco-io "$V_IO")
        env_extra=(GUANACO_STATUS_EVERY=1 GUANACO_AUDIT=0 GUANACO_TRACE_OUT="$OUT/logs/$name.trace") ;;
    esac
    env_extra+=("${V_ENV[@]}") # the variant's +KEY=VALUE settings, last so they win
    [ -n "$REPLAY" ] && flags+=(--guanaco-trace-replay "$REPLAY")
    # The page cache of the model: filled for the warm in-RAM reference, dropped for every other run, and
    # checked either way before the run starts. A warm ram run cannot leak into a limited run after it:
    # that run drops the cache again and is refused unless it starts cold.
    local no_repack=-nr
    if [ "$REPACK" = 1 ] && { [ "$V_KIND" = ram ] || [ "$V_KIND" = guanaco ]; }; then
        no_repack=""
    fi
    local cached
    if [ "$V_KIND" = ram ]; then
        # Up to three passes: one read leaves the pages on the inactive list, and with the model near the
        # size of RAM the kernel reclaims some of them (97-98% cached after one pass, measured); a second
        # read makes them active.
        for _ in 1 2 3; do
            cat "$MODEL" >/dev/null
            cached=$(model_cached)
            [ $((cached * 100)) -lt $((SIZE * WARM_PCT)) ] || break
        done
        if [ $((cached * 100)) -lt $((SIZE * WARM_PCT)) ]; then
            echo "side_by_side: REFUSED: $name started with only $cached of $SIZE bytes of the model cached" \
                "(the warm in-RAM reference needs >= $WARM_PCT%; is memory short?)" >&2
            exit 1
        fi
        # One untimed decode first: the first process to map the model after it was read decoded slower than the
        # next ones (48-layer Q4_0, evicted and read twice, then three llama-bench -p 0 -n 16 runs, two cycles:
        # 7.41 then 9.20 and 9.27 tok/s; 8.38 then 9.83 and 10.05; Dec 6, bench/PIPELINE.md), and the reference
        # is the steady state a user's second run sees. It replays the run's routing too, so that it touches the
        # experts the timed run will (llama-bench's own routing uses few of them).
        GUANACO_LOG=0 "$BIN/llama-bench" -m "$MODEL" -p 0 -n 4 -r 1 -t "$THREADS" ${no_repack:+"$no_repack"} -o csv \
            ${REPLAY:+--guanaco-trace-replay "$REPLAY"} >/dev/null 2>&1 || true
        cached=$(model_cached)
    else
        "$BIN/evict_file" "$MODEL" >/dev/null
        # the model's repack cache (--guanaco-repack-cache) starts cold too
        [ -f "$MODEL.guanaco-repack" ] && "$BIN/evict_file" "$MODEL.guanaco-repack" >/dev/null
        cached=$(model_cached)
        if [ $((cached * 100)) -gt $((SIZE * COLD_PCT)) ]; then
            echo "side_by_side: REFUSED: $name started with $cached bytes of the model cached (page cache not dropped)" >&2
            exit 1
        fi
    fi
    local cached_pct
    cached_pct=$(awk -v c="$cached" -v s="$SIZE" 'BEGIN { printf "%.1f", 100 * c / s }')
    local wrap=(bash "$ROOT/tests/cgroup_run.sh" "$limit" --)
    local rc=0
    # How much of the model the warm reference maps in 2 MiB pages (its peak FilePmdMapped): two warm runs of the
    # same decode differed 1.47x with 16 and 0.28 GB so mapped (bench/PIPELINE.md). Sampled
    # every 3 s and in the ram runs only: reading smaps_rollup walks the page tables, tens of ms for 16 GB.
    local pmd_file="$OUT/logs/$name.pmd" sampler=""
    rm -f "$pmd_file"
    if [ "$V_KIND" = ram ]; then
        (
            peak=0
            while sleep 3; do
                pid=$(pgrep -n -x llama-bench) || continue
                kb=$(awk '/^FilePmdMapped:/ { print $2 }' "/proc/$pid/smaps_rollup" 2>/dev/null) || continue
                if [ "${kb:-0}" -gt "$peak" ]; then peak=$kb; echo $((peak * 1024)) >"$pmd_file"; fi
            done
        ) &
        sampler=$!
    fi
    env "${env_extra[@]}" "${wrap[@]}" "$BIN/llama-bench" -m "$MODEL" -p "$PROMPT" -n "$TOKENS" -r 1 -t "$THREADS" \
        -ub "$UBATCH" ${no_repack:+"$no_repack"} -o csv "${flags[@]}" >"$OUT/logs/$name.csv" 2>"$OUT/logs/$name.err" || rc=$?
    if [ -n "$sampler" ]; then
        kill "$sampler" 2>/dev/null || true
        wait "$sampler" 2>/dev/null || true
    fi
    local pmd
    pmd=$(cat "$pmd_file" 2>/dev/null || true)
    local csv="$OUT/logs/$name.csv" err="$OUT/logs/$name.err"
    local tg pp
    tg=$(awk -F'"?,"?' 'NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i }
        NR > 1 && $c["n_gen"] + 0 > 0 { gsub(/"/, "", $c["avg_ts"]); print $c["avg_ts"] }' "$csv" | head -1)
    pp=$(awk -F'"?,"?' 'NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i }
        NR > 1 && $c["n_prompt"] + 0 > 0 { gsub(/"/, "", $c["avg_ts"]); print $c["avg_ts"] }' "$csv" | head -1)
    local cg read_bytes max_usage limit_seen
    cg=$(grep -h '^cgroup:' "$csv" "$err" | tail -1 || true)
    read_bytes=$(sed -n 's/.*read_bytes=\([0-9]*\).*/\1/p' <<<"$cg")
    max_usage=$(sed -n 's/.*max_usage=\([0-9]*\).*/\1/p' <<<"$cg")
    limit_seen=$(sed -n 's/.*limit=\([0-9]*\).*/\1/p' <<<"$cg")
    if [ "${limit_seen:-0}" != "$limit" ]; then
        echo "side_by_side: REFUSED: $name ran without its limit in force (asked $limit, cgroup says '${limit_seen:-none}')" >&2
        exit 1
    fi
    local final resident gib gbps miss stall pbytes="" pstall=""
    final=$(grep -h 'guanaco: residency: [0-9]* tokens' "$err" | tail -1 || true)
    resident=$(sed -n 's/.*resident \([0-9.]*\)% of.*/\1/p' <<<"$final")
    gib=$(sed -n 's/.* \([0-9.]*\) GiB read at.*/\1/p' <<<"$final")
    gbps=$(sed -n 's/.*GiB read at \([0-9.]*\) GB\/s.*/\1/p' <<<"$final")
    # the measured decode: the last TOKENS one-token status lines
    miss=$(grep -h 'guanaco: status at token' "$err" | grep ': 1 tokens,' | tail -n "$TOKENS" |
        sed -n 's/.* \([0-9.]*\) GiB read at.*/\1/p' | awk '{ s += $1; n++ } END { if (n) printf "%.0f", s * 1073741824 / n }' || true)
    stall=$(grep -h 'guanaco: status at token' "$err" | grep ': 1 tokens,' | tail -n "$TOKENS" |
        sed -n 's/.*stall \([0-9.]*\) ms\/token.*/\1/p' | awk '{ s += $1; n++ } END { if (n) printf "%.1f", s / n }' || true)
    if [ "$PROMPT" -gt 1 ]; then
        read -r pbytes pstall <<<"$(prompt_columns "$err")"
    fi
    echo "$budget,$variant,$rep,$limit,${tg:-},${pp:-},${read_bytes:-},${max_usage:-},${resident:-},${gib:-},${gbps:-},\
${miss:-},${stall:-},${pbytes:-},${pstall:-},$cached,$cached_pct,$rc,$pmd" >>"$RUNS"
    printf '%4s%% %-36s rep %s: decode %6s tok/s, prompt %6s tok/s, read %6.2f GB, peak %6.2f GB, cached %s%% at start%s%s\n' \
        "$budget" "$variant" "$rep" "${tg:-FAIL}" "$([ "$PROMPT" = 0 ] && echo - || echo "${pp:-FAIL}")" "$(awk -v b="${read_bytes:-0}" 'BEGIN { print b / 1e9 }')" \
        "$(awk -v b="${max_usage:-0}" 'BEGIN { print b / 1e9 }')" "$cached_pct" "${resident:+, resident $resident%}" \
        "$([ $rc -ne 0 ] && echo ", rc=$rc (see $err)")"
}

echo "side_by_side: $(basename "$MODEL"): $((SIZE / 1000000)) MB, experts $((EXPERT_BYTES / 1000000)) MB, \
non-expert $((NON_EXPERT / 1000000)) MB; fio $FIO_BEFORE GB/s; routing: ${REPLAY:-llama-bench synthetic (random weights)}"
fits_in_ram=$(awk -v s="$SIZE" '/MemAvailable/ { print (s + 1073741824 < $2 * 1024) ? 1 : 0 }' /proc/meminfo)
want_ram=0
[[ " ${VARIANT_LIST[*]} " == *" ram "* ]] && want_ram=1
if [ "$want_ram" = 1 ] && [ "$fits_in_ram" = 0 ]; then
    echo "side_by_side: ram skipped: the model + 1 GiB exceeds MemAvailable, so it cannot be held warm"
fi
if [ "$RESIDENT" = 1 ] && [ "$fits_in_ram" = 0 ]; then
    echo "side_by_side: --resident skipped: every expert resident does not fit in MemAvailable"
    RESIDENT=0
fi
# a table whose budgets and variants include guanaco at 100 already runs that cell
if [[ " $BUDGETS " == *" 100 "* ]] && [[ " ${VARIANT_LIST[*]} " == *" guanaco "* ]]; then
    RESIDENT=0
fi
if [ "${REPORT_ONLY:-0}" = 1 ]; then
    # the prompt columns again, from each run's log (this parse may have changed since the runs)
    {
        IFS= read -r header
        echo "$header"
        while IFS=, read -r budget variant rep rest; do
            IFS=, read -ra f <<<"$rest"
            err="$OUT/logs/b${budget}-${variant//:/-}-r$rep.err"
            pbytes="" pstall=""
            if [ "$PROMPT" -gt 1 ] && [ -f "$err" ]; then
                read -r pbytes pstall <<<"$(prompt_columns "$err")"
            fi
            f[10]=${pbytes:-} f[11]=${pstall:-}
            (IFS=,; echo "$budget,$variant,$rep,${f[*]}")
        done
    } <"$RUNS" >"$RUNS.new"
    mv "$RUNS.new" "$RUNS"
    FIO_AFTER=$(fio_of fio-after)
else
    # The limited variants' order turns by one each rep: what a run leaves behind (the host's cache of the model
    # file below this VM, the guest's free memory and its huge pages) falls on the run after it, and with a fixed
    # order on the same variant in every rep, where a paired ratio cannot tell it from the variant's own effect.
    limited=()
    for variant in "${VARIANT_LIST[@]}"; do
        [ "$variant" = ram ] || limited+=("$variant")
    done
    # The first run of a rep comes after the warm ram run, the others after a limited run that read the same
    # model: one configuration run twice in a row was the slower the first time in 10 of 12 reps (decode 0.77-0.99x
    # the second; its reads slower; Dec 5, bench/PIPELINE.md). Only a multiple of the variants' count puts each
    # first equally often.
    if [ "$REPS" -gt 1 ] && [ $((REPS % ${#limited[@]})) -ne 0 ]; then
        echo "side_by_side: warning: $REPS reps of ${#limited[@]} limited variants: some variant runs first in more reps" \
            "than the others, and the first run of a rep measured slower; give a multiple of ${#limited[@]}" >&2
    fi
    for rep in $(seq 1 "$REPS"); do
        if [ "$want_ram" = 1 ] && [ "$fits_in_ram" = 1 ]; then
            run 100 ram "$rep" # warm; every run after it drops the cache again and checks that it did
        fi
        for budget in $BUDGETS; do
            for ((i = 0; i < ${#limited[@]}; i++)); do
                run "$budget" "${limited[$(((i + rep - 1) % ${#limited[@]}))]}" "$rep"
            done
        done
        if [ "$RESIDENT" = 1 ]; then
            run 100 guanaco "$rep" # last, after a limited run like the others: not the slower first run of a rep
        fi
    done
    FIO_AFTER=$(measure_fio fio-after)
fi
FIO_GBPS=$(awk -v a="$FIO_BEFORE" -v b="$FIO_AFTER" 'BEGIN { print (a > b ? a : b) }')
echo "side_by_side: fio $FIO_BEFORE GB/s before the runs, $FIO_AFTER after: the report uses $FIO_GBPS"
# On a VM the host may cache the model file: a sample it served reads far above the disk (seen: 1.57 then 2.81,
# 1.89 then 10.2 GB/s), and so may the runs' own reads. The higher sample stays the bar; the report says so.
FIO_DOUBT=""
if awk -v a="$FIO_BEFORE" -v b="$FIO_AFTER" 'BEGIN { lo = a < b ? a : b; hi = a < b ? b : a; exit !(lo > 0 && hi > 1.5 * lo) }'; then
    FIO_DOUBT="; **the samples differ by more than 1.5x: a cache below the VM (the host's) likely served one of them and part of the runs' reads, so the disk-bound limits are uncertain**"
    echo "side_by_side: warning: fio samples differ by more than 1.5x; the report says the disk-bound limits are uncertain"
fi

# ---- the report ----
bash "$ROOT/bench/report.sh" --runs "$RUNS" --model "$MODEL" --out "$OUT" --fio-gbps "$FIO_GBPS" --tokens "$TOKENS" \
    --prompt "$PROMPT" --expert-bytes "$EXPERT_BYTES" --title "${TITLE:-$(basename "$MODEL")}" \
    --machine "$MACHINE" \
    --disk "$DEVICE, read-ahead $READAHEAD KiB; fio sampled $FIO_BEFORE GB/s before the runs and $FIO_AFTER after, the higher is used$FIO_DOUBT$DISK_TEXT_CAP" --margin-mib "$MARGIN_MIB" \
    --routing "$([ -n "$REPLAY" ] && echo "replayed $(basename "$REPLAY")" || echo "llama-bench synthetic (random weights)")" \
    ${COMPUTE_MS:+--compute-ms "$COMPUTE_MS"} --repack "$REPACK"
echo "side_by_side: report in $OUT/report.md"
