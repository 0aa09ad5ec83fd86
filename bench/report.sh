#!/usr/bin/env bash
# report.sh - owns turning side_by_side.sh's runs.csv into report.md and a
# gnuplot PNG: medians and [min-max] ranges over reps, ratios against plain
# llama.cpp at the same budget, the physical limit (overlapped, with the serial
# one beside it), compute under the engine, the prompt's physical limit, and
# the simulator's prediction of each Guanaco cell's decode and prompt from the
# routing its rep 1 recorded, with the disk rates the engine got in that cell
# (bench/SIMULATOR.md). Called by side_by_side.sh; can be rerun by hand on an existing
# runs.csv (a column an older runs.csv lacks shows as '-').
#
# Definitions (side_by_side.sh's header has the measured columns):
#   compute per token   warm in-RAM compute per decode token, ms: --compute-ms, else 1000 / the median
#                       decode tok/s of the `ram` runs that started warm (>= 99% of the model cached,
#                       runs.csv cached_pct). Without either, no limit is computed.
#   physical limit      OVERLAPPED: 1 / max(miss bytes per token / fio bandwidth, compute per token).
#                       A token can go no faster than its reads at fio bandwidth nor than its compute in
#                       RAM; with reads fully hidden under compute (or compute under reads) the longer of
#                       the two is the whole token. "bound" names that side: disk or compute.
#   serial limit        1 / (miss bytes per token / fio bandwidth + compute per token): reads and compute
#                       one after the other, the definition before pipelined residency; for comparison
#   % of limit          decode tok/s / the overlapped physical limit
#   outside stall       per decode token, 1000 / decode tok/s - stall ms per token, per run, then the median:
#                       the token's time not spent waiting on residency (compute under the engine plus the
#                       engine's own work outside the stall)
#   x warm compute      outside stall / compute per token; "!" where it is above 1.10
#   x warm, paired      per rep: outside stall / that rep's warm ram time per token, then the median [min-max]
#   prompt limit        prompt tokens / max(prompt bytes / fio bandwidth, prompt tokens / warm ram prompt
#                       tok/s), from the cell's medians; '-' when the Guanaco run's prompt bytes (its status
#                       lines of the measured prompt) or a warm ram prompt rate is missing
#   % of prompt limit   prompt tok/s / prompt limit
#   simulated tok/s     guanaco-sim replaying the routing the cell's rep 1 recorded (bench/SIMULATOR.md), as
#                       llama-bench ran it: --ubatches (a prompt ubatch is one pass), llama-bench's warmup
#                       prompt and token replayed but not timed, --preload, the cell's policy, prefetch
#                       (pilot by default, none for prefetch=none; prefetch=gate is not replayed: its guesses
#                       need the live activations), stream-prompts and overlap-layer. Inputs, each measured: compute per
#                       decode token (the default guanaco run at budget 100's time outside the stall, where the
#                       table has one that read nothing: compute under the engine; else warm compute, as above)
#                       and warm compute per prompt token (1000 / the warm ram prompt tok/s; without
#                       a warm ram prompt rate no prompt is simulated), the disk rate the engine got at its own
#                       request sizes (its status lines' GB read over read time, over the measured decode and
#                       the measured prompt of every rep of the cell; not fio's 1 MiB QD16 rate; fio's where
#                       page-cache layers overlap their reads, as the engine then times only their issue) and the
#                       kernel's CPU per GB of 4 KiB page-cache folios (READ_CPU_S_PER_GB, DROP_CPU_S_PER_GB,
#                       measured with /proc/stat, bench/PIPELINE.md) over the machine's cores. The policy is
#                       the one the engine's log names. A direct-loading cell is replayed with --load direct:
#                       no folio CPU, its copies' placing and eviction at the CPU-s per GB of the measured
#                       decode's status lines, its O_DIRECT reads' CPU (DIRECT_READ_CPU_S_PER_GB, measured
#                       with /proc/stat around fio) over the cores, and no --overlap-layer (its rate, timed
#                       over the matmuls' waits, already holds the layer's overlap).
#   sim error           (simulated - live) / live, against the median
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN="$ROOT/build/cmake/bin"
RUNS="" OUT="" FIO_GBPS="" TOKENS="" PROMPT=0 EXPERT_BYTES="" TITLE="" MACHINE="" DISK="" MARGIN_MIB="" ROUTING=""
REPACK=0
COMPUTE_MS="" MODEL=""
WARM_PCT=99    # a ram run counts as the warm reference only from this much of the model cached at its start
FLAG_RATIO=1.10 # outside stall above this multiple of warm compute is flagged
UBATCH=512     # side_by_side.sh's -ub: the prompt's status lines come one per ubatch
# Kernel CPU seconds per GB read into (WILLNEED + MADV_POPULATE_READ) and dropped from 4 KiB page-cache folios,
# measured on the bench machine with /proc/stat over 3 alternating rounds of 2 GiB (bench/PIPELINE.md, "Why: the
# kernel's cost per 4 KiB folio": 0.57-0.62 and 0.32-0.35 CPU-s per 2 GiB).
READ_CPU_S_PER_GB=0.28
DROP_CPU_S_PER_GB=0.16
# CPU seconds per GB an O_DIRECT read costs this VM (the virtio notify, the interrupt, the completion), measured with
# /proc/stat around fio alone, 1 MiB requests at queue depth 16, 3 rounds: 0.149-0.166
# (docs/bench/direct-read-cpu-dec6.sh, bench/SIMULATOR.md). Direct loading's io thread spends it while the layer's
# ready experts compute on the same 2 cores.
DIRECT_READ_CPU_S_PER_GB=0.16
# Seconds per GB compute takes for its first read of pages that page-cache loading mapped in 4 KiB pages: this VM's
# hypervisor fills a shadow page-table entry for each, with no fault the guest counts, and two threads took as long
# as one. guanaco-page-table-bench's "page cache, populated, first touch, 2 threads" row, 1632 KiB slices, 9 rounds
# quiet: 949-1158 ns per page, median 1090 (docs/bench/page-table-bench-populated-dec6.txt, bench/SIMULATOR.md).
# Direct loading's slots never change page tables.
FIRST_TOUCH_CPU_S_PER_GB=${FIRST_TOUCH_CPU_S_PER_GB:-0.27}
# shellcheck disable=SC2034 # --expert-bytes is accepted from side_by_side.sh; the tables do not need it
while [ $# -gt 0 ]; do
    case $1 in
    --runs) RUNS=$2 ;; --out) OUT=$2 ;; --fio-gbps) FIO_GBPS=$2 ;; --tokens) TOKENS=$2 ;; --prompt) PROMPT=$2 ;;
    --expert-bytes) EXPERT_BYTES=$2 ;; --title) TITLE=$2 ;; --machine) MACHINE=$2 ;; --disk) DISK=$2 ;;
    --margin-mib) MARGIN_MIB=$2 ;; --routing) ROUTING=$2 ;; --compute-ms) COMPUTE_MS=$2 ;; --model) MODEL=$2 ;;
    --repack) REPACK=$2 ;;
    *) echo "report: unknown argument $1" >&2; exit 2 ;;
    esac
    shift 2
done

# median and range of one column for one (budget, variant), over the runs that exited 0: "median min max n".
# COLUMN may be the derived outside_ms (1000 / tg_ts - stall_ms_per_token, per run). FILTER "warm" keeps only
# runs that started with >= WARM_PCT% of the model cached (none, in a runs.csv without cached_pct).
ran() { # ran BUDGET VARIANT: whether the table ran that cell at all (side_by_side's --resident runs one budget-100
    # cell beside the table's budgets)
    awk -F, -v b="$1" -v v="$2" 'NR > 1 && $1 == b && $2 == v { found = 1; exit } END { exit !found }' "$RUNS"
}
# summarize: numbers on stdin, one per line -> "median min max n", or "- - - 0" for none.
summarize() {
    awk '{ x[n++] = $1 + 0 }
        END {
            if (!n) { print "- - - 0"; exit }
            for (i = 1; i < n; i++) for (j = i; j > 0 && x[j - 1] > x[j]; j--) { t = x[j]; x[j] = x[j - 1]; x[j - 1] = t }
            m = n % 2 ? x[int(n / 2)] : (x[n / 2 - 1] + x[n / 2]) / 2
            print m, x[0], x[n - 1], n
        }'
}
stat_of() { # stat_of BUDGET VARIANT COLUMN [warm]
    awk -F, -v b="$1" -v v="$2" -v col="$3" -v filter="${4:-}" -v warm="$WARM_PCT" '
        NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next }
        $c["budget_pct"] != b || $c["variant"] != v || $c["rc"] != 0 { next }
        filter == "warm" && (!("cached_pct" in c) || $c["cached_pct"] == "" || $c["cached_pct"] + 0 < warm) { next }
        col == "outside_ms" {
            if (!("stall_ms_per_token" in c) || $c["tg_ts"] == "" || $c["tg_ts"] + 0 <= 0 || $c["stall_ms_per_token"] == "") next
            printf "%.17g\n", 1000 / $c["tg_ts"] - $c["stall_ms_per_token"]; next
        }
        (col in c) && $c[col] != "" { printf "%.17g\n", $c[col] + 0 }' "$RUNS" | summarize
}
# The time outside the stall over the warm ram run's time per token of the same rep, per rep: "median min max n".
# A rep's variants run back to back, so the machine's drift between reps (this VM's warm decode moved 1.4x within
# one table) divides out, as in bench/compute_parity.sh's paired ratios.
paired_outside() { # paired_outside BUDGET VARIANT
    awk -F, -v b="$1" -v v="$2" -v warm="$WARM_PCT" '
        NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next }
        $c["rc"] != 0 || $c["tg_ts"] == "" || $c["tg_ts"] + 0 <= 0 { next }
        $c["budget_pct"] == 100 && $c["variant"] == "ram" {
            if (("cached_pct" in c) && $c["cached_pct"] != "" && $c["cached_pct"] + 0 >= warm) ram[$c["rep"]] = 1000 / $c["tg_ts"]
            next }
        $c["budget_pct"] == b && $c["variant"] == v && ("stall_ms_per_token" in c) && $c["stall_ms_per_token"] != "" {
            out[$c["rep"]] = 1000 / $c["tg_ts"] - $c["stall_ms_per_token"] }
        END { for (r in out) if (r in ram) printf "%.17g\n", out[r] / ram[r] }' "$RUNS" | summarize
}
fmt() { # fmt SCALE DECIMALS VALUE: VALUE / SCALE, or '-'
    awk -v s="$1" -v d="$2" -v x="$3" 'BEGIN { if (x == "-" || x == "") print "-"; else printf "%." d "f", x / s }'
}
range_of() { # range_of SCALE DECIMALS MIN MAX N: " [min-max]" with more than one run; DECIMALS "raw": as recorded
    if [ "$5" -gt 1 ] && [ "$2" = raw ]; then
        echo " [$3-$4]"
    elif [ "$5" -gt 1 ]; then
        echo " [$(fmt "$1" "$2" "$3")-$(fmt "$1" "$2" "$4")]"
    fi
}

# The disk rate the engine got, per phase, over every rep of one cell, and direct loading's CPU per GB placed and
# evicted in the measured decode: "decode_gbps prompt_gbps map_s_per_gb evict_s_per_gb" ('-' where the status
# lines are missing or do not add up). llama-bench's order gives the lines by position: the warmup prompt's
# k = ceil(PROMPT / UBATCH) ubatches, the measured prompt's k, the decode warmup's one, the measured decode's
# TOKENS (older builds printed one line per multi-ubatch prompt: k = 1 is taken too). Each line says "N loads,
# X GiB read at Y GB/s": bytes over the time its read batches took (with direct loading's overlap, the time
# the matmuls waited for them), and "mapping M ... eviction V" ms per token with "E evictions"; an evicted
# copy is taken to be the size of a loaded one (X / N).
engine_rates() { # engine_rates BUDGET VARIANT
    local f
    for f in "$OUT"/logs/b"$1"-"${2//:/-}"-r*.err; do
        [ -f "$f" ] || continue
        grep -h 'guanaco: status at token' "$f" |
            awk -v p="${PROMPT:-0}" -v ub="$UBATCH" -v tg="$TOKENS" '
                function num(re,   x) { if (!match($0, re)) return -1; x = substr($0, RSTART, RLENGTH)
                                        gsub(/[^0-9.]/, "", x); return x + 0 }
                { n++; tok[n] = num(": [0-9]+ tokens"); loads[n] = num("[0-9]+ loads")
                  g[n] = num("[0-9.]+ GiB read"); r[n] = num("at [0-9.]+ GB/s"); m[n] = num("mapping [0-9.]+")
                  v[n] = num("eviction [0-9.]+"); e[n] = num("[0-9]+ evictions") }
                END { k = p > 0 ? int((p + ub - 1) / ub) : 0
                      if (n != 2 * k + 1 + tg && k > 1 && n == 3 + tg) k = 1
                      if (n != 2 * k + 1 + tg) exit
                      for (i = 1; i <= n; i++) if (g[i] > 0 && r[i] > 0) {
                          ph = i > k && i <= 2 * k ? "prompt" : i > 2 * k + 1 ? "decode" : "warmup"
                          b = g[i] * 1073741824
                          cost = ""
                          if (ph == "decode" && m[i] >= 0 && v[i] >= 0 && e[i] >= 0 && loads[i] > 0 && tok[i] > 0)
                              cost = sprintf(" %.6f %.6f %.0f", m[i] * tok[i] / 1000, v[i] * tok[i] / 1000, e[i] * b / loads[i])
                          print ph, b, b / (r[i] * 1e9) cost } }' || true
    done | awk '{ b[$1] += $2; t[$1] += $3; if (NF == 6) { ms += $4; vs += $5; vb += $6; mb += $2 } }
        END { d = t["decode"] > 0 ? sprintf("%.3f", b["decode"] / t["decode"] / 1e9) : "-"
              p = t["prompt"] > 0 ? sprintf("%.3f", b["prompt"] / t["prompt"] / 1e9) : "-"
              m = mb > 0 ? sprintf("%.4f", ms / mb * 1e9) : "-"
              v = vb > 0 ? sprintf("%.4f", vs / vb * 1e9) : "-"
              print d, p, m, v }'
}

# The load a Guanaco cell ran with (variant_load BUDGET VARIANT): what its first rep's engine said (auto, the
# default, chooses by the model), else the variant's third field or +load= setting, else page-cache.
variant_load() {
    local b=$1 v=$2 load
    load=$(grep -om1 'io [a-z_]*, load [a-z-]*' "$OUT/logs/b$b-${v//:/-}-r1.err" 2>/dev/null | sed 's/.* load //')
    if [ -z "$load" ]; then
        load=$(cut -d: -f3 <<<"${v%%+*}::")
        [[ $v =~ \+load=([a-z-]+)($|\+) ]] && load=${BASH_REMATCH[1]}
    fi
    echo "${load:-page-cache}"
}

# guanaco-sim's prediction for one Guanaco cell: "decode_tok_s prompt_tok_s decode_stall_ms" ('-' for what it
# cannot say), or
# "gate" for prefetch=gate, which a replay cannot guess as the engine does. DECODE_GBPS and PROMPT_GBPS are
# engine_rates' figures; PROMPT_MS the warm compute per prompt token or empty.
simulate_cell() { # simulate_cell BUDGET VARIANT DECODE_GBPS PROMPT_GBPS PROMPT_MS MAP_S_PER_GB EVICT_S_PER_GB
    local b=$1 v=$2 dgbps=$3 pgbps=$4 pms=$5 map=$6 evict=$7 trace policy predictor=pilot stream=on overlap=off
    local setting key value load
    # Direct loading overlaps a layer's reads with its compute (the engine's default with it), but its status lines
    # time the matmuls' waits, not the reads: the overlap is already in DECODE_GBPS, so the replay does not apply
    # it again. Its copies' placing and eviction are charged at the rates measured in the same lines.
    load=$(variant_load "$b" "$v")
    trace="$OUT/logs/b$b-${v//:/-}-r1.trace"
    [ -f "$trace" ] && [ -n "$SIM_COMPUTE_MS" ] && [ -n "$model" ] && [ "$dgbps" != - ] || { echo "- - -"; return; }
    # the policy the engine ran: what its first rep said, else the variant's field, else the default (guanaco)
    policy=$(grep -om1 'policy [a-z-]*, io ' "$OUT/logs/b$b-${v//:/-}-r1.err" 2>/dev/null | sed 's/policy \([a-z-]*\),.*/\1/' || true)
    [ -n "$policy" ] || policy=$(cut -d: -f2 <<<"${v%%+*}:")
    policy=${policy:-guanaco}
    IFS=+ read -ra settings <<<"${v#*+}"
    [ "$v" = "${v#*+}" ] && settings=()
    for setting in "${settings[@]}"; do
        key=${setting%%=*} value=${setting#*=}
        case $value in 0) value=off ;; 1) value=on ;; esac
        case $key in
        prefetch) predictor=$value ;;
        stream-prompts|stream_prompts) stream=$value ;;
        overlap-layer|overlap_layer) [ "$load" = direct ] || overlap=$value ;;
        *) echo "- - -"; return ;; # a setting the replay does not model
        esac
    done
    [ "$predictor" = gate ] && { echo "gate"; return; }
    local args=(--trace "$trace" --model "$model" --budgets "$b%" --policies "$policy" --preload
        --ubatches --disk-gbps "$dgbps" --compute-ms "$SIM_COMPUTE_MS" --stream-prompts "$stream"
        --overlap-layer "$overlap"
        --read-cpu-s-per-gb "$READ_CPU_S_PER_GB" --drop-cpu-s-per-gb "$DROP_CPU_S_PER_GB" --cpu-cores "$CORES"
        --load "$load" --threads 1)
    [ "$load" = direct ] && [ "$map" != - ] && args+=(--map-cpu-s-per-gb "$map")
    [ "$load" = direct ] && [ "$evict" != - ] && args+=(--evict-cpu-s-per-gb "$evict")
    [ "$load" = direct ] && args+=(--direct-read-cpu-s-per-gb "$DIRECT_READ_CPU_S_PER_GB")
    [ "$load" = direct ] || args+=(--first-touch-cpu-s-per-gb "$FIRST_TOUCH_CPU_S_PER_GB")
    [ "$predictor" != none ] && args+=(--predictor "$predictor")
    [ "$pgbps" != - ] && args+=(--prompt-disk-gbps "$pgbps")
    [ -n "$pms" ] && args+=(--prompt-compute-ms "$pms")
    # llama-bench's warmup: one decode token, and a whole prompt (k ubatches), each its own sequence in the trace
    local k=$(((${PROMPT:-0} + UBATCH - 1) / UBATCH)) tmp decode="-" prompt="-" stall="-"
    tmp=$(mktemp)
    if "$BIN/guanaco-sim" "${args[@]}" --warmup 1 --csv "$tmp" >/dev/null 2>&1; then
        decode=$(csv_field "$tmp" "$policy" decode_overlap_tokens_per_second)
        stall=$(csv_field "$tmp" "$policy" decode_stall_ms_per_token)
        [ "$k" = 1 ] && prompt=$(csv_field "$tmp" "$policy" prompt_overlap_tokens_per_second)
    fi
    if [ "$k" -gt 1 ] && "$BIN/guanaco-sim" "${args[@]}" --warmup "$k" --csv "$tmp" >/dev/null 2>&1; then
        prompt=$(csv_field "$tmp" "$policy" prompt_overlap_tokens_per_second)
    fi
    rm -f "$tmp"
    [ -z "$pms" ] && prompt="-"
    echo "${decode:--} ${prompt:--} ${stall:--}"
}
csv_field() { # csv_field CSV POLICY COLUMN: that column of the policy's row, '-' when absent or n/a
    awk -F, -v p="$2" -v col="$3" 'NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next }
        $1 == p && (col in c) { x = $c[col]; print (x == "" || x == "n/a" || x == "nan") ? "-" : x; exit }' "$1"
}
sim_error() { # sim_error SIMULATED LIVE: "+12%" or '-'
    awk -v s="$1" -v t="$2" 'BEGIN { if (s == "-" || t == "-" || t + 0 <= 0) print "-"; else printf "%+.0f%%", 100 * (s - t) / t }'
}

# ---- the warm in-RAM reference ----
read -r ram_tg ram_tmin ram_tmax ram_n <<<"$(stat_of 100 ram tg_ts warm)"
read -r ram_pp ram_pmin ram_pmax ram_pn <<<"$(stat_of 100 ram pp_ts warm)"
read -r ram_rd _ <<<"$(stat_of 100 ram read_bytes warm)"
read -r _ ram_cmin ram_cmax ram_cn <<<"$(stat_of 100 ram cached_pct)"
read -r _ ram_pmd_lo ram_pmd_hi ram_pmdn <<<"$(stat_of 100 ram pmd_mapped_bytes warm)"
ram_all=$(awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next } $c["variant"] == "ram" { n++ } END { print n + 0 }' "$RUNS")
if [ -n "$COMPUTE_MS" ]; then
    COMPUTE_SOURCE="given (--compute-ms)"
elif [ "$ram_n" != 0 ]; then
    COMPUTE_MS=$(awk -v t="$ram_tg" 'BEGIN { printf "%.1f", 1000 / t }')
    COMPUTE_SOURCE="1000 / the warm ram runs' median decode tok/s"
else
    COMPUTE_SOURCE="no warm ram run and no --compute-ms: no physical limit"
fi
# The replay's decode compute. Where the table has the default Guanaco run with every expert resident (budget 100,
# nothing read while decoding), its time outside the stall is compute under the engine measured directly, in the
# same run: the replay takes that and adds its own stall. Otherwise warm in-RAM compute stands in for it. That
# cell reads nothing, so it is not one of the cells the replay is judged on.
SIM_COMPUTE_MS=$COMPUTE_MS SIM_COMPUTE_SOURCE="warm in-RAM compute, as above" RESIDENT_REFERENCE=0
read -r resident_out _ _ resident_n <<<"$(stat_of 100 guanaco outside_ms)"
read -r resident_miss _ <<<"$(stat_of 100 guanaco miss_bytes_per_token)"
if [ "$resident_n" != 0 ] && [ "$resident_miss" != - ] &&
    awk -v m="$resident_miss" 'BEGIN { exit !(m < 1048576) }'; then
    SIM_COMPUTE_MS=$(awk -v o="$resident_out" 'BEGIN { printf "%.1f", o }')
    SIM_COMPUTE_SOURCE="the 100% guanaco run's time outside the stall: every expert resident, nothing read"
    RESIDENT_REFERENCE=1
fi
budgets=$(awk -F, 'NR > 1 && $2 != "ram" { print $1 }' "$RUNS" | sort -nu | tr '\n' ' ')
variants=$(awk -F, 'NR > 1 && $2 != "ram" { if (!seen[$2]++) print $2 }' "$RUNS" | tr '\n' ' ')
guanaco_variants=$(tr ' ' '\n' <<<"$variants" | grep '^guanaco' | tr '\n' ' ' || true)
model=$MODEL
flags=""
CORES=$(sed -n 's/^\([0-9][0-9]*\) CPUs.*/\1/p' <<<"$MACHINE")
CORES=${CORES:-$(nproc)}
PROMPT_MS="" PROMPT_MS_SOURCE="1000 / the warm ram runs' median prompt tok/s"
[ "$ram_pn" != 0 ] && [ "${PROMPT:-0}" -gt 0 ] && PROMPT_MS=$(awk -v r="$ram_pp" 'BEGIN { printf "%.2f", 1000 / r }')
# The same for a prompt token: the resident run's prompt time outside its stall, where it has one.
if [ "$RESIDENT_REFERENCE" = 1 ] && [ "${PROMPT:-0}" -gt 0 ]; then
    read -r resident_pp _ _ resident_ppn <<<"$(stat_of 100 guanaco pp_ts)"
    read -r resident_pstall _ <<<"$(stat_of 100 guanaco prompt_stall_ms_per_token)"
    if [ "$resident_ppn" != 0 ]; then
        PROMPT_MS=$(awk -v r="$resident_pp" -v s="$resident_pstall" 'BEGIN { printf "%.2f", 1000 / r - (s == "-" ? 0 : s) }')
        PROMPT_MS_SOURCE="the 100% guanaco run's prompt time outside its stall"
    fi
fi
# guanaco-sim per Guanaco cell, once: SIM[b/v] = "decode prompt", RATES[b/v] = "decode_gbps prompt_gbps"
declare -A SIM RATES
for b in $budgets; do
    for v in $guanaco_variants; do
        ran "$b" "$v" || continue
        RATES[$b/$v]=$(engine_rates "$b" "$v")
        read -r dg pg mapc evictc <<<"${RATES[$b/$v]}"
        # With --guanaco-overlap-layer on (page-cache loading) a call only issues its reads and the matmuls
        # wait for them, so the engine's rate is the issue rate: the replay gets fio's instead.
        if [ "$(variant_load "$b" "$v")" != direct ] && [[ $v =~ \+overlap-layer=(1|on)($|\+) ]]; then
            dg=$FIO_GBPS pg=$FIO_GBPS
        fi
        SIM[$b/$v]=$(simulate_cell "$b" "$v" "$dg" "$pg" "$PROMPT_MS" "${mapc:--}" "${evictc:--}")
    done
done

{
    echo "## $TITLE"
    echo
    echo "- machine: $MACHINE"
    echo "- disk: $DISK; fio randread 1 MiB, io_uring, QD16, O_DIRECT on the model file: **$FIO_GBPS GB/s**"
    echo "- routing: $ROUTING"
    echo "- limit per budget: non-expert bytes + budget + ${MARGIN_MIB} MiB (cgroup v1 memory.limit_in_bytes); page cache of the model dropped before every limited run, checked cold (<= 1% cached)"
    echo "- decode: llama-bench -n $TOKENS after its warmup token$([ "${PROMPT:-0}" -gt 0 ] && echo ", prompt: -p $PROMPT -ub 512 after its warmup prompt"); $(
        [ "$REPACK" = 1 ] && echo "repacking as users run it in the ram and guanaco runs (plain llama.cpp's default; Guanaco's --guanaco-repack), -nr in the others" ||
        echo "-nr (no repacking) in every run")"
    echo "- warm in-RAM compute per token: ${COMPUTE_MS:-unknown} ms ($COMPUTE_SOURCE)"
    [ -n "$SIM_COMPUTE_MS" ] && echo "- the simulator's decode compute per token: $SIM_COMPUTE_MS ms ($SIM_COMPUTE_SOURCE)"
    echo "- reps per cell: $(awk -F, 'NR > 1 { print $3 }' "$RUNS" | sort -nu | tail -1), variants alternating within each rep, their order turned by one each rep; cells show the median and, with more than one rep, [min-max]"
    echo
    if [ "$ram_n" != 0 ]; then
        echo "Everything in RAM, warm (the whole model read into the page cache first; $ram_cmin-$ram_cmax% of it cached"
        echo "at the start of the ram runs; $(fmt 1e9 2 "$ram_rd") GB read from disk, median), no binding limit: **$ram_tg tok/s**"
        echo "decode$(range_of 1 raw "$ram_tmin" "$ram_tmax" "$ram_n")$([ "$ram_pn" != 0 ] && echo ", $ram_pp tok/s prompt$(range_of 1 raw "$ram_pmin" "$ram_pmax" "$ram_pn")")."
        if [ "$ram_pmdn" != 0 ]; then
            echo "The warm runs mapped $(fmt 1e9 2 "$ram_pmd_lo")-$(fmt 1e9 2 "$ram_pmd_hi") GB of the model in 2 MiB pages at their peak"
            echo "(FilePmdMapped$([ -f "$MODEL" ] && echo ", of $(fmt 1e9 2 "$(stat -L -c %s "$MODEL")") GB")). Recorded because two warm runs of the same decode"
            echo "differed 1.47x with 16 and 0.28 GB so mapped (bench/PIPELINE.md); Guanaco's fixed slots (direct loading) are advised for"
            echo "2 MiB pages (src/slot_pool.h)."
        fi
        echo
    fi
    if [ "$ram_all" -gt "$ram_n" ]; then
        if [ "$ram_cn" = 0 ]; then
            echo "**The $ram_all ram run(s) have no record of a warm start** (a runs.csv from before the warm reference,"
            echo "when ram ran from a dropped cache): they are not used as the in-RAM reference."
        else
            echo "**$((ram_all - ram_n)) of $ram_all ram run(s) did not start warm or failed** (cached at start: $ram_cmin-$ram_cmax%):"
            echo "they are left out of the in-RAM reference."
        fi
        echo
    fi
    echo "| budget | variant | decode tok/s | x plain | prompt tok/s | TTFT s | disk read GB | peak GB | resident % | read GB/s | miss MB/token | physical limit tok/s | bound | serial limit tok/s | % of limit | simulated tok/s | sim error |"
    echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    for b in $budgets; do
        read -r plain_tg _ <<<"$(stat_of "$b" plain tg_ts)"
        for v in $variants; do
            ran "$b" "$v" || continue
            read -r tg tmin tmax n <<<"$(stat_of "$b" "$v" tg_ts)"
            [ "$n" = 0 ] && { echo "| $b% | $v | failed | | | | | | | | | | | | | | |"; continue; }
            read -r pp _ <<<"$(stat_of "$b" "$v" pp_ts)"
            read -r rd _ <<<"$(stat_of "$b" "$v" read_bytes)"
            read -r peak _ <<<"$(stat_of "$b" "$v" max_usage)"
            read -r res _ <<<"$(stat_of "$b" "$v" resident_pct)"
            read -r gbps _ <<<"$(stat_of "$b" "$v" guanaco_gbps)"
            read -r miss _ <<<"$(stat_of "$b" "$v" miss_bytes_per_token)"
            ratio=$(awk -v a="$tg" -v p="$plain_tg" 'BEGIN { if (p != "-" && p > 0) printf "%.2f", a / p; else print "-" }')
            ttft=$(awk -v pp="$pp" -v tg="$tg" -v np="$PROMPT" 'BEGIN { if (pp != "-" && np > 0) printf "%.2f", np / pp + 1 / tg; else print "-" }')
            limit="-" bound="-" serial="-" pct="-" sim="-" err="-"
            if [ "$miss" != "-" ] && [ -n "$COMPUTE_MS" ]; then
                read -r limit bound serial pct <<<"$(awk -v m="$miss" -v bw="$FIO_GBPS" -v c="$COMPUTE_MS" -v t="$tg" 'BEGIN {
                    d = m / (bw * 1e9) * 1000                      # ms of reads per token at fio bandwidth
                    l = 1000 / (d > c ? d : c)
                    printf "%.2f %s %.2f %.0f\n", l, (d > c ? "disk" : "compute"), 1000 / (d + c), 100 * t / l }')"
            fi
            if [ -n "${SIM[$b/$v]:-}" ]; then
                read -r sim _ <<<"${SIM[$b/$v]}"
                if [ "$sim" = gate ]; then
                    sim="- (gate)"
                else
                    err=$(sim_error "$sim" "$tg")
                    sim=$(fmt 1 2 "$sim")
                fi
            fi
            printf '| %s%% | %s | %s%s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n' "$b" "$v" "$tg" \
                "$(range_of 1 raw "$tmin" "$tmax" "$n")" "$ratio" "$pp" "$ttft" "$(fmt 1e9 1 "$rd")" "$(fmt 1e9 2 "$peak")" "$res" "$gbps" \
                "$(fmt 1e6 0 "$miss")" "$limit" "$bound" "$serial" "$pct" "${sim:--}" "$err"
        done
    done
    echo
    echo "x plain: decode tok/s over plain llama.cpp's at the same budget and limit. resident %: Guanaco's accesses that"
    echo "needed no read, whole run. read GB/s: Guanaco's bytes read over the time its read batches took. miss MB/token:"
    echo "Guanaco's bytes read per decoded token (the measured tokens). physical limit: 1 / max(miss bytes per token /"
    echo "fio bandwidth, warm in-RAM compute per token), reads and compute overlapped; bound: the longer of the two."
    echo "serial limit: 1 / (miss bytes per token / fio bandwidth + warm in-RAM compute per token), for comparison."
    echo "% of limit: decode tok/s over the (overlapped) physical limit. simulated tok/s: guanaco-sim replaying the"
    echo "routing rep 1 recorded, as llama-bench ran it (ubatches, warmup replayed untimed, preload, the cell's"
    echo "policy, prefetch, stream-prompts and overlap-layer; prefetch=gate is not replayed: its guesses need live activations),"
    echo "with the simulator's decode compute above (warm in-RAM unless a 100% guanaco run measured it), the disk rate the engine got in the cell's measured decode and prompt (next"
    echo "table; not fio, except with page-cache loading and --guanaco-overlap-layer on, where the engine times only"
    echo "the reads' issue and fio is used) and the kernel's CPU per GB of 4 KiB folios ($READ_CPU_S_PER_GB s read, $DROP_CPU_S_PER_GB s drop,"
    echo "$CORES cores); with direct loading, whose status lines time the matmuls' waits (the layer's overlap is in"
    echo "that rate, so the replay does not apply it again), no folio CPU but the copies' placing and eviction at the"
    echo "CPU-s per GB the same lines give (next table), and the O_DIRECT reads' own CPU ($DIRECT_READ_CPU_S_PER_GB s per GB, over the"
    echo "cores, taken from compute); sim error: (simulated - live) / live. bench/SIMULATOR.md has the model and its record."

    if [ -n "$guanaco_variants" ]; then
        echo
        echo "Compute under the engine, and the prompt (Guanaco runs):"
        echo
        echo "| budget | variant | stall ms/token | simulated stall ms/token | outside stall ms/token | x warm compute | x warm, paired per rep | prompt MB read | prompt stall ms/token | prompt tok/s | prompt limit tok/s | % of prompt limit | engine GB/s decode / prompt | direct map / evict CPU-s per GB | simulated prompt tok/s | prompt sim error |"
        echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
        for b in $budgets; do
            for v in $guanaco_variants; do
                read -r _ _ _ n <<<"$(stat_of "$b" "$v" tg_ts)"
                [ "$n" = 0 ] && continue
                read -r stall smin smax sn <<<"$(stat_of "$b" "$v" stall_ms_per_token)"
                read -r out omin omax on <<<"$(stat_of "$b" "$v" outside_ms)"
                read -r xp xpmin xpmax xpn <<<"$(paired_outside "$b" "$v")"
                read -r pbytes _ <<<"$(stat_of "$b" "$v" prompt_read_bytes)"
                read -r pstall _ <<<"$(stat_of "$b" "$v" prompt_stall_ms_per_token)"
                read -r pp ppmin ppmax ppn <<<"$(stat_of "$b" "$v" pp_ts)"
                xc="-" plimit="-" ppct="-"
                if [ "$out" != "-" ] && [ -n "$COMPUTE_MS" ]; then
                    xc=$(awk -v o="$out" -v c="$COMPUTE_MS" -v f="$FLAG_RATIO" 'BEGIN { printf "%.2f%s", o / c, (o / c > f ? " !" : "") }')
                    [[ $xc == *'!' ]] && flags+="${flags:+; }$b% $v: ${xc% !}x"
                fi
                if [ "$pbytes" != "-" ] && [ "$ram_pn" != 0 ] && [ "${PROMPT:-0}" -gt 0 ]; then
                    read -r plimit ppct <<<"$(awk -v p="$PROMPT" -v by="$pbytes" -v bw="$FIO_GBPS" -v r="$ram_pp" -v t="$pp" 'BEGIN {
                        d = by / (bw * 1e9); c = p / r                 # seconds: the prompt read at fio, computed warm
                        l = p / (d > c ? d : c)
                        printf "%.2f %s\n", l, (t == "-" ? "-" : sprintf("%.0f", 100 * t / l)) }')"
                fi
                read -r dg pg mapc evictc <<<"${RATES[$b/$v]:-- - - -}"
                [ "$(variant_load "$b" "$v")" = direct ] || mapc=- evictc=-
                read -r _ psim sstall <<<"${SIM[$b/$v]:-- - -}"
                [ "${SIM[$b/$v]:-}" = gate ] && psim="- (gate)"
                [ -n "${sstall:-}" ] && [ "$sstall" != - ] && sstall=$(fmt 1 1 "$sstall")
                perr=$(sim_error "${psim%% *}" "$pp")
                [ "${psim%% *}" != - ] && psim=$(fmt 1 2 "$psim")
                printf '| %s%% | %s | %s%s | %s | %s%s | %s | %s%s | %s | %s | %s%s | %s | %s | %s / %s | %s / %s | %s | %s |\n' "$b" "$v" \
                    "$stall" "$(range_of 1 raw "$smin" "$smax" "$sn")" "${sstall:--}" "$(fmt 1 1 "$out")" "$(range_of 1 1 "$omin" "$omax" "$on")" \
                    "$xc" "$(fmt 1 2 "$xp")" "$(range_of 1 2 "$xpmin" "$xpmax" "$xpn")" "$(fmt 1e6 0 "$pbytes")" "$pstall" "$pp" "$([ "$pp" != - ] && range_of 1 raw "$ppmin" "$ppmax" "$ppn")" \
                    "$plimit" "$ppct" "$dg" "$pg" "${mapc:--}" "${evictc:--}" "${psim:--}" "$perr"
            done
        done
        echo
        echo "stall ms/token: the engine's time compute waited on residency, per measured decode token. simulated stall:"
        echo "the replay's (above) decode stall per token, which it adds to warm compute; the difference between"
        echo "its tok/s and the live one is this stall's error plus compute under the engine's excess. outside stall:"
        echo "1000 / decode tok/s - stall, per run: the token's time not spent waiting (compute under the engine plus"
        echo "the engine's own work outside the stall). x warm compute: outside stall over warm in-RAM compute per"
        echo "token; \"!\" above ${FLAG_RATIO}x. x warm, paired per rep: each rep's outside stall over the same rep's warm ram"
        echo "time per token, median [min-max] (drift between reps divides out). prompt MB read: Guanaco's bytes read over the measured prompt's status lines"
        echo "(one per ubatch of 512; '-' unless they add up to exactly the prompt). prompt limit: prompt tokens /"
        echo "max(prompt bytes / fio bandwidth, prompt tokens / warm ram prompt tok/s); '-' without the prompt's bytes or"
        echo "a warm ram prompt rate. engine GB/s: bytes over read time in the status lines of the measured decode and"
        echo "the measured prompt, all reps; the simulator's disk rates. direct map / evict: direct loading's mapping and"
        echo "eviction ms over the bytes loaded and evicted, in the measured decode's status lines (the simulator's rates)."
        echo "simulated prompt tok/s: the same replay's"
        echo "measured prompt, with $([ -n "$PROMPT_MS" ] && echo "$PROMPT_MS ms of compute per prompt token ($PROMPT_MS_SOURCE)" || echo "no prompt compute here: not simulated")."
        if [ -n "$flags" ]; then
            echo
            echo "**! Outside the stall exceeds warm in-RAM compute by more than $(awk -v f="$FLAG_RATIO" 'BEGIN { printf "%.0f", 100 * (f - 1) }')%:** $flags."
            echo "Compute under the engine is slower than warm compute there (or the engine works outside its stall);"
            echo "overlapping reads with compute cannot recover that time."
        fi
    fi
} >"$OUT/report.md"

# tok/s against budget, one line per variant
plot_data="$OUT/plot.dat"
: >"$plot_data"
for v in $variants; do
    echo "\"$v\"" >>"$plot_data"
    for b in $budgets; do
        read -r tg _ <<<"$(stat_of "$b" "$v" tg_ts)"
        [ "$tg" != "-" ] && echo "$b $tg" >>"$plot_data"
    done
    printf '\n\n' >>"$plot_data"
done
if command -v gnuplot >/dev/null; then
    gnuplot <<EOF || echo "report: gnuplot failed; the table is still in report.md" >&2
set terminal pngcairo size 900,560 noenhanced
set output "$OUT/decode.png"
set title "$TITLE: decode tok/s against the expert budget (same cgroup limit per budget)"
set xlabel "budget, % of expert bytes (limit = non-expert + budget + $MARGIN_MIB MiB)"
set ylabel "decode tokens/s"
set key top left
set grid
plot for [i=0:$(($(wc -w <<<"$variants") - 1))] "$plot_data" index i using 1:2 with linespoints title columnheader(1)
EOF
fi
