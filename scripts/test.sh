#!/usr/bin/env bash
# test.sh - the README's test command: set up from nothing, then run every
# test under ctest (unit tests, mkmodel, bit-identical logits across
# architectures, quant types and a cgroup limit, bad input).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$ROOT/scripts/setup.sh"
cd "$ROOT/build/cmake"
ctest --output-on-failure --timeout 1800 "$@"
