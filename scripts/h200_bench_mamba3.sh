#!/usr/bin/env bash
# generated mamba3_mimo_bwd_fwd (frozen H200 table) against its own stage0 on the 11 official
# shapes, on the lent H200 (device tool, carry .whl). Usage: bash scripts/h200_bench_mamba3.sh OUT_DIR
set -euo pipefail
out=${1:?output dir}
source scripts/device_env.sh
python3 -m opgen.cli bench mamba3_mimo_bwd_fwd --baseline stage0 --cases official --rounds 3 --repeat 15 \
    --output "$out/bench_stage0.txt" 2>&1 | tee "$out/bench_mamba3.log"
