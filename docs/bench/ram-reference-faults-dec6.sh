#!/bin/bash
# The warm ram reference with replayed routing and -p 0: does its timed decode fault the file in? Run on Dec 6
# 05:53 UTC (48-layer Qwen3-30B-A3B Q4_0, 2 vCPU AMD EPYC PVM guest), two rounds after two cats:
#   round 1: p0 (replayed) 5.84 tok/s, 27,380 faults; p0 with -lm mmap+mlock 9.34, 27,508; p0 llama-bench's routing
#            8.21, 21,910
#   round 2: 9.94 / 27,518; 9.40 / 27,508; 9.44 / 21,922
# bench/SIMULATOR.md (Dec 6, "Medians of 3, ...") has what follows from it.
set -u
B=/work/main/build/cmake/bin; M=/var/tmp/bench2/qwen3-30b-a3b-Q4_0.gguf; T=/var/tmp/bench2/qwen3-preset.trace
cat $M > /dev/null; cat $M >/dev/null; fincore $M
for rep in 1 2; do
for mode in "p0" "p0-mlock" "p0-noreplay"; do
  args=(-m $M -n 16 -r 1 -t 2 -nr -o csv -p 0)
  case $mode in
    p0) args+=(--guanaco-trace-replay $T) ;;
    p0-mlock) args+=(--guanaco-trace-replay $T -lm mmap+mlock) ;;
    p0-noreplay) ;;
  esac
  perf stat -x, -e page-faults,task-clock -o /var/tmp/ramfault-$mode.perf $B/llama-bench "${args[@]}" > /var/tmp/ramfault-$mode.csv 2>/dev/null
  tg=$(awk -F'"?,"?' 'NR==1{for(i=1;i<=NF;i++)c[$i]=i} NR>1{gsub(/"/,"",$c["avg_ts"]);print $c["avg_ts"]}' /var/tmp/ramfault-$mode.csv)
  echo "$rep $mode tg=$tg $(grep -E 'page-faults|task-clock' /var/tmp/ramfault-$mode.perf | cut -d, -f1,3 | tr '\n' ' ')"
done; done
