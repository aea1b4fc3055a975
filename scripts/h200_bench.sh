#!/usr/bin/env bash
# generated chunk_gla_fwd_o_gk (frozen H200 table) against FLA 0.6.0 on the bench cases, on the lent
# H200 (device tool, carry .whl with the fla-core wheel). Usage: bash scripts/h200_bench.sh OUT_DIR
set -euo pipefail
out=${1:?output dir}
source scripts/device_env.sh
python3 -m opgen.cli bench chunk_gla_fwd_o_gk --baseline fla --cases bench_fla --output "$out/bench_fla.txt" 2>&1 | tee "$out/bench.log"
