#!/bin/bash
# Where the time outside the stall goes at 25%: a system-wide cpu-clock profile of one Guanaco decode run
# (cold start, the cgroup limit side_by_side uses) and of plain default warm, same model and threads.
set -u
cd /work/main
BIN=build/cmake/bin
M=${1:-/var/tmp/bench2/goss-8-mxfp4.gguf}
EXPERT_MB=${2:-3393}; NONEXP_MB=${3:-218}; REPACK=${4:-off}
OUT=${OUT:-/var/tmp/bench2/perf-outside}
mkdir -p $OUT
budget=$((EXPERT_MB * 1048576 / 4)); limit=$(( (NONEXP_MB * 1048576 + budget + 1536 * 1048576) / 4096 * 4096 ))
[ -n "${SKIP_RAM:-}" ] || cat $M > /dev/null
[ -n "${SKIP_RAM:-}" ] || perf record -a -g -e cpu-clock -F 499 -o $OUT/ram.data -- $BIN/llama-bench -m $M -p 0 -n 64 -r 1 -t 2 -o csv > $OUT/ram.csv 2>$OUT/ram.err
$BIN/evict_file $M > /dev/null
perf record -a -g -e cpu-clock -F 499 -o $OUT/guanaco-$REPACK.data -- bash tests/cgroup_run.sh $limit -- $BIN/llama-bench -m $M -p 0 -n 64 -r 1 -t 2 --guanaco-streaming --guanaco-ram $budget --guanaco-repack $REPACK -o csv > $OUT/guanaco-$REPACK.csv 2>$OUT/guanaco-$REPACK.err
for v in ${VARIANTS:-ram guanaco}; do
  echo "== $v: $(tail -1 $OUT/$v.csv | awk -F'"?,"?' '{print $(NF-1)}') tok/s"
  perf report -i $OUT/$v.data --no-children --sort comm,dso --stdio 2>/dev/null | grep -v "^#" | grep -v "^$" | head -12
  perf report -i $OUT/$v.data --no-children --sort sym --stdio -g none 2>/dev/null | grep -v "^#" | grep -v "^$" | head -25
done
