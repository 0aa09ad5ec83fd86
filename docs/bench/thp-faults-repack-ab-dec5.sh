M=/var/tmp/bench2/goss-8-mxfp4.gguf; BIN=build/cmake/bin
budget=$((3393 * 1048576 / 4)); limit=$(( (218 * 1048576 + budget + 1536 * 1048576) / 4096 * 4096 ))
for rp in off on off on; do
  $BIN/evict_file $M > /dev/null
  a=$(awk '/^thp_fault_alloc /{print $2}' /proc/vmstat); z=$(awk '/^pgalloc_normal /{print $2}' /proc/vmstat)
  bash tests/cgroup_run.sh $limit -- $BIN/llama-bench -m $M -p 0 -n 32 -r 1 -t 2 --guanaco-streaming --guanaco-ram $budget --guanaco-repack $rp -o csv > /tmp/thp-$rp.csv 2>/tmp/thp-$rp.err
  b=$(awk '/^thp_fault_alloc /{print $2}' /proc/vmstat); y=$(awk '/^pgalloc_normal /{print $2}' /proc/vmstat)
  echo "$rp thp_fault_alloc $((b-a)) pgalloc_normal $((y-z)) tok/s $(tail -1 /tmp/thp-$rp.csv | awk -F'"?,"?' '{print $(NF-1)}')"
done
