#!/bin/bash
set -euo pipefail
echo osmosis > /workspace/answer.txt
