#!/bin/bash
# Harbor ignores this script's exit code: only /logs/verifier/reward.txt counts.
# Checks that task.toml's cpus = 1 and memory_mb = 512 are enforced by the
# sandbox's cgroup (v2: cpu.max / memory.max; v1: cpu.cfs_* / memory.limit_in_bytes),
# and that the agent reported them in /app/limits.txt.
set -u
mkdir -p /logs/verifier

EXPECTED_CPUS=1
EXPECTED_MEMORY_MB=512
ok=1
pass() { echo "PASS: $*"; }
fail() { echo "FAIL: $*"; ok=0; }

if [ -f /sys/fs/cgroup/cpu.max ]; then
    echo "cgroup v2"
    read -r quota period < /sys/fs/cgroup/cpu.max
    memory=$(cat /sys/fs/cgroup/memory.max 2>/dev/null || echo missing)
elif [ -f /sys/fs/cgroup/cpu/cpu.cfs_quota_us ]; then
    echo "cgroup v1"
    quota=$(cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us)
    period=$(cat /sys/fs/cgroup/cpu/cpu.cfs_period_us)
    memory=$(cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null || echo missing)
else
    echo "no cgroup cpu controller found"
    quota=missing period=missing memory=missing
fi
echo "cpu quota=$quota period=$period memory=$memory"

# CPU: quota / period must be EXPECTED_CPUS (within 1%). "max" or -1 means unlimited.
case "$quota$period" in
    *[!0-9]*|"") fail "no CPU limit in effect (quota=$quota)";;
    *)
        milli=$(( quota * 1000 / period ))
        if [ "$milli" -ge $(( EXPECTED_CPUS * 990 )) ] && [ "$milli" -le $(( EXPECTED_CPUS * 1010 )) ]; then
            pass "CPU limit is $EXPECTED_CPUS (${milli}m)"
        else
            fail "CPU limit is ${milli}m, expected $(( EXPECTED_CPUS * 1000 ))m"
        fi;;
esac

# Memory: limit must be EXPECTED_MEMORY_MB MiB (within 1%). v1's "unlimited" is a huge number.
case "$memory" in
    *[!0-9]*|"") fail "no memory limit in effect (memory=$memory)";;
    *)
        expected=$(( EXPECTED_MEMORY_MB * 1024 * 1024 ))
        if [ "$memory" -ge $(( expected * 99 / 100 )) ] && [ "$memory" -le $(( expected * 101 / 100 )) ]; then
            pass "memory limit is $memory bytes"
        else
            fail "memory limit is $memory bytes, expected $expected"
        fi;;
esac

# The agent's report.
if [ -f /app/limits.txt ]; then
    reported_cpus=$(sed -n 's/^cpus=//p' /app/limits.txt | head -n1)
    reported_mb=$(sed -n 's/^memory_mb=//p' /app/limits.txt | head -n1)
    if awk -v c="$reported_cpus" -v e="$EXPECTED_CPUS" 'BEGIN { exit !(c != "" && c + 0 == e + 0) }'; then
        pass "reported cpus=$reported_cpus"
    else
        fail "reported cpus='$reported_cpus', expected $EXPECTED_CPUS"
    fi
    if [ "$reported_mb" = "$EXPECTED_MEMORY_MB" ]; then
        pass "reported memory_mb=$reported_mb"
    else
        fail "reported memory_mb='$reported_mb', expected $EXPECTED_MEMORY_MB"
    fi
else
    fail "/app/limits.txt is missing"
fi

echo "$ok" > /logs/verifier/reward.txt
