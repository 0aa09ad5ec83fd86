#!/usr/bin/env bash
# report.sh - owns turning side_by_side.sh's runs.csv into report.md and a
# gnuplot PNG: medians and spreads over reps, ratios against plain llama.cpp
# at the same budget, the physical limit, and the simulator's prediction of
# each Guanaco run from the routing that run recorded. Called by
# side_by_side.sh; can be rerun by hand on an existing runs.csv.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN="$ROOT/build/cmake/bin"
RUNS="" OUT="" FIO_GBPS="" TOKENS="" PROMPT=0 EXPERT_BYTES="" TITLE="" MACHINE="" DISK="" MARGIN_MIB="" ROUTING=""
COMPUTE_MS="" MODEL=""
while [ $# -gt 0 ]; do
    case $1 in
    --runs) RUNS=$2 ;; --out) OUT=$2 ;; --fio-gbps) FIO_GBPS=$2 ;; --tokens) TOKENS=$2 ;; --prompt) PROMPT=$2 ;;
    --expert-bytes) EXPERT_BYTES=$2 ;; --title) TITLE=$2 ;; --machine) MACHINE=$2 ;; --disk) DISK=$2 ;;
    --margin-mib) MARGIN_MIB=$2 ;; --routing) ROUTING=$2 ;; --compute-ms) COMPUTE_MS=$2 ;; --model) MODEL=$2 ;;
    *) echo "report: unknown argument $1" >&2; exit 2 ;;
    esac
    shift 2
done

# median and spread of one column for one (budget, variant): "median min max n"
stat_of() { # stat_of BUDGET VARIANT COLUMN
    awk -F, -v b="$1" -v v="$2" -v col="$3" 'NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next }
        $c["budget_pct"] == b && $c["variant"] == v && $c[col] != "" && $c["rc"] == 0 { x[n++] = $c[col] + 0 }
        END {
            if (!n) { print "- - - 0"; exit }
            for (i = 1; i < n; i++) for (j = i; j > 0 && x[j - 1] > x[j]; j--) { t = x[j]; x[j] = x[j - 1]; x[j - 1] = t }
            m = n % 2 ? x[int(n / 2)] : (x[n / 2 - 1] + x[n / 2]) / 2
            print m, x[0], x[n - 1], n
        }' "$RUNS"
}

# In-RAM compute time per token, unless given: the faster of the ram variant and plain llama.cpp at a 100%
# budget, which has prefetched the whole file at load and so decodes from RAM too.
COMPUTE_SOURCE="given"
if [ -z "$COMPUTE_MS" ]; then
    read -r ram_tg _ <<<"$(stat_of 100 ram tg_ts)"
    read -r full_tg _ <<<"$(stat_of 100 plain tg_ts)"
    best=$(awk -v a="$ram_tg" -v b="$full_tg" 'BEGIN { a = a == "-" ? 0 : a; b = b == "-" ? 0 : b; print (a > b ? a : b) }')
    [ "$best" != 0 ] && COMPUTE_MS=$(awk -v t="$best" 'BEGIN { printf "%.1f", 1000 / t }')
    COMPUTE_SOURCE="the faster of everything-in-RAM and plain llama.cpp at 100%"
fi
budgets=$(awk -F, 'NR > 1 && $2 != "ram" { print $1 }' "$RUNS" | sort -nu | tr '\n' ' ')
variants=$(awk -F, 'NR > 1 && $2 != "ram" { if (!seen[$2]++) print $2 }' "$RUNS" | tr '\n' ' ')
model=$MODEL

{
    echo "## $TITLE"
    echo
    echo "- machine: $MACHINE"
    echo "- disk: $DISK; fio randread 1 MiB, io_uring, QD16, O_DIRECT on the model file: **$FIO_GBPS GB/s**"
    echo "- routing: $ROUTING"
    echo "- limit per budget: non-expert bytes + budget + ${MARGIN_MIB} MiB (cgroup v1 memory.limit_in_bytes); page cache of the model dropped before every run"
    echo "- decode: llama-bench -n $TOKENS after its warmup token${PROMPT:+, prompt: -p $PROMPT}; -nr (no repacking) in every run"
    echo "- in-RAM compute per token: ${COMPUTE_MS:-unknown} ms ($COMPUTE_SOURCE)"
    echo "- reps per cell: $(awk -F, 'NR > 1 { print $3 }' "$RUNS" | sort -nu | tail -1); cells show the median and, with more than one rep, [min-max]"
    echo
    read -r ram_tg ram_min ram_max _ <<<"$(stat_of 100 ram tg_ts)"
    [ "$ram_tg" != "-" ] && echo "Everything in RAM, no limit: **$ram_tg tok/s** decode." && echo
    echo "| budget | variant | decode tok/s | x plain | prompt tok/s | TTFT s | disk read GB | peak GB | resident % | read GB/s | miss MB/token | physical limit tok/s | % of limit | simulated tok/s | sim error |"
    echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    for b in $budgets; do
        read -r plain_tg _ <<<"$(stat_of "$b" plain tg_ts)"
        for v in $variants; do
            read -r tg tmin tmax n <<<"$(stat_of "$b" "$v" tg_ts)"
            [ "$n" = 0 ] && { echo "| $b% | $v | failed | | | | | | | | | | | | |"; continue; }
            read -r pp _ <<<"$(stat_of "$b" "$v" pp_ts)"
            read -r rd _ <<<"$(stat_of "$b" "$v" read_bytes)"
            read -r peak _ <<<"$(stat_of "$b" "$v" max_usage)"
            read -r res _ <<<"$(stat_of "$b" "$v" resident_pct)"
            read -r gbps _ <<<"$(stat_of "$b" "$v" guanaco_gbps)"
            read -r miss _ <<<"$(stat_of "$b" "$v" miss_bytes_per_token)"
            spread=""
            [ "$n" -gt 1 ] && spread=" [$tmin-$tmax]"
            ratio=$(awk -v a="$tg" -v p="$plain_tg" 'BEGIN { if (p != "-" && p > 0) printf "%.2f", a / p; else print "-" }')
            ttft=$(awk -v pp="$pp" -v tg="$tg" -v np="$PROMPT" 'BEGIN { if (pp != "-" && np > 0) printf "%.2f", np / pp + 1 / tg; else print "-" }')
            limit="-" pct="-" sim="-" err="-"
            if [ "$miss" != "-" ] && [ -n "$COMPUTE_MS" ]; then
                limit=$(awk -v m="$miss" -v bw="$FIO_GBPS" -v c="$COMPUTE_MS" 'BEGIN { printf "%.2f", 1000 / (c + m / (bw * 1e9) * 1000) }')
                pct=$(awk -v t="$tg" -v l="$limit" 'BEGIN { printf "%.0f", 100 * t / l }')
            fi
            trace=$(ls "$OUT"/logs/b"$b"-"${v//:/-}"-r1.trace 2>/dev/null || true)
            if [ -n "$trace" ] && [ -n "$COMPUTE_MS" ] && [ -n "$model" ]; then
                policy=$(cut -d: -f2 <<<"$v:")
                sim=$("$BIN/guanaco-sim" --trace "$trace" --model "$model" --budgets "$b%" \
                    --policies "${policy:-layer-lru}" --preload --disk-gbps "$FIO_GBPS" --compute-ms "$COMPUTE_MS" 2>/dev/null |
                    awk -v p="${policy:-layer-lru}" '$1 == p { print $NF }' | head -1)
                [ -n "$sim" ] && err=$(awk -v s="$sim" -v t="$tg" 'BEGIN { printf "%+.0f%%", 100 * (s - t) / t }')
            fi
            printf '| %s%% | %s | %s%s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n' "$b" "$v" "$tg" \
                "$spread" "$ratio" "$pp" "$ttft" "$(awk -v x="$rd" 'BEGIN { if (x == "-") print "-"; else printf "%.1f", x / 1e9 }')" \
                "$(awk -v x="$peak" 'BEGIN { if (x == "-") print "-"; else printf "%.2f", x / 1e9 }')" "$res" "$gbps" \
                "$(awk -v x="$miss" 'BEGIN { if (x == "-") print "-"; else printf "%.0f", x / 1e6 }')" "$limit" "$pct" \
                "${sim:--}" "$err"
        done
    done
    echo
    echo "x plain: decode tok/s over plain llama.cpp's at the same budget and limit. resident %: Guanaco's accesses that"
    echo "needed no read, whole run. read GB/s: Guanaco's bytes read over the time its read batches took. miss MB/token:"
    echo "Guanaco's bytes read per decoded token (the measured tokens). physical limit: 1 / (miss bytes per token / fio"
    echo "bandwidth + in-RAM compute per token). simulated tok/s: guanaco-sim replaying the routing that run recorded"
    echo "(warmup included) with the same policy and budget, fio bandwidth and in-RAM compute; sim error: (simulated -"
    echo "live) / live."
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
