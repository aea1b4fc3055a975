#!/usr/bin/env bash
# generated mamba3_mimo_bwd_fwd (frozen H200 table) against its own stage0 on the 11 official
# shapes, on the H200s of DEVICES (wheels in .whl/, see scripts/device_env.sh).
# Usage: bash scripts/h200_bench_mamba3.sh OUT_DIR [DEVICES]
set -uo pipefail
out=${1:?output dir}; devices=${2:-cuda:0,cuda:1}
source scripts/device_env.sh
python3 -m opgen.cli build --check || exit 1
python3 -m opgen.cli bench mamba3_mimo_bwd_fwd --baseline stage0 --cases official --rounds 2 --repeat 10 \
    --devices "$devices" --output "$out/bench_stage0.txt" 2>&1 | tee "$out/bench_mamba3.log"
