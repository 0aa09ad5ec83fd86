#!/bin/bash
# ab2.sh MODEL ROUNDS "NAME=ENV:ARGS" ... : alternating llama-bench -p 128 -n 32 rounds, order reversed every other round
M=$1; R=$2; shift 2
B=/work/main/build/cmake/bin/llama-bench
for r in $(seq 1 $R); do
  cat $M > /dev/null
  cfgs=("$@"); if [ $((r % 2)) = 0 ]; then cfgs=(); for ((i=$#; i>0; i--)); do cfgs+=("${!i}"); done; fi
  for c in "${cfgs[@]}"; do
    name=${c%%=*}; rest=${c#*=}; envs=${rest%%:*}; args=${rest#*:}
    ts=$(env $envs $B -m $M -p 128 -n 32 -t 2 -r 2 -o csv $args 2>/dev/null | tail -2 | awk -F, '{printf "%s ", $(NF-1)}' | tr -d '"')
    echo "$r $name $ts"
  done
done
