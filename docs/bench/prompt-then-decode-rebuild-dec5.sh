#!/usr/bin/env bash
# Decode after a 32-token prompt with and without the slot pool's huge-page rebuild (bench/PIPELINE.md, Dec 5):
# 48L Q4_0, replayed preset, 25%, the harness's limit. The runs without it used the same build with
# `&& !getenv("HACK_NO_REBUILD")` added to the rebuild's condition in prepare_locked
# (src/residency.c; not committed), so HACK_NO_REBUILD=1 does nothing on main.
set -u
cd /work/main
M=/var/tmp/bench2/qwen3-30b-a3b-Q4_0.gguf T=/var/tmp/bench2/qwen3-preset.trace
LIMIT=6602268672
BUDGET=$(python3 -c "print(int(16310.0e6*0.25))")
D=/var/tmp/p32e
mkdir -p $D
run() { # name prompt environment
  local name=$1 p=$2 environment=$3
  build/cmake/bin/evict_file $M >/dev/null
  ( while sleep 0.5; do pid=$(pgrep -n -x llama-bench) || continue
      grep AnonHuge /proc/$pid/smaps_rollup > $D/$name.smaps.tmp 2>/dev/null && grep "^Anonymous" /proc/$pid/smaps_rollup >> $D/$name.smaps.tmp && mv $D/$name.smaps.tmp $D/$name.smaps
    done ) & local sampler=$!
  env $environment GUANACO_STATUS_EVERY=1 GUANACO_AUDIT=0 bash tests/cgroup_run.sh $LIMIT -- build/cmake/bin/llama-bench -m $M -p $p -n 32 -r 1 -t 2 -ub 512 -nr -o csv \
    --guanaco-streaming --guanaco-ram $BUDGET --guanaco-trace-replay $T > $D/$name.csv 2> $D/$name.err
  kill $sampler; wait $sampler 2>/dev/null
  python3 - $D/$name <<'PY'
import re, sys, csv, statistics
n = sys.argv[1]
tg = [float(r['avg_ts']) for r in csv.DictReader(open(n + '.csv')) if r['n_gen'] not in ('0', None)][-1]
stall = [float(m.group(1)) for m in (re.search(r': 1 tokens.*stall ([\d.]+) ms/token', l) for l in open(n + '.err')) if m][-32:]
rebuilt = re.findall(r'huge pages rebuilt (\d+) \(([\d.]+) ms\)', open(n + '.err').read())
s = statistics.mean(stall)
print("%s decode %.3f tok/s  stall %.1f  outside %.1f ms/token  rebuilt %s  %s" % (
    n.split('/')[-1], tg, s, 1000 / tg - s, rebuilt[-1] if rebuilt else '-', ' '.join(open(n + '.smaps').read().split())))
PY
}
run n1 32 X=0; run o1 32 HACK_NO_REBUILD=1; run o2 32 HACK_NO_REBUILD=1; run n2 32 X=0
