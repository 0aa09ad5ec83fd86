#!/usr/bin/env bash
# test_sim.sh - owns the check of guanaco-sim on the real Mixtral routing
# traces (shared/traces/mixtral-8x7b): no policy beats Belady's optimum at any
# budget, Belady never gets worse with more RAM, a budget that holds every
# expert leaves only the compulsory misses (counted here from the JSONL, not
# by the tool), the CSV has one row per (policy, budget), the PNG is drawn
# when gnuplot exists and skipped cleanly when it does not, and a trace of
# another shape or a bad budget is refused with a message. --predictor: the
# pilot predictor's recall is a fraction that grows with the mass, and each
# MoE layer gets one with --verbose. What needs no recorded routing (--model,
# the pipeline's timing, the predictor on synthetic traces) is
# test_sim_pipeline.sh's, which runs in a fresh clone.
# Env: SIM, TRACE_CONVERT, SHARED_DIR, WORKDIR.
set -u
: "${SIM:?}" "${TRACE_CONVERT:?}" "${WORKDIR:?}"
traces="${SHARED_DIR:-}/traces/mixtral-8x7b"
[ -d "$traces" ] || { echo "SKIP: no shared traces at '$traces'"; exit 77; }
W="$WORKDIR/sim"
rm -rf "$W" && mkdir -p "$W"
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

for name in humaneval gsm8k; do
    report=$("$TRACE_CONVERT" "$traces/${name}_2_routing.jsonl" "$W/$name.trace" --arch llama --n-expert 8 2>&1)
    check "$name converts" $? "$report"
done

budgets="12.5%,25%,50%,100%"
out=$("$SIM" --trace "$W/humaneval.trace" --trace "$W/gsm8k.trace" --shape mixtral-8x7b --budgets "$budgets" \
    --policies all --csv "$W/sim.csv" --plot "$W/sim.png" 2>&1)
check "guanaco-sim runs on both traces" $? "$out"
echo "$out"

# Compulsory misses, independently of the tool: distinct (layer, expert) pairs in the JSONL.
compulsory=$(awk '
    match($0, /"layer": *[0-9]+/) { layer = substr($0, RSTART, RLENGTH); gsub(/[^0-9]/, "", layer) }
    match($0, /"experts": *\[[^]]*\]/) {
        list = substr($0, RSTART, RLENGTH); sub(/^[^[]*\[/, "", list); sub(/\]$/, "", list)
        n = split(list, ids, /[ ,]+/)
        for (i = 1; i <= n; i++) if (ids[i] != "") seen[layer ":" ids[i]] = 1
    }
    END { c = 0; for (k in seen) c++; print c }' "$traces/humaneval_2_routing.jsonl" "$traces/gsm8k_2_routing.jsonl")
echo "$out" | grep -qE "^compulsory +$compulsory misses"
check "tool counts $compulsory compulsory misses" $? "$(echo "$out" | grep '^compulsory')"

# The CSV, read by column name so a new column does not break the checks.
csv="$W/sim.csv"
rows=$(awk 'NR > 1' "$csv" 2>/dev/null | wc -l)
[ "$rows" -eq 20 ]
check "CSV has one row per (policy, budget): 5 x 4" $? "$rows rows"
for policy in belady lru lfu layer-lru guanaco; do
    n=$(awk -F, -v p="$policy" 'NR > 1 && $1 == p' "$csv" | wc -l)
    [ "$n" -eq 4 ]
    check "CSV has 4 budgets of $policy" $? "$n rows"
done
# Prints one line per violation of the invariants; empty when all hold.
violations=$(awk -F, -v compulsory="$compulsory" '
    NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
    {
        p = $col["policy"]; b = $col["budget_percent"] + 0
        hits = $col["hits"] + 0; misses = $col["misses"] + 0; accesses = $col["accesses"] + 0
        if (hits + misses != accesses) print p " at " b "%: hits + misses != accesses"
        if (p == "belady") best[b] = hits; else policy_hits[p, b] = hits
        if (b == 100 && misses != compulsory) print p " at 100%: " misses " misses, not the " compulsory " compulsory ones"
        if (b == 100 && $col["evictions"] + 0 != 0) print p " at 100%: " $col["evictions"] " evictions"
        if (p == "lru" && $col["gap_closed_percent"] != "n/a" && $col["gap_closed_percent"] + 0 != 0)
            print "lru closes " $col["gap_closed_percent"] "% of its own gap"
        budgets[b] = 1
    }
    END {
        for (key in policy_hits) {
            split(key, part, SUBSEP)
            if (policy_hits[key] > best[part[2]])
                print part[1] " at " part[2] "%: " policy_hits[key] " hits, more than belady " best[part[2]]
        }
        m = 0; for (b in budgets) list[++m] = b + 0
        for (i = 2; i <= m; i++) { v = list[i]; j = i - 1; while (j > 0 && list[j] > v) { list[j + 1] = list[j]; j-- } list[j + 1] = v }
        for (i = 2; i <= m; i++)
            if (best[list[i]] < best[list[i - 1]])
                print "belady falls from " best[list[i - 1]] " hits at " list[i - 1] "% to " best[list[i]] " at " list[i] "%"
    }' "$csv" 2>&1)
[ -z "$violations" ]
check "no policy beats belady; belady non-decreasing in budget; 100% leaves only compulsory misses" $? "$violations"

if command -v gnuplot >/dev/null; then
    [ -s "$W/sim.png" ] && [ "$(head -c 4 "$W/sim.png" | tail -c 3)" = "PNG" ]
    check "PNG of the miss-ratio curves is drawn" $? "$(ls -l "$W/sim.png" 2>&1)"
else
    echo "gnuplot not installed: the PNG check is skipped"
fi
# Without gnuplot the table and CSV still come out, and the run still succeeds.
skipped=$(PATH=/nonexistent "$SIM" --trace "$W/gsm8k.trace" --shape mixtral-8x7b --budgets 50% --plot "$W/none.png" 2>&1)
status=$?
[ "$status" -eq 0 ] && echo "$skipped" | grep -q "gnuplot is not installed" && [ ! -e "$W/none.png" ]
check "no gnuplot: says so, skips the plot, exits 0" $? "status $status: $skipped"

# A trace of another shape is refused, with the shapes named.
mismatch=$("$SIM" --trace "$W/humaneval.trace" --shape qwen3-30b-a3b --budgets 50% 2>&1)
status=$?
[ "$status" -ne 0 ] && echo "$mismatch" | grep -q "refusing to replay"
check "Mixtral trace on --shape qwen3-30b-a3b is refused" $? "status $status: $mismatch"

bad=$("$SIM" --trace "$W/humaneval.trace" --shape mixtral-8x7b --budgets 25%,lots 2>&1)
status=$?
[ "$status" -ne 0 ] && echo "$bad" | grep -q 'invalid budget "lots"'
check "a bad budget is refused" $? "status $status: $bad"

# Experts per layer: 1e is exactly 12.5% of Mixtral's experts, so the rows agree.
one=$("$SIM" --trace "$W/humaneval.trace" --shape mixtral-8x7b --budgets 1e,12.5% --policies lru 2>&1)
status=$?
[ "$status" -eq 0 ] && [ "$(echo "$one" | awk '$1 == "belady" { print $2, $5 }' | sort -u | wc -l)" -eq 1 ]
check "budget 1e equals 12.5% on 8 experts" $? "$one"


# --predictor: nothing of it shows without the flag.
echo "$out" | grep -q "^predictor"
[ $? -ne 0 ]
check "no predictor report without --predictor" $? "$(echo "$out" | grep '^predictor')"
# Prints "recall set_size precision" for the pilot line of mass $1 in the report on stdin.
pilot_line() { awk -v m="$1" '$1 == "pilot" && $2 + 0 == m + 0 { print $4, $5, $6 }'; }
pred=$("$SIM" --trace "$W/humaneval.trace" --shape mixtral-8x7b --budgets 100% --policies lru \
    --predictor pilot --pilot-mass 0.5,0.9 --verbose 2>&1)
check "guanaco-sim --predictor pilot runs" $? "$pred"
echo "$pred" | sed -n '/^predictor:/,$p'
low=$(echo "$pred" | pilot_line 0.5) high=$(echo "$pred" | pilot_line 0.9)
echo "$low $high" | awk 'NF == 6 && $1 >= 0 && $1 <= 1 && $4 >= 0 && $4 <= 1 && $2 <= 8 && $5 <= 8 &&
    $3 >= 0 && $3 <= 1 && $6 >= 0 && $6 <= 1 && $4 > $1 && $5 > $2 { ok = 1 } END { exit !ok }'
check "pilot on Mixtral: recall and precision in [0,1], at most 8 experts; recall and set size grow with the mass" $? \
    "mass 0.5: $low; mass 0.9: $high"
layers=$(echo "$pred" | grep -cE '^  layer +[0-9]+ -> +[0-9]+ +recall')
[ "$layers" -eq 62 ]
check "--verbose: a recall per MoE layer with a next one, 31 per mass" $? "$layers lines"
none=$("$SIM" --trace "$W/humaneval.trace" --shape mixtral-8x7b --budgets 100% --policies lru --predictor none 2>&1)
echo "$none" | awk '$1 == "none" && $4 == 0 && $5 == 0 { ok = 1 } END { exit !ok }'
check "--predictor none guesses nothing" $? "$none"
for bad in "--predictor oracle" "--predictor pilot --pilot-mass 1.5" "--predictor pilot --pilot-mass 0.5,,0.9" \
    "--pilot-mass 0.5" "--predictor none --pilot-mass 0.5" "--verbose"; do
    refused=$("$SIM" --trace "$W/humaneval.trace" --shape mixtral-8x7b --budgets 100% $bad 2>&1)
    [ $? -eq 2 ]
    check "refused: $bad" $? "$refused"
done
finish
