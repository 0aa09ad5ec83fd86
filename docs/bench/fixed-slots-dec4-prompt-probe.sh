#!/bin/bash
# prompt-only A/B of --guanaco-fixed-slots under the side-by-side cgroup limit
M=/var/tmp/bench2/qwen3-30b-a3b-24L-Q8_0.gguf; T=/var/tmp/bench2/qwen3-preset-24L.trace
B=/work/main/build/cmake/bin
CG=/sys/fs/cgroup/memory/slotprobe; mkdir -p $CG; echo 6638063616 > $CG/memory.limit_in_bytes
for v in on off on off; do
  sync; echo 3 > /proc/sys/vm/drop_caches
  ( echo $BASHPID > $CG/tasks
    GUANACO_STREAMING=1 GUANACO_RAM=3845M GUANACO_TRACE_REPLAY=$T GUANACO_FIXED_SLOTS=$v GUANACO_STATUS_EVERY=1 \
      /usr/bin/time -f "slots=$v user %U sys %S wall %e majflt %F minflt %R" \
      $B/llama-bench -m $M -p 256 -n 0 -r 2 -t 2 -ub 512 -nr -o csv 2>/tmp/probe-$v.err | tail -1 | awk -F, '{print "slots='$v' pp", $(NF-1)}'
    tail -1 /tmp/probe-$v.err )
done
