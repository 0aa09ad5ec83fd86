#!/usr/bin/env bash
# report.sh - owns turning side_by_side.sh's runs.csv into report.md and a
# gnuplot PNG: medians and [min-max] ranges over reps, ratios against plain
# llama.cpp at the same budget, the physical limit (overlapped, with the serial
# one beside it), compute under the engine, the prompt's physical limit, and
# the simulator's prediction of each Guanaco run from the routing that run
# recorded. Called by side_by_side.sh; can be rerun by hand on an existing
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
#   prompt limit        prompt tokens / max(prompt bytes / fio bandwidth, prompt tokens / warm ram prompt
#                       tok/s), from the cell's medians; '-' when the Guanaco run's prompt bytes (its status
#                       lines of the measured prompt) or a warm ram prompt rate is missing
#   % of prompt limit   prompt tok/s / prompt limit
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN="$ROOT/build/cmake/bin"
RUNS="" OUT="" FIO_GBPS="" TOKENS="" PROMPT=0 EXPERT_BYTES="" TITLE="" MACHINE="" DISK="" MARGIN_MIB="" ROUTING=""
REPACK=0
COMPUTE_MS="" MODEL=""
WARM_PCT=99    # a ram run counts as the warm reference only from this much of the model cached at its start
FLAG_RATIO=1.10 # outside stall above this multiple of warm compute is flagged
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
stat_of() { # stat_of BUDGET VARIANT COLUMN [warm]
    awk -F, -v b="$1" -v v="$2" -v col="$3" -v filter="${4:-}" -v warm="$WARM_PCT" '
        NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next }
        $c["budget_pct"] != b || $c["variant"] != v || $c["rc"] != 0 { next }
        filter == "warm" && (!("cached_pct" in c) || $c["cached_pct"] == "" || $c["cached_pct"] + 0 < warm) { next }
        col == "outside_ms" {
            if (!("stall_ms_per_token" in c) || $c["tg_ts"] == "" || $c["tg_ts"] + 0 <= 0 || $c["stall_ms_per_token"] == "") next
            x[n++] = 1000 / $c["tg_ts"] - $c["stall_ms_per_token"]; next
        }
        (col in c) && $c[col] != "" { x[n++] = $c[col] + 0 }
        END {
            if (!n) { print "- - - 0"; exit }
            for (i = 1; i < n; i++) for (j = i; j > 0 && x[j - 1] > x[j]; j--) { t = x[j]; x[j] = x[j - 1]; x[j - 1] = t }
            m = n % 2 ? x[int(n / 2)] : (x[n / 2 - 1] + x[n / 2]) / 2
            print m, x[0], x[n - 1], n
        }' "$RUNS"
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

# ---- the warm in-RAM reference ----
read -r ram_tg ram_tmin ram_tmax ram_n <<<"$(stat_of 100 ram tg_ts warm)"
read -r ram_pp ram_pmin ram_pmax ram_pn <<<"$(stat_of 100 ram pp_ts warm)"
read -r ram_rd _ <<<"$(stat_of 100 ram read_bytes warm)"
read -r _ ram_cmin ram_cmax ram_cn <<<"$(stat_of 100 ram cached_pct)"
ram_all=$(awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next } $c["variant"] == "ram" { n++ } END { print n + 0 }' "$RUNS")
if [ -n "$COMPUTE_MS" ]; then
    COMPUTE_SOURCE="given (--compute-ms)"
elif [ "$ram_n" != 0 ]; then
    COMPUTE_MS=$(awk -v t="$ram_tg" 'BEGIN { printf "%.1f", 1000 / t }')
    COMPUTE_SOURCE="1000 / the warm ram runs' median decode tok/s"
else
    COMPUTE_SOURCE="no warm ram run and no --compute-ms: no physical limit"
fi
budgets=$(awk -F, 'NR > 1 && $2 != "ram" { print $1 }' "$RUNS" | sort -nu | tr '\n' ' ')
variants=$(awk -F, 'NR > 1 && $2 != "ram" { if (!seen[$2]++) print $2 }' "$RUNS" | tr '\n' ' ')
guanaco_variants=$(tr ' ' '\n' <<<"$variants" | grep '^guanaco' | tr '\n' ' ' || true)
model=$MODEL
flags=""

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
    echo "- reps per cell: $(awk -F, 'NR > 1 { print $3 }' "$RUNS" | sort -nu | tail -1), variants alternating within each rep; cells show the median and, with more than one rep, [min-max]"
    echo
    if [ "$ram_n" != 0 ]; then
        echo "Everything in RAM, warm (the whole model read into the page cache first; $ram_cmin-$ram_cmax% of it cached"
        echo "at the start of the ram runs; $(fmt 1e9 2 "$ram_rd") GB read from disk, median), no binding limit: **$ram_tg tok/s**"
        echo "decode$(range_of 1 raw "$ram_tmin" "$ram_tmax" "$ram_n")$([ "$ram_pn" != 0 ] && echo ", $ram_pp tok/s prompt$(range_of 1 raw "$ram_pmin" "$ram_pmax" "$ram_pn")")."
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
            trace=$(ls "$OUT"/logs/b"$b"-"${v//:/-}"-r1.trace 2>/dev/null || true)
            if [ -n "$trace" ] && [ -n "$COMPUTE_MS" ] && [ -n "$model" ]; then
                policy=$(cut -d: -f2 <<<"${v%%+*}:")
                sim=$("$BIN/guanaco-sim" --trace "$trace" --model "$model" --budgets "$b%" \
                    --policies "${policy:-layer-lru}" --preload --disk-gbps "$FIO_GBPS" --compute-ms "$COMPUTE_MS" 2>/dev/null |
                    awk -v p="${policy:-layer-lru}" '$1 == p { print $NF }' | head -1 || true)
                [ -n "$sim" ] && err=$(awk -v s="$sim" -v t="$tg" 'BEGIN { printf "%+.0f%%", 100 * (s - t) / t }')
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
    echo "routing that run recorded (warmup included) with the same policy and budget, fio bandwidth and in-RAM"
    echo "compute; sim error: (simulated - live) / live."

    if [ -n "$guanaco_variants" ]; then
        echo
        echo "Compute under the engine, and the prompt (Guanaco runs):"
        echo
        echo "| budget | variant | stall ms/token | outside stall ms/token | x warm compute | prompt MB read | prompt stall ms/token | prompt tok/s | prompt limit tok/s | % of prompt limit |"
        echo "|---|---|---|---|---|---|---|---|---|---|"
        for b in $budgets; do
            for v in $guanaco_variants; do
                read -r _ _ _ n <<<"$(stat_of "$b" "$v" tg_ts)"
                [ "$n" = 0 ] && continue
                read -r stall smin smax sn <<<"$(stat_of "$b" "$v" stall_ms_per_token)"
                read -r out omin omax on <<<"$(stat_of "$b" "$v" outside_ms)"
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
                printf '| %s%% | %s | %s%s | %s%s | %s | %s | %s | %s%s | %s | %s |\n' "$b" "$v" \
                    "$stall" "$(range_of 1 raw "$smin" "$smax" "$sn")" "$(fmt 1 1 "$out")" "$(range_of 1 1 "$omin" "$omax" "$on")" \
                    "$xc" "$(fmt 1e6 0 "$pbytes")" "$pstall" "$pp" "$([ "$pp" != - ] && range_of 1 raw "$ppmin" "$ppmax" "$ppn")" \
                    "$plimit" "$ppct"
            done
        done
        echo
        echo "stall ms/token: the engine's time compute waited on residency, per measured decode token. outside stall:"
        echo "1000 / decode tok/s - stall, per run: the token's time not spent waiting (compute under the engine plus"
        echo "the engine's own work outside the stall). x warm compute: outside stall over warm in-RAM compute per"
        echo "token; \"!\" above ${FLAG_RATIO}x. prompt MB read: Guanaco's bytes read over the measured prompt's status lines"
        echo "(one per ubatch of 512; '-' unless they add up to exactly the prompt). prompt limit: prompt tokens /"
        echo "max(prompt bytes / fio bandwidth, prompt tokens / warm ram prompt tok/s); '-' without the prompt's bytes or"
        echo "a warm ram prompt rate."
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
