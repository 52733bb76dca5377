#!/bin/bash
# Reads the limits from the cgroup filesystem (v2 unified, else v1).
set -euo pipefail
if [ -f /sys/fs/cgroup/cpu.max ]; then
    read -r quota period < /sys/fs/cgroup/cpu.max
    memory=$(cat /sys/fs/cgroup/memory.max)
else
    quota=$(cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us)
    period=$(cat /sys/fs/cgroup/cpu/cpu.cfs_period_us)
    memory=$(cat /sys/fs/cgroup/memory/memory.limit_in_bytes)
fi
if [ "$quota" = max ] || [ "$quota" -lt 0 ]; then
    cpus=$(nproc)
else
    cpus=$(awk -v q="$quota" -v p="$period" 'BEGIN { printf "%g", q / p }')
fi
if [ "$memory" = max ]; then
    memory_mb=unlimited
else
    memory_mb=$(( memory / 1024 / 1024 ))
fi
printf 'cpus=%s\nmemory_mb=%s\n' "$cpus" "$memory_mb" | tee /app/limits.txt
