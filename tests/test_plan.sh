#!/usr/bin/env bash
# test_plan.sh - owns the check of guanaco-plan on tiny synthetic models made
# by guanaco-mkmodel: its table has one row per tenth of the expert bytes,
# the expected resident share never falls as the budget grows and never beats
# Belady's optimum, tok/s follows its stated formula, the overlapped tok/s
# follows the pipeline's on a trace worked out by hand, a --ram budget is the
# largest that fits by the engine's own rule, it says when the routing is
# synthetic, it measures the disk and labels the compute estimate when they
# are not given, a split model plans like the whole one, and a missing file,
# a dense model, a trace of another shape and bad flags fail with a message.
# Env: PLAN, TRACEGEN, MKMODEL, GUANACO_VOCAB_DIR, WORKDIR.
set -u
: "${PLAN:?}" "${TRACEGEN:?}" "${MKMODEL:?}" "${WORKDIR:?}"
W="$WORKDIR/plan"
rm -rf "$W" && mkdir -p "$W"
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

"$MKMODEL" --preset tiny --arch qwen3moe --quant Q8_0 -o "$W/tiny.gguf" >"$W/mkmodel.log" 2>&1
check "tiny qwen3moe written" $? "$(cat "$W/mkmodel.log")"
"$MKMODEL" --preset tiny --arch qwen3moe --quant Q8_0 --split-count 2 -o "$W/split.gguf" >>"$W/mkmodel.log" 2>&1
check "the same model in 2 shards written" $? "$(cat "$W/mkmodel.log")"
"$MKMODEL" --preset tiny --arch llama --quant Q8_0 -o "$W/dense.gguf" >>"$W/mkmodel.log" 2>&1
check "tiny dense llama written" $? "$(cat "$W/mkmodel.log")"

# rows OUTPUT: the table's rows as "budget experts% ram expected optimal mb/token tok/s [<-]"
rows() { echo "$1" | awk 'NF >= 7 && $1 ~ /^[0-9.]+$/ && $2 ~ /^[0-9.]+$/ && $7 ~ /^[0-9.]+$/'; }

out=$(timeout 60 "$PLAN" "$W/tiny.gguf" --disk-gbps 2 --compute-ms 10 2>&1)
status=$?
echo "$out"
check "plans the tiny model with --disk-gbps 2 --compute-ms 10" $status "$out"
table=$(rows "$out")
[ "$(echo "$table" | wc -l)" -eq 10 ] && [ "$(echo "$table" | awk '{ printf "%s ", $2 }')" = \
    "10.0 20.0 30.0 40.0 50.0 60.0 70.0 80.0 90.0 100.0 " ]
check "one row per tenth of the expert bytes" $? "$table"
# Prints one line per violation; empty when every row holds.
violations=$(echo "$table" | awk -v compute=10 -v gbps=2 '
    { if ($4 > $5 + 1e-9) print "budget " $1 ": expected " $4 "% above optimal " $5 "%"
      if (NR > 1 && $4 < previous - 1e-9) print "budget " $1 ": expected " $4 "% below " previous "% of a smaller budget"
      previous = $4
      want = 1000 / (compute + $6 * 1e6 / (gbps * 1e9) * 1e3)
      if (want - $7 > 0.02 * want || $7 - want > 0.02 * want) print "budget " $1 ": " $7 " tok/s, formula gives " want }')
[ -z "$violations" ]
check "expected resident % non-decreasing in budget, never above optimal; tok/s = 1000 / (compute + read)" $? \
    "$violations"
echo "$table" | awk 'NR == 10 { exit !($4 > 95) }'
check "all experts resident: above 95% (only cold-start misses)" $? "$(echo "$table" | tail -1)"
echo "$out" | grep -q "SYNTHETIC, not this model's own: preset mixtral-8x7b"
check "says the routing is synthetic, from the preset nearest 8 experts top-2" $? ""
echo "$out" | grep -qE "^recommended +--guanaco-ram [0-9]+M +\(.*knee"
check "recommends a --guanaco-ram value at the knee" $? "$(echo "$out" | grep recommended)"
echo "$out" | grep -qE "given by --disk-gbps" && echo "$out" | grep -qE "given by --compute-ms"
check "says disk and compute were given" $? ""

# --ram: the recommended budget is the largest the engine's rule allows: RAM needed <= --ram, to the MiB. The
# rule follows the load the engine will use: direct loading (auto's choice for this model's small slices) keeps
# spare copies, at least 64 MiB beside the budget, so the same budget needs more RAM than page-cache loading's.
# check_ram_row LABEL RAM_MIB [ENV...]: plans with --ram RAM_MIB M and checks the row and the recommendation
check_ram_row() {
    local label=$1 ram=$2 row recommended
    shift 2
    out=$(env "$@" timeout 60 "$PLAN" "$W/tiny.gguf" --ram "${ram}M" --disk-gbps 2 --compute-ms 10 2>&1)
    row=$(rows "$out" | grep -- "<- --ram")
    recommended=$(echo "$out" | sed -n 's/^recommended *--guanaco-ram \([0-9]*\)M.*/\1/p')
    awk -v row="$row" -v r="$recommended" -v ram="$ram" 'BEGIN { split(row, f, " ")
        exit !(f[3] <= ram && f[3] > ram - 1 && r != "" && r == int(f[1]) && r >= 4) }'
    check "$label: --ram row needs $((ram - 1))-$ram MiB of RAM, --guanaco-ram ${recommended}M its budget rounded down" \
        $? "row: $row; recommended: $recommended"
}
check_ram_row page-cache 1154 GUANACO_LOAD=page-cache
direct=$(timeout 60 "$PLAN" "$W/tiny.gguf" --ram 1154M --disk-gbps 2 --compute-ms 10 2>&1)
echo "$direct" | grep -q "WARNING: --ram 1.13 GiB leaves nothing for experts"
check "direct (auto): the same --ram leaves no room beside the spare copies, and says so" $? "$direct"
check_ram_row "direct (auto)" 1225
echo "$out" | grep -q "room for direct loading's spare copies"
check "direct: the recommendation names the spare copies" $? "$(echo "$out" | grep recommended)"
[ "$(rows "$out" | wc -l)" -eq 11 ]
check "the --ram budget is an eleventh row" $? "$(rows "$out")"
small=$(timeout 60 "$PLAN" "$W/tiny.gguf" --ram 512M --disk-gbps 2 --compute-ms 10 2>&1)
status=$?
[ "$status" -eq 0 ] && echo "$small" | grep -q "WARNING: --ram 0.50 GiB leaves nothing for experts"
check "--ram below the other weights plus the margin warns" $? "status $status: $small"
big=$(timeout 60 "$PLAN" "$W/tiny.gguf" --ram 64G --disk-gbps 2 --compute-ms 10 2>&1)
echo "$big" | grep -q "holds every expert"
check "--ram above everything says every expert fits" $? "$(echo "$big" | grep recommended)"

# a recorded trace of the model's shape replaces the synthetic routing
"$TRACEGEN" --n-layer 4 --n-expert 8 --top-k 2 --zipf 1 --tokens 300 -o "$W/tiny.trace" >/dev/null 2>&1
out=$(timeout 60 "$PLAN" "$W/tiny.gguf" --trace "$W/tiny.trace" --disk-gbps 2 --compute-ms 10 2>&1)
status=$?
[ "$status" -eq 0 ] && echo "$out" | grep -q "tiny.trace: recorded" && ! echo "$out" | grep -q SYNTHETIC &&
    echo "$out" | grep -q "over 300 tokens"
check "--trace: replays the given routing, 300 tokens, and does not claim it synthetic" $? "status $status: $out"

# The overlapped column: the engine's pipeline (offline/simulate.h). A trace written in the recorded format by perl:
# 9 tokens, each routing layer l to experts 2l and 2l+1. At 20% (6.4 experts), lru, every layer misses both
# experts every token, and from token 1 pilot reads layers 1-3 ahead while the layer before computes. So per
# token, with R = one layer's reads and C = compute / 4: token 0 takes 4 (R + C), the others R + C + 3 max(C, R).
perl -e 'open(my $out, ">", $ARGV[0]) or die; binmode $out;
    print $out pack("a8 V V V V a32 a64", "GNCTRACE", 1, 4, 8, 2, "qwen3moe", "test_plan pipeline");
    for my $t (0 .. 8) { for my $l (0 .. 3) { print $out pack("V V V v v f< f<", $t, 0, $l, 2 * $l, 2 * $l + 1, 0, 0) } }
    close($out) or die' "$W/decode.trace"
check "decode trace written" $? ""
for predictor in pilot gate none; do
    out=$(timeout 60 "$PLAN" "$W/tiny.gguf" --trace "$W/decode.trace" --disk-gbps 0.2 --compute-ms 10 \
        --predictor $predictor --policy lru 2>&1)
    check "plans with --predictor $predictor" $? "$out"
    row=$(rows "$out" | awk '$2 == "20.0"')
    # columns: budget experts% ram expected optimal mb/token serial-tok/s overlapped-tok/s
    echo "$row" | awk -v p=$predictor '{ r = $6 / 4 * 1e6 / 0.2e9 * 1e3; c = 10 / 4
        serial = 4 * (r + c); want = 1000 / serial
        if (p != "none") want = 9000 / (4 * (r + c) + 8 * (r + c + 3 * (c > r ? c : r)))
        exit !($6 > 0 && $8 > 0.99 * want && $8 < 1.01 * want && $7 > 0.99 * 1000 / serial && $7 < 1.01 * 1000 / serial) }'
    check "--predictor $predictor at 20%: overlapped tok/s as worked out by hand, serial the sum" $? "$row"
    # gate scores activations a trace does not hold: it is replayed as pilot, and the plan says so
    [ "$predictor" != gate ] || grep -q "with gate read-ahead (replayed as pilot" <<<"$out"
    check "--predictor $predictor: the plan names what it replayed" $? "$(grep 'overlapped tok/s =' <<<"$out")"
done

# no --disk-gbps / --compute-ms: measured disk, estimated compute, each labelled
out=$(timeout 60 "$PLAN" "$W/tiny.gguf" 2>&1)
status=$?
echo "$out" | grep -E "^(disk|compute) "
[ "$status" -eq 0 ] && echo "$out" | grep -qE "^disk +[0-9.]+ GB/s, measured: .* queue depth 16, (io_uring|threads), (O_DIRECT|buffered)" &&
    echo "$out" | grep -qE "^compute +[0-9.]+ ms per token, an ESTIMATE"
check "measures the disk (saying O_DIRECT or buffered) and labels the compute estimate" $? "status $status: $out"

# a split model: the same geometry and the same table as the whole one
whole=$(rows "$("$PLAN" "$W/tiny.gguf" --disk-gbps 2 --compute-ms 10 2>&1)")
split=$(rows "$("$PLAN" "$W"/split-0000{1,2}-of-00002.gguf --disk-gbps 2 --compute-ms 10 2>&1)")
[ -n "$whole" ] && [ "$whole" = "$split" ]
check "2 shards plan exactly like the whole model" $? "whole: $whole / split: $split"

# --- bad input --------------------------------------------------------------------------------------
expect_error() {
    local what=$1 pattern=$2
    shift 2
    local message status
    message=$(timeout 60 "$PLAN" "$@" 2>&1)
    status=$?
    [ "$status" -ne 0 ] && [ "$status" -lt 124 ] && echo "$message" | grep -q -- "$pattern"
    check "bad input: $what" $? "status $status: $message"
}
expect_error "missing model" "cannot read the model" "$W/none.gguf" --disk-gbps 2 --compute-ms 1
expect_error "dense model" "is a dense model" "$W/dense.gguf" --disk-gbps 2 --compute-ms 1
expect_error "not a GGUF" "cannot read the model" "$W/tiny.trace" --disk-gbps 2 --compute-ms 1
"$TRACEGEN" --shape mixtral-8x7b --tokens 5 -o "$W/mixtral.trace" >/dev/null 2>&1
expect_error "trace of another shape" "refusing to replay it" "$W/tiny.gguf" --trace "$W/mixtral.trace"
expect_error "no model" "no model given" --disk-gbps 2
expect_error "disk 0 GB/s" "--disk-gbps needs a number greater than 0" "$W/tiny.gguf" --disk-gbps 0
expect_error "negative compute" "--compute-ms needs a number of at least 0" "$W/tiny.gguf" --compute-ms -3
expect_error "RAM as words" "--ram needs a size" "$W/tiny.gguf" --ram lots
expect_error "RAM with a bad unit" "--ram needs a size" "$W/tiny.gguf" --ram 16Q
expect_error "unknown policy" 'unknown --policy "mru"' "$W/tiny.gguf" --policy mru
expect_error "unknown predictor" 'unknown --predictor "oracle"' "$W/tiny.gguf" --predictor oracle
expect_error "unknown flag" "unknown option --budget" "$W/tiny.gguf" --budget 5G
expect_error "--tokens with --trace" "do not apply with --trace" "$W/tiny.gguf" --trace "$W/tiny.trace" --tokens 9
finish
