#!/usr/bin/env bash
# decode after a 32-token prompt against decode alone: 48L Q4_0, replayed preset, 25%, the harness's limit
set -u
cd /work/main
M=/var/tmp/bench2/qwen3-30b-a3b-Q4_0.gguf T=/var/tmp/bench2/qwen3-preset.trace
LIMIT=6602268672
BUDGET=$(python3 -c "print(int(16310.0e6*0.25))")
run() { # name prompt
  local name=$1 p=$2
  build/cmake/bin/evict_file $M >/dev/null
  grep -E "^(thp_fault_alloc|pgfault|pgmajfault|thp_collapse_alloc) " /proc/vmstat > /var/tmp/p32/$name.vm0
  ( while sleep 0.5; do pid=$(pgrep -n -x llama-bench) || continue
      for t in /proc/$pid/task/*; do echo "$(cat $t/comm 2>/dev/null) $(awk '{print $14, $15}' $t/stat 2>/dev/null)"; done > /var/tmp/p32/$name.threads.tmp 2>/dev/null && mv /var/tmp/p32/$name.threads.tmp /var/tmp/p32/$name.threads
    done ) & local sampler=$!
  GUANACO_STATUS_EVERY=1 GUANACO_AUDIT=0 bash tests/cgroup_run.sh $LIMIT -- build/cmake/bin/llama-bench -m $M -p $p -n 16 -r 1 -t 2 -ub 512 -nr -o csv \
    --guanaco-streaming --guanaco-ram $BUDGET --guanaco-trace-replay $T > /var/tmp/p32/$name.csv 2> /var/tmp/p32/$name.err
  kill $sampler; wait $sampler 2>/dev/null
  grep -E "^(thp_fault_alloc|pgfault|pgmajfault|thp_collapse_alloc) " /proc/vmstat > /var/tmp/p32/$name.vm1
  python3 - /var/tmp/p32/$name <<'PY'
import re,sys,csv,statistics
n=sys.argv[1]
rows=list(csv.DictReader(open(n+'.csv')))
tg=[float(r['avg_ts']) for r in rows if r['n_gen']!='0']
st=[]
for line in open(n+'.err'):
    m=re.search(r': 1 tokens.*stall ([\d.]+) ms/token',line)
    if m: st.append(float(m.group(1)))
st=st[-16:]; tok=tg[-1]; s=statistics.mean(st)
v0=dict(l.split() for l in open(n+'.vm0')); v1=dict(l.split() for l in open(n+'.vm1'))
d={k:int(v1[k])-int(v0[k]) for k in v0}
print("%s tg %.3f tok/s  stall %.1f  outside %.1f ms/token  vmstat %s" % (n.split('/')[-1], tok, s, 1000/tok - s, d))
PY
  sort /var/tmp/p32/$name.threads | awk '{c[$1]+=$2+$3} END {for (k in c) printf "  %s %.1f s", k, c[k]/100; print ""}'
}
run p0-r1 0; run p32-r1 32; run p32-r2 32; run p0-r2 0
