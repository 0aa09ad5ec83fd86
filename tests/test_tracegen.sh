#!/usr/bin/env bash
# test_tracegen.sh - owns the check of guanaco-tracegen, the synthetic routing
# trace generator: a seed reproduces a trace byte for byte and another seed
# changes it, every record names top_k distinct experts, a generated trace
# loads and replays in guanaco-sim, each knob moves the statistic it is meant
# to move, each preset's measured statistics stay within stated tolerances of
# its targets (and its replayed LRU hit rates near the published or recorded
# ones), and bad flags fail with a message.
# Env: TRACEGEN, SIM, WORKDIR; TRACE_CONVERT and SHARED_DIR for the Mixtral checks.
set -u
: "${TRACEGEN:?}" "${SIM:?}" "${WORKDIR:?}"
W="$WORKDIR/tracegen"
rm -rf "$W" && mkdir -p "$W"
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# statistic KEY OUTPUT: the measured value of one statistic line of --stats / --measure
statistic() { echo "$2" | awk -v k="$1" '$1 == k { print $2; exit }'; }
# within VALUE TARGET TOLERANCE: exit 0 when |value - target| <= tolerance
within() { awk -v v="$1" -v t="$2" -v d="$3" 'BEGIN { exit !(v != "" && v - t <= d && t - v <= d) }'; }

# --- determinism ------------------------------------------------------------------------------------
for seed in 7 7 8; do
    "$TRACEGEN" --preset qwen3-30b-a3b --tokens 48 --seed "$seed" -o "$W/seed$seed-$RANDOM.trace" >/dev/null 2>&1
done
set -- "$W"/seed7-*.trace
[ $# -eq 2 ] && cmp -s "$1" "$2"
check "same seed gives identical bytes" $? "$(ls -l "$W"/seed7-*.trace 2>&1)"
! cmp -s "$1" "$W"/seed8-*.trace
check "another seed gives different bytes" $? "seed 7 and 8 files are identical"
size=$(stat -c %s "$1" 2>/dev/null)
[ "$size" -eq $((120 + 4 * 48 * 48 * 60)) ]
check "file size is the header plus 4 x 48 tokens x 48 layers x 60-byte records" $? "$size bytes"

# --- distinct ids per record, read straight from the file format (docs/TRACE.md) ---------------------
# distinct_ids FILE TOP_K N_EXPERT: prints the first bad record, nothing when every record is good
distinct_ids() {
    local k=$2 record_u16=$(( (12 + 4 * (($2 + 1) / 2) + 4 * $2) / 2 ))
    od -A n -t u2 -v -j 120 -w$((record_u16 * 2)) "$1" | awk -v k="$k" -v n="$3" '
        { delete seen; for (i = 7; i < 7 + k; i++) { id = $i
              if (id >= n || (id in seen)) { print "record " NR - 1 ": " $0; exit } seen[id] = 1 } }'
}
"$TRACEGEN" --preset qwen3-30b-a3b --tokens 64 -o "$W/qwen.trace" >"$W/qwen.log" 2>&1
check "qwen3 preset trace written" $? "$(cat "$W/qwen.log")"
bad=$(distinct_ids "$W/qwen.trace" 8 128)
[ -z "$bad" ] && [ -s "$W/qwen.trace" ]
check "qwen3 preset: 8 distinct ids below 128 in every record" $? "$bad"
# top_k == n_expert with a steep skew leaves no choice but every expert: the draw must still end
timeout 20 "$TRACEGEN" --n-layer 3 --n-expert 6 --top-k 6 --zipf 12 --reuse 0.5 --cross-layer 0.5 --tokens 50 \
    -o "$W/full.trace" >"$W/full.log" 2>&1
check "top-k = n-expert with zipf 12 finishes" $? "$(cat "$W/full.log")"
bad=$(distinct_ids "$W/full.trace" 6 6)
[ -z "$bad" ]
check "top-k = n-expert: each record names all 6 experts once" $? "$bad"
"$TRACEGEN" --n-layer 5 --n-expert 16 --top-k 3 --zipf 1 --reuse 0.6 --cross-layer 0.6 --topic-every 7 \
    --tokens 40 -o "$W/odd.trace" >/dev/null 2>&1
bad=$(distinct_ids "$W/odd.trace" 3 16)
[ -z "$bad" ] && [ "$(stat -c %s "$W/odd.trace")" -eq $((120 + 40 * 5 * 32)) ]
check "odd top-3 (padded records): distinct ids, 32-byte records" $? "$bad"

# --- it loads and replays --------------------------------------------------------------------------
out=$("$SIM" --trace "$W/qwen.trace" --shape qwen3-30b-a3b --budgets 25%,100% --policies layer-lru 2>&1)
status=$?
[ "$status" -eq 0 ] && echo "$out" | grep -qE "^traces .*4 sequences, 256 tokens, 12288 records"
check "guanaco-sim replays it: 4 sequences, 256 tokens, 12288 records" $? "status $status: $out"
measured=$("$TRACEGEN" --measure "$W/qwen.trace" 2>&1)
echo "$measured" | grep -qE "^routing +12288 records, 4 sequences, 256 token positions"
check "--measure loads it back" $? "$measured"
seqs=$("$TRACEGEN" --shape mixtral-8x7b --sequences 3 --tokens 10 --stats 2>&1)
echo "$seqs" | grep -qE "^routing +960 records, 3 sequences, 30 token positions"
check "--sequences 3 --tokens 10: 3 sequences of 10 positions over 32 layers" $? "$seqs"

# --- each knob moves its statistic ------------------------------------------------------------------
base="--shape qwen3-30b-a3b --tokens 200 --stats"
none=$("$TRACEGEN" $base --reuse 0 2>&1)
much=$("$TRACEGEN" $base --reuse 0.9 2>&1)
a0=$(statistic adjacent-share "$none"); a9=$(statistic adjacent-share "$much")
awk -v a="$a0" -v b="$a9" 'BEGIN { exit !(a < 0.1 && b > 0.85) }'
check "reuse 0 -> adjacent share $a0 (chance 0.0625); reuse 0.9 -> $a9" $? "$none $much"
c0=$(statistic cross-layer "$("$TRACEGEN" $base --cross-layer 0 2>&1)")
c9=$(statistic cross-layer "$("$TRACEGEN" $base --cross-layer 0.9 2>&1)")
awk -v a="$c0" -v b="$c9" 'BEGIN { exit !(b > a + 0.2) }'
check "cross-layer 0 -> predictability $c0; 0.9 -> $c9" $? ""
flat=$(statistic top-share-median "$none")
steep=$(statistic top-share-median "$("$TRACEGEN" $base --zipf 1.5 2>&1)")
awk -v a="$flat" -v b="$steep" 'BEGIN { exit !(a < 0.2 && b > 0.6) }'
check "zipf 0 -> top-16 share $flat (chance 0.125); zipf 1.5 -> $steep" $? ""
still=$(statistic top-share-median "$("$TRACEGEN" $base --zipf 1.5 --topic-every 20 --topic-strength 4 2>&1)")
awk -v a="$still" -v b="$steep" 'BEGIN { exit !(a < b - 0.15) }'
check "topic shifts every 20 tokens spread the selections: top-16 share $steep -> $still" $? ""

# --- presets against their targets -----------------------------------------------------------------
# Tolerances: 0.03 on adjacent shares, 0.04 on per-layer shares and cross-layer predictability.
qwen=$("$TRACEGEN" --preset qwen3-30b-a3b --stats -o "$W/qwen-preset.trace" 2>&1)
echo "$qwen"
adjacent=$(statistic adjacent-share "$qwen") low=$(statistic top-share-min "$qwen") high=$(statistic top-share-max "$qwen")
within "$adjacent" 0.39 0.03
check "qwen3-30b-a3b: adjacent share $adjacent within 0.03 of 0.39" $? ""
within "$low" 0.41 0.04 && within "$high" 0.68 0.04
check "qwen3-30b-a3b: top-16 share $low..$high within 0.04 of 0.41..0.68" $? ""
# Published per-layer LRU hit rates at 8/16/32/64 slots: 42/65/81/92% (layer-lru with equal layers is exactly that).
lru=$("$SIM" --trace "$W/qwen-preset.trace" --shape qwen3-30b-a3b --budgets 8e,16e,32e,64e --policies layer-lru 2>&1 |
    awk '$1 == "layer-lru" { printf "%s ", $4 }')
awk -v got="$lru" 'BEGIN { split(got, g, " "); split("42 65 81 92", want, " ")
    for (i = 1; i <= 4; i++) if (g[i] == "" || g[i] - want[i] > 5 || want[i] - g[i] > 5) exit 1 }'
check "qwen3-30b-a3b: per-layer LRU hit % at 8/16/32/64 slots ($lru) within 5 points of 42 65 81 92" $? ""

mixtral=$("$TRACEGEN" --preset mixtral-8x7b --stats -o "$W/mixtral-preset.trace" 2>&1)
echo "$mixtral"
for spec in "adjacent-share 0.376 0.03" "top-share-min 0.526 0.04" "top-share-median 0.590 0.04" \
            "top-share-max 0.644 0.04" "cross-layer 0.422 0.04"; do
    set -- $spec
    value=$(statistic "$1" "$mixtral")
    within "$value" "$2" "$3"
    check "mixtral-8x7b: $1 $value within $3 of $2" $? ""
done

# The Mixtral targets are what the recorded traces measure, and the preset replays like them.
traces="${SHARED_DIR:-}/traces/mixtral-8x7b"
if [ -d "$traces" ] && [ -n "${TRACE_CONVERT:-}" ]; then
    for name in humaneval gsm8k; do
        "$TRACE_CONVERT" "$traces/${name}_2_routing.jsonl" "$W/$name.trace" --arch llama --n-expert 8 >/dev/null 2>&1
    done
    real=$("$TRACEGEN" --measure "$W/humaneval.trace" --measure "$W/gsm8k.trace" 2>&1)
    echo "$real"
    for spec in "adjacent-share 0.376" "top-share-min 0.526" "top-share-median 0.590" "top-share-max 0.644" \
                "cross-layer 0.422"; do
        set -- $spec
        [ "$(statistic "$1" "$real")" = "$2" ]
        check "recorded Mixtral traces measure $1 = $2, the preset's target" $? "measured $(statistic "$1" "$real")"
    done
    hits() {
        "$SIM" "$@" --shape mixtral-8x7b --budgets 1e,2e,3e,4e --policies layer-lru 2>&1 |
            awk '$1 == "layer-lru" { printf "%s ", $4 }'
    }
    recorded=$(hits --trace "$W/humaneval.trace" --trace "$W/gsm8k.trace")
    synthetic=$(hits --trace "$W/mixtral-preset.trace")
    awk -v a="$recorded" -v b="$synthetic" 'BEGIN { split(a, x, " "); split(b, y, " ")
        for (i = 1; i <= 4; i++) if (x[i] == "" || y[i] == "" || x[i] - y[i] > 3 || y[i] - x[i] > 3) exit 1 }'
    check "mixtral-8x7b preset: layer-lru hit % at 1-4 experts per layer ($synthetic) within 3 points of the recorded ($recorded)" $? ""
else
    echo "no shared Mixtral traces or TRACE_CONVERT: the recorded-trace checks are skipped"
fi

# --- bad input --------------------------------------------------------------------------------------
# expect_error DESCRIPTION PATTERN ARGS...: non-zero exit, the pattern in the message, and no signal
expect_error() {
    local what=$1 pattern=$2
    shift 2
    local message status
    message=$(timeout 20 "$TRACEGEN" "$@" 2>&1)
    status=$?
    [ "$status" -ne 0 ] && [ "$status" -lt 124 ] && echo "$message" | grep -q -- "$pattern"
    check "bad input: $what" $? "status $status: $message"
}
expect_error "reuse 1.5" "--reuse needs a number from 0 to 1" --shape mixtral-8x7b --reuse 1.5 --stats
expect_error "negative zipf" "--zipf needs a number" --shape mixtral-8x7b --zipf -1 --stats
expect_error "top-k 0" "--top-k needs a whole number" --n-layer 2 --n-expert 8 --top-k 0 --stats
expect_error "top-k above n-expert" "top_k must be from 1 to n_expert" --n-layer 2 --n-expert 8 --top-k 9 --stats
expect_error "unknown preset" 'unknown --preset "llama4"' --preset llama4 --stats
expect_error "unknown shape" 'unknown --shape' --shape gpt5 --stats
expect_error "unknown flag" "unknown option --temperature" --shape mixtral-8x7b --temperature 1 --stats
expect_error "missing value" "--tokens needs a value" --shape mixtral-8x7b --stats --tokens
expect_error "no shape" "no shape" --tokens 5 --stats
expect_error "nothing to do" "nothing to do" --shape mixtral-8x7b
expect_error "seed with letters" "--seed needs a whole number" --shape mixtral-8x7b --seed 12abc --stats
expect_error "measure a missing file" "cannot measure" --measure "$W/none.trace"
printf 'not a trace at all, just some bytes padding it out to well over one hundred and twenty bytes long....' \
    >"$W/junk.trace"
expect_error "measure a non-trace" "cannot measure" --measure "$W/junk.trace"
expect_error "measure with other flags" "takes no other option" --measure "$W/qwen.trace" --seed 3
expect_error "measure traces of two shapes" "only traces of one shape" --measure "$W/qwen.trace" --measure "$W/odd.trace"
expect_error "unwritable output" "cannot write" --shape mixtral-8x7b --tokens 4 -o "$W/no/such/dir/x.trace"
finish
