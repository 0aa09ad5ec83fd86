#!/usr/bin/env bash
# test_report.sh - owns the check of bench/report.sh on a hand-made run: the
# direct-loading costs it reads from the engine's status lines (mapping and
# eviction ms over bytes loaded and evicted, worked out here by hand), that a
# direct cell is replayed through guanaco-sim with them and the policy its log
# names (a simulated figure comes out), that a page-cache cell gets none,
# that the warm reference's PMD-mapped bytes are stated, and that the replay's
# compute is the 100% guanaco run's time outside the stall where that run read
# nothing (else warm compute), and the time outside the stall over warm compute
# paired per rep.
# Env: MKMODEL, WORKDIR. Uses the build's guanaco-sim, as report.sh does.
set -u
: "${MKMODEL:?}" "${WORKDIR:?}"
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
[ -x "$ROOT/build/cmake/bin/guanaco-sim" ] || { echo "SKIP: report.sh runs build/cmake/bin/guanaco-sim, not built"; exit 77; }
W="$WORKDIR/report"
rm -rf "$W" && mkdir -p "$W/logs"
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# A qwen3moe of 4 layers x 8 experts, top-2, and the routing a 25% run recorded: llama-bench's warmup token and
# two measured ones, each routing layer l to experts 2l and 2l+1 (the engine's trace format, docs/TRACE.md).
tiny_qwen3moe "$W/tiny.gguf"
check "synthetic qwen3moe written" $? "$(cat "$W/tiny.gguf.log")"
awk 'BEGIN { for (t = 0; t < 3; t++) for (l = 0; l < 4; l++) print 0, t, l, 2 * l, 2 * l + 1 }' |
    write_trace "$W/logs/b25-guanaco-r1.trace"
check "recorded routing written" $? ""
cp "$W/logs/b25-guanaco-r1.trace" "$W/logs/b25-guanaco--page-cache-r1.trace"

# The status lines: warmup, then two measured tokens. Each measured one loads 10 experts (0.05 GiB, at 2 GB/s),
# maps them in 5.0 ms and evicts 8 in 2.0 ms. Map: 2 x 5 ms over 2 x 0.05 GiB = 0.0931 CPU-s per GB. Evict: 2 x 2 ms
# over 2 x 8 x (0.05 GiB / 10) = 0.0466.
status_lines() { # status_lines POLICY LOAD
    echo "guanaco: residency: budget 0.00 GiB of 0.00 GiB expert weights (25%), max 0 experts per layer, policy $1, io io_uring, load $2"
    for t in 1 2 3; do
        echo "guanaco: status at token $t: 1 tokens, resident 50.0% of 8 accesses, hot-pinned 0.0%, 10 loads, 0.05 GiB read at 2.00 GB/s, stall 30.0 ms/token (reads 20.0, mapping 5.0 of which repacking 0.0, eviction 2.0, read-ahead wait 0.0), 8 evictions, churn 0.0% (reloaded within 16 tokens), read-ahead 0.0 MiB issued, 0.0 used, 0.0 wasted, recall 0.0%, hidden 0.0% of reads"
    done
}
status_lines lru direct >"$W/logs/b25-guanaco-r1.err"
status_lines guanaco page-cache >"$W/logs/b25-guanaco--page-cache-r1.err"
cat >"$W/runs.csv" <<'CSV'
budget_pct,variant,rep,limit_bytes,tg_ts,pp_ts,read_bytes,max_usage,resident_pct,guanaco_read_gib,guanaco_gbps,miss_bytes_per_token,stall_ms_per_token,prompt_read_bytes,prompt_stall_ms_per_token,cached_before,cached_pct,rc,pmd_mapped_bytes
100,ram,1,1000000000,10.0,,0,1000,,,,,,,,1000,100.0,0,5000000000
25,guanaco,1,1000000000,2.0,,1000,1000,50.0,0.15,2.00,53687091,30.0,,,0,0.0,0,
25,guanaco::page-cache,1,1000000000,2.5,,1000,1000,50.0,0.15,2.00,53687091,30.0,,,0,0.0,0,
CSV
out=$(bash "$ROOT/bench/report.sh" --runs "$W/runs.csv" --out "$W" --fio-gbps 1 --tokens 2 --prompt 0 --title test \
    --machine "2 CPUs (test)" --disk test --margin-mib 1536 --routing test --model "$W/tiny.gguf" 2>&1)
check "report.sh runs" $? "$out"
report=$(cat "$W/report.md" 2>/dev/null)
# the second table: ... | engine GB/s decode / prompt | direct map / evict | simulated prompt | error |
row() { awk -F' [|] ' -v v="$1" '/^\| budget \| variant \| stall ms\/token/ { t = 1; next } /^$/ { t = 0 }
    t && $2 == v { print $(NF - 3) "|" $(NF - 2) }' <<<"$report"; }
[ "$(row guanaco)" = "2.000 / -|0.0931 / 0.0466" ]
check "direct cell: engine rate 2.000 GB/s, map 0.0931 and evict 0.0466 CPU-s per GB" $? "$(row guanaco)"
[ "$(row guanaco::page-cache)" = "2.000 / -|- / -" ]
check "page-cache cell: no direct costs" $? "$(row guanaco::page-cache)"
# the first table's simulated tok/s: a number for both cells, so guanaco-sim took --load direct, the costs and lru
sim=$(awk -F' [|] ' '/^\| budget \| variant \| decode tok\/s/ { t = 1; next } /^$/ { t = 0 }
    t && $2 ~ /^guanaco/ { print $2 "=" $(NF - 1) }' <<<"$report" | tr '\n' ' ')
grep -Eq '^guanaco=[0-9.]+ guanaco::page-cache=[0-9.]+ $' <<<"$sim"
check "both cells replayed by guanaco-sim" $? "$sim"
grep -q "The warm runs mapped 5.00-5.00 GB of the model in 2 MiB pages" <<<"$report"
check "the warm reference's PMD-mapped bytes are stated" $? "$(grep -A1 'Everything in RAM' <<<"$report")"

# A 100% guanaco run that read nothing: 1000 / 5 tok/s - 1 ms of stall = 199 ms of compute under the engine, which
# the replay takes instead of the warm 100 ms, so it predicts a slower decode. One that read 2 MiB per token is not
# compute alone: warm compute stays.
sim_of() { awk -F' [|] ' '/^\| budget \| variant \| decode tok\/s/ { t = 1; next } /^$/ { t = 0 }
    t && $1 == "| 25%" && $2 == "guanaco" { print $(NF - 1) }' "$W/report.md"; }
warm_sim=$(sim_of)
cp "$W/runs.csv" "$W/runs-warm.csv"
resident_row() { cp "$W/runs-warm.csv" "$W/runs.csv"
    echo "100,guanaco,1,1000000000,5.0,,0,1000,100.0,0,0,$1,1.0,,,0,0.0,0," >>"$W/runs.csv"; }
report_again() { bash "$ROOT/bench/report.sh" --runs "$W/runs.csv" --out "$W" --fio-gbps 1 --tokens 2 --prompt 0 \
    --title test --machine "2 CPUs (test)" --disk test --margin-mib 1536 --routing test --model "$W/tiny.gguf" 2>&1; }
resident_row 0
out=$(report_again)
check "report.sh runs with a 100% guanaco run" $? "$out"
grep -q "the simulator's decode compute per token: 199.0 ms (the 100% guanaco run's time outside the stall" "$W/report.md"
check "the replay's compute is the resident run's time outside the stall" $? "$(grep -m2 'compute per token' "$W/report.md")"
resident_sim=$(sim_of)
awk -v a="$resident_sim" -v b="$warm_sim" 'BEGIN { exit !(a + 0 > 0 && a + 0 < b + 0) }'
check "with 199 ms of compute the replay decodes slower than with warm 100 ms" $? "$resident_sim against $warm_sim"
# --resident adds that run as a budget-100 cell beside the table's budgets: the tables skip the cells it did not run
# (no "failed" page-cache row at 100%), and a prompt's compute is its prompt time outside the stall, 1000 / 50 tok/s
# - 2 ms = 18 ms per prompt token.
! grep -q '^| 100% | guanaco::page-cache |' "$W/report.md"
check "a cell the table did not run is left out, not reported failed" $? "$(grep '^| 100%' "$W/report.md")"
cp "$W/runs-warm.csv" "$W/runs.csv"
echo "100,guanaco,1,1000000000,5.0,50.0,0,1000,100.0,0,0,0,1.0,0,2.0,0,0.0,0," >>"$W/runs.csv"
out=$(bash "$ROOT/bench/report.sh" --runs "$W/runs.csv" --out "$W" --fio-gbps 1 --tokens 2 --prompt 32 \
    --title test --machine "2 CPUs (test)" --disk test --margin-mib 1536 --routing test --model "$W/tiny.gguf" 2>&1)
check "report.sh runs with a resident run's prompt" $? "$out"
grep -q "with 18.00 ms of compute per prompt token (the 100% guanaco run's prompt time outside its stall)" "$W/report.md"
check "the replay's prompt compute is the resident run's prompt time outside its stall" $? \
    "$(grep -m1 'per prompt token' "$W/report.md")"
resident_row 2097152
out=$(report_again)
check "report.sh runs with a 100% guanaco run that read" $? "$out"
grep -q "the simulator's decode compute per token: 100.0 ms (warm in-RAM compute" "$W/report.md"
check "a 100% run that read is not taken as compute" $? "$(grep -m2 'compute per token' "$W/report.md")"
[ "$(sim_of)" = "$warm_sim" ]
check "and the replay is the warm one's" $? "$(sim_of) against $warm_sim"

# Outside the stall over warm compute, paired per rep: rep 1's ram run takes 100 ms per token and its guanaco run
# 1000 / 2 - 30 = 470 ms outside the stall (4.70); rep 2's 200 and 1000 / 4 - 30 = 220 (1.10). Paired: median 2.90
# [1.10-4.70]. Unpaired, the median 345 ms over 1000 / the ram runs' median 7.5 tok/s (133.3 ms): 2.59.
cp "$W/runs-warm.csv" "$W/runs.csv"
echo "100,ram,2,1000000000,5.0,,0,1000,,,,,,,,1000,100.0,0,5000000000" >>"$W/runs.csv"
echo "25,guanaco,2,1000000000,4.0,,1000,1000,50.0,0.15,2.00,53687091,30.0,,,0,0.0,0," >>"$W/runs.csv"
out=$(report_again)
check "report.sh runs with two reps" $? "$out"
paired=$(awk -F' [|] ' '/^\| budget \| variant \| stall ms\/token/ { for (i = 1; i <= NF; i++) c[$i] = i; t = 1; next }
    /^$/ { t = 0 } t && $2 == "guanaco" { print $c["x warm compute"] "|" $c["x warm, paired per rep"] }' "$W/report.md")
[ "$paired" = "2.59 !|2.90 [1.10-4.70]" ]
check "outside the stall over warm compute, unpaired 2.59 and paired per rep 2.90 [1.10-4.70]" $? "$paired"
finish
