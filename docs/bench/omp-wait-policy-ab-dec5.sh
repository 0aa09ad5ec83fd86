M=${M:-/var/tmp/bench2/goss-8-mxfp4.gguf}; BIN=build/cmake/bin; EMB=${EMB:-3393}; NEMB=${NEMB:-218}
budget=$((EMB * 1048576 / 4)); limit=$(( (NEMB * 1048576 + budget + 1536 * 1048576) / 4096 * 4096 ))
for r in 1 2 3; do for pol in default passive; do
  $BIN/evict_file $M > /dev/null
  if [ $pol = passive ]; then export OMP_WAIT_POLICY=passive; else unset OMP_WAIT_POLICY; fi
  bash tests/cgroup_run.sh $limit -- $BIN/llama-bench -m $M -p 0 -n 32 -r 1 -t 2 --guanaco-streaming --guanaco-ram $budget --guanaco-repack ${RP:-off} -o csv > /tmp/omp.csv 2>/tmp/omp-$pol-$r.err
  echo "$pol r$r $(grep -v '^cgroup' /tmp/omp.csv | tail -1 | awk -F'"?,"?' '{print $(NF-1)}') $(grep 'residency: [0-9]' /tmp/omp-$pol-$r.err | grep -o 'stall [0-9.]* ms/token')"
done; done
