#!/usr/bin/env bash
# overhead.sh - owns the "everything resident" measurement: what Guanaco costs
# when it has nothing to read. Plain llama.cpp (its default: repacked where it
# repacks) with the model in the page cache against Guanaco with a 100% budget,
# after a prompt of --prompt tokens has made every expert the routing touches
# resident. Decode is measured with llama-bench -r REPS; the two alternate
# ROUNDS times in one invocation, so a slow minute of a shared machine lands on
# both. The verdict uses the paired ratio of each round (Guanaco over the plain
# run just before it): a 95% confidence interval for their median, from the
# order statistics alone, says whether 3% can be told apart (with 12 rounds or
# more one slow round does not decide it).
#
#   bench/overhead.sh --model M.gguf [--prompt 512] [--tokens 32] [--reps 1] [--rounds 12] [--threads N]
#                     [--load direct] [--prefetch none]
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN="$ROOT/build/cmake/bin"
MODEL="" PROMPT=512 TOKENS=32 REPS=1 ROUNDS=12 LOAD=direct THREADS="" PREFETCH=""
while [ $# -gt 0 ]; do
    case $1 in
    --model) MODEL=$2 ;; --prompt) PROMPT=$2 ;; --tokens) TOKENS=$2 ;; --reps) REPS=$2 ;; --rounds) ROUNDS=$2 ;;
    --load) LOAD=$2 ;; --threads) THREADS=$2 ;; --prefetch) PREFETCH=$2 ;;
    *) echo "overhead: unknown argument $1" >&2; exit 2 ;;
    esac
    shift 2
done
[ -f "$MODEL" ] || { echo "overhead: --model FILE is required" >&2; exit 2; }
case $ROUNDS in '' | *[!0-9]* | 0) echo "overhead: --rounds must be a positive integer" >&2; exit 2 ;; esac
common=(-m "$MODEL" -p "$PROMPT" -n "$TOKENS" -r "$REPS" -o csv ${THREADS:+-t "$THREADS"})
# the engine's own overhead: a budget this large alone would hand the experts to llama.cpp (--guanaco-when-fits)
guanaco=(--guanaco-streaming --guanaco-ram 100000G --guanaco-when-fits engine --guanaco-load "$LOAD"
    ${PREFETCH:+--guanaco-prefetch "$PREFETCH"})
tg_of() { awk -F'"?,"?' 'NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i }
    NR > 1 && $c["n_gen"] + 0 > 0 { gsub(/"/, "", $c["avg_ts"]); print $c["avg_ts"] }' "$1"; }
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
cat "$MODEL" >/dev/null # plain runs from a warm page cache
echo "model $(basename "$MODEL"), prompt $PROMPT, decode $TOKENS tokens x $REPS reps, $ROUNDS alternating rounds," \
    "threads ${THREADS:-llama-bench default}, guanaco: ${guanaco[*]}"
plain=() streamed=() ratios=()
for round in $(seq 1 "$ROUNDS"); do
    "$BIN/llama-bench" "${common[@]}" >"$scratch/plain.csv" 2>/dev/null
    plain+=("$(tg_of "$scratch/plain.csv")")
    "$BIN/llama-bench" "${common[@]}" "${guanaco[@]}" >"$scratch/guanaco.csv" 2>"$scratch/guanaco.err"
    streamed+=("$(tg_of "$scratch/guanaco.csv")")
    [ -n "${plain[-1]}" ] && [ -n "${streamed[-1]}" ] ||
        { echo "overhead: a run gave no decode rate; see $scratch" >&2; trap - EXIT; exit 1; }
    ratios+=("$(awk -v p="${plain[-1]}" -v g="${streamed[-1]}" 'BEGIN { printf "%.4f", g / p }')")
    # with every expert resident the engine stops reading the router's ids, so its counts stay at zero
    if grep -q 'every expert is resident and the budget keeps them all' "$scratch/guanaco.err"; then
        state="every expert resident, router ids no longer read"
    else
        state=$(grep -o 'resident [0-9.]*% of [0-9]* accesses' "$scratch/guanaco.err" | tail -1)
    fi
    echo "round $round: plain ${plain[-1]} tok/s, guanaco ${streamed[-1]} tok/s (x${ratios[-1]}); $state"
done
# median [min-max] of a list of numbers
summary() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END {
    m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2; printf "%.3f [%.3f-%.3f]", m, v[1], v[NR] }'; }
echo "decode tok/s, median [min-max] of $ROUNDS: plain $(summary "${plain[@]}"), guanaco (everything resident)" \
    "$(summary "${streamed[@]}")"
echo "paired ratio guanaco / plain, median [min-max]: $(summary "${ratios[@]}")"
# The verdict: a distribution-free confidence interval for the median paired ratio, [v(k), v(n+1-k)] of the sorted
# ratios with the largest k whose coverage 1 - 2 P(Binomial(n, 1/2) < k) is still >= 95% (with fewer than 6 rounds
# even min-max covers less, and no verdict is given). One slow round then cannot hide a clear answer, nor invent one.
printf '%s\n' "${ratios[@]}" | sort -g | awk '{ v[NR] = $1 } END {
    n = NR; m = n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
    term = 1                                  # term = C(n, k - 1) / 2^n, tail = P(Binomial(n, 1/2) < k)
    for (i = 0; i < n; i++) term /= 2
    k = 1; tail = term; coverage = 1 - 2 * tail
    while (k + 1 <= (n + 1) / 2) {
        next_term = term * (n - k + 1) / k    # C(n, k) / 2^n
        if (1 - 2 * (tail + next_term) < 0.95) break
        tail += next_term; term = next_term; k++; coverage = 1 - 2 * tail
    }
    lo = v[k]; hi = v[n + 1 - k]
    printf "median paired ratio %.3f, %.1f%% confidence interval [%.3f-%.3f] (ratios %d and %d of %d, sorted)\n",
        m, 100 * coverage, lo, hi, k, n + 1 - k, n
    printf "overhead (1 - median ratio): %+.1f%%; ", 100 * (1 - m)
    if (coverage < 0.95) print "under 6 rounds no interval reaches 95%: this run cannot tell"
    else if (lo >= 0.97) print "the interval lies above 0.97: the target (at most 3%) holds"
    else if (hi < 0.97) print "the interval lies below 0.97: the target is missed"
    else print "the interval straddles 0.97: this run cannot tell; more rounds narrow it" }'
