#!/usr/bin/env bash
# The H200 tuning campaign of chunk_gla_fwd_o_gk on the spec's bench cases. Runs on the lent GPU
# machine (device tool, carry .whl and .tune); resumable: the optuna journal travels in .tune/.
# Usage: bash scripts/h200_tune.sh OUT_DIR [SECONDS]
set -euo pipefail
out=${1:?output dir}; seconds=${2:-400}
source scripts/device_env.sh
mkdir -p .tune
variants=fold_general_tiled,split_general_tiled,fp32_general_tiled,fold_h1_tiled,split_h1_tiled,fp32_h1_tiled
variants=$variants,fold_single_tiled,split_single_tiled,fp32_single_tiled,fp32_general_persistent
python3 -m opgen.cli build --check
python3 -m opgen.cli tune chunk_gla_fwd_o_gk --chip h200 --cases bench --variants "$variants" \
    --trials 8 --compile-workers 8 --campaign-seconds "$seconds" --study-seconds 90 --point-timeout 90 \
    --storage .tune/h200-chunk_gla_fwd_o_gk.journal --no-progress --cross-check 2>&1 | grep -v "A new study created" | tee "$out/tune.log"
cp .tune/h200-chunk_gla_fwd_o_gk.journal "$out/"
mkdir -p "$out/records" && cp records/h200/chunk_gla_fwd_o_gk.jsonl "$out/records/"
