#!/usr/bin/env bash
# The CPU an O_DIRECT read costs this machine per GB, all of it (the submitting thread, the interrupt and the
# completion, the hypervisor's notify): /proc/stat's busy time over a fio run alone (io_uring, the engine's 1 MiB
# requests, queue depth 16), minus an idle interval of the same length. 3 alternating rounds. Usage: FILE (a model).
set -eu
F=${1:?usage: direct-read-cpu-dec6.sh FILE}
busy() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 }' /proc/stat; } # user nice system irq softirq, in ticks
HZ=$(getconf CLK_TCK)
for round in 1 2 3; do
    b0=$(busy); sleep 10; b1=$(busy)
    idle_s=$(awk -v a="$b0" -v b="$b1" -v hz="$HZ" 'BEGIN { print (b - a) / hz }')
    b0=$(busy)
    fio --name=direct --filename="$F" --allow_file_create=0 --rw=randread --bs=1m --direct=1 --ioengine=io_uring \
        --iodepth=16 --time_based --runtime=10 --output-format=json >/tmp/direct-read-cpu.json
    b1=$(busy)
    gb=$(jq '.jobs[0].read.io_bytes / 1e9' /tmp/direct-read-cpu.json)
    awk -v a="$b0" -v b="$b1" -v hz="$HZ" -v gb="$gb" -v idle="$idle_s" -v r="$round" 'BEGIN {
        cpu = (b - a) / hz - idle
        printf "round %d: %.2f GB in 10 s (%.2f GB/s), %.2f CPU-s busy beyond idle (idle %.2f): %.3f CPU-s per GB\n",
            r, gb, gb / 10, cpu, idle, cpu / gb }'
done
