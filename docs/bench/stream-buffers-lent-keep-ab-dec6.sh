#!/usr/bin/env bash
# Prompts and decodes alternating (llama-bench -pg 32,16 -r 3) under --guanaco-ram auto, where the stream buffers
# need a loan from the budget: kept between prompts less the loan, or given back whole at each decode
# (bench/PIPELINE.md, Dec 6): 24-layer Q8_0 (the issue's 16.5 GB shape), replayed 24-layer preset, a 6 GB cgroup.
# A throw-away build, not committed: the residency gave back only the loan's bytes at the buffers' end at decode
# (MADV_DONTNEED, whole 2 MiB pages) and kept the rest mapped; the engine kept them with a loan too, unless
# HACK_NO_LENT_KEEP=1 (the R runs: main's behaviour). It lost (the K runs reached the cgroup limit and faulted the
# non-expert weights in again), so on main HACK_NO_LENT_KEEP does nothing and every run is an R run.
set -u
cd /work/main
M=/var/tmp/bench2/qwen3-30b-a3b-24L-Q8_0.gguf T=/var/tmp/bench2/qwen3-preset-24L.trace
LIMIT=6000000000
D=/var/tmp/lentkeep; mkdir -p $D
run() {
  local name=$1 environment=$2
  build/cmake/bin/evict_file $M >/dev/null
  env $environment GUANACO_STATUS_EVERY=1000 GUANACO_AUDIT=0 bash tests/cgroup_run.sh $LIMIT -- build/cmake/bin/llama-bench -m $M -pg 32,16 -p 0 -n 0 -r 3 -t 2 -ub 512 -nr -o csv \
    --guanaco-streaming --guanaco-ram auto --guanaco-trace-replay $T > $D/$name.csv 2> $D/$name.err
  python3 - $D/$name <<'PY'
import csv, sys, re
n = sys.argv[1]
r = [x for x in csv.DictReader(open(n + '.csv')) if x['avg_ts']]
t = open(n + '.err').read()
rb = re.findall(r'residency: \d+ tokens.*?huge pages rebuilt (\d+) \(([\d.]+) ms\).*?peak ([\d.]+) GiB', t)
lent = re.findall(r'([\d.]+) GiB of it lent by the budget \(([\d.]+) GiB\)', t)[-1:]
cg = re.findall(r'max_usage=(\d+).*?oom_kill=(\d+)', open(n + '.csv').read() + t)
print(n.split('/')[-1], [(x['n_prompt'], x['n_gen'], round(float(x['avg_ts']), 3), round(float(x['stddev_ts']), 3)) for x in r], rb, 'lent', lent, 'cgroup', cg)
PY
}
run K1 X=0; run R1 HACK_NO_LENT_KEEP=1; run R2 HACK_NO_LENT_KEEP=1; run K2 X=0
