#!/usr/bin/env bash
# Exhaustive sweep of one variant space on one case (input of `opgen replay`), on the lent H200.
# Usage: bash scripts/h200_sweep.sh OUT_DIR
set -euo pipefail
out=${1:?output dir}
source scripts/device_env.sh
python3 -m opgen.cli tune chunk_gla_fwd_o_gk --chip h200 --cases sweep --variants split_general_tiled \
    --trials 1000 --exhaustive-below 1000 --study-seconds 500 --point-timeout 60 --no-progress \
    --storage /tmp/sweep.journal --records "$out/sweep_split_general_tiled.jsonl" 2>&1 | grep -v "A new study created" | tee "$out/sweep.log"
