#!/bin/bash
# A/B: fixed slots in huge pages (THP madvise, the pool's advice taken) against small pages (THP never), same binary
cd /work/main
B=build/cmake/bin; M=${1:-/var/tmp/bench2/q3-8-q40.gguf}
THP=/sys/kernel/mm/transparent_hugepage/enabled
trap 'echo madvise > $THP' EXIT
cat $M > /dev/null
for round in 1 2 3 4 5 6; do
  for v in huge small plain; do
    case $v in
      huge) echo madvise > $THP; a="--guanaco-streaming --guanaco-ram 8G";;
      small) echo never > $THP; a="--guanaco-streaming --guanaco-ram 8G";;
      plain) echo madvise > $THP; a="";;
    esac
    r=$($B/llama-bench -m $M -t 2 -p 64 -n 64 -r 2 -o csv $a 2>/dev/null | awk -F, 'NR>1 {gsub(/"/,""); printf "%s ", $(NF-1)}')
    echo "$round $v $r"
  done
done
