#!/bin/bash
# Harbor ignores this script's exit code: only /logs/verifier/reward.txt counts.
set -u
mkdir -p /logs/verifier

ok=1
# The network policy must be in effect: no interface but the loopback one.
interfaces=$(ls /sys/class/net 2>/dev/null | tr '\n' ' ')
echo "network interfaces: ${interfaces:-<none>}"
for nic in /sys/class/net/*; do
    name=$(basename "$nic")
    if [ "$name" != lo ]; then
        echo "FAIL: network interface '$name' exists; the task asks for network_mode = no-network"
        ok=0
    fi
done

expected=$(sha256sum /data/payload.bin | cut -d' ' -f1)
got=$(tr -d "[:space:]" 2>/dev/null < /data/payload.sha256 || true)
if [ "$got" = "$expected" ]; then
    echo "PASS: checksum matches"
else
    echo "FAIL: expected checksum $expected, got '${got}'"
    ok=0
fi

echo "$ok" > /logs/verifier/reward.txt
