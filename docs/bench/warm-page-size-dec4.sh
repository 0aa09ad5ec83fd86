#!/bin/bash
# Warm in-RAM decode with the weights in 2 MiB pages or in 4 KiB pages, alternating rounds.
# mmap: the page cache (PMD-mapped where its folios are 2 MiB); none-4k: llama.cpp's own buffers (-lm none,
# anonymous memory) with THP off; none-thp: the same with THP always.
# usage (root, from the repository root): bash docs/bench/warm-page-size-dec4.sh MODEL.gguf; THP is set back on exit
M=${1:?usage: warm-page-size-dec4.sh MODEL.gguf}
B=${B:-build/cmake/bin}
THP=/sys/kernel/mm/transparent_hugepage/enabled
orig=$(grep -o '\[[a-z]*\]' $THP | tr -d '[]')
trap 'echo $orig > $THP; echo "THP set back: $(cat $THP)"' EXIT # even when interrupted
cat $M > /dev/null
for round in 1 2 3; do
  for cfg in mmap none-4k none-thp; do
    case $cfg in
      mmap) echo madvise > $THP; lm=mmap;;
      none-4k) echo never > $THP; lm=none;;
      none-thp) echo always > $THP; lm=none;;
    esac
    echo 0 > /tmp/pagesize_peak
    ( peak=0; while :; do v=$(awk '/AnonHugePages|FilePmdMapped/ {s+=$2} END {print s}' /proc/meminfo); [ "$v" -gt "$peak" ] && peak=$v && echo $peak > /tmp/pagesize_peak; sleep 0.5; done ) &
    sampler=$!
    out=$($B/llama-bench -m $M -p 0 -n 32 -r 1 -t 2 -nr -lm $lm -o csv 2>/dev/null | tail -1)
    kill $sampler; wait $sampler 2>/dev/null
    ts=$(echo "$out" | awk -F, '{print $(NF-1)}')
    echo "round $round $cfg thp=$(grep -o '\[[a-z]*\]' $THP) decode_tok_s=$ts peak_2MiB_mapped_MiB=$(( $(cat /tmp/pagesize_peak) / 1024 ))"
  done
done
