#!/usr/bin/env bash
# Prompts and decodes alternating (llama-bench -pg 32,16 -r 3) with the stream buffers kept between prompts or
# given back at each decode (bench/PIPELINE.md, Dec 6): 48-layer Q4_0, replayed preset, 25%, the harness limit.
# The R runs used an uncommitted `!getenv("HACK_NO_KEEP") &&` at the head of the keep test in stream_buffers_release
# (src/residency.c), so HACK_NO_KEEP=1 does nothing on main.
set -u
cd /work/main
M=/var/tmp/bench2/qwen3-30b-a3b-Q4_0.gguf T=/var/tmp/bench2/qwen3-preset.trace
LIMIT=6602268672
BUDGET=$(python3 -c "print(int(16310.0e6*0.25))")
D=/var/tmp/keepbuf; mkdir -p $D
run() {
  local name=$1 environment=$2
  build/cmake/bin/evict_file $M >/dev/null
  env $environment GUANACO_STATUS_EVERY=1000 GUANACO_AUDIT=0 bash tests/cgroup_run.sh $LIMIT -- build/cmake/bin/llama-bench -m $M -pg 32,16 -p 0 -n 0 -r 3 -t 2 -ub 512 -nr -o csv \
    --guanaco-streaming --guanaco-ram $BUDGET --guanaco-trace-replay $T > $D/$name.csv 2> $D/$name.err
  python3 - $D/$name <<'PY'
import csv, sys, re
n = sys.argv[1]
r = [x for x in csv.DictReader(open(n + '.csv')) if x['avg_ts']]
t = open(n + '.err').read()
rb = re.findall(r'residency: \d+ tokens.*?huge pages rebuilt (\d+) \(([\d.]+) ms\).*?peak ([\d.]+) GiB', t)
print(n.split('/')[-1], [(x['n_prompt'], x['n_gen'], round(float(x['avg_ts']), 3), round(float(x['stddev_ts']), 3)) for x in r], rb)
PY
}
run K1 X=0; run R1 HACK_NO_KEEP=1; run R2 HACK_NO_KEEP=1; run K2 X=0
