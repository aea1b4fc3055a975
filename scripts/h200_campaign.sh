#!/usr/bin/env bash
# One device call on the lent H200 pair (device tool, kind nvidia-h200-x2, carry .whl and .tune):
#   GPU 0: the chunk_gla_fwd_o_gk campaign on the spec's bench cases (cross-checked);
#   GPU 1: the mamba3_mimo_bwd_fwd campaign on the official shapes, then the exhaustive sweep of
#          one GLA variant space on one case (the input of `opgen replay`).
# Resumable: the optuna journals travel in .tune/. Records land in records/h200/ and OUT/.
# Usage: bash scripts/h200_campaign.sh OUT_DIR [SECONDS]
set -uo pipefail
out=${1:?output dir}; seconds=${2:-420}
source scripts/device_env.sh
python3 -m opgen.cli build --check || exit 1
mkdir -p .tune
common=(--chip h200 --compile-workers 8 --point-timeout 60 --no-progress)
gla=fold_general_tiled,fold_h1_tiled,fold_single_tiled,fp32_general_tiled,fp32_h1_tiled,fp32_single_tiled
gla=$gla,split_general_tiled,split_h1_tiled,fold_general_persistent,fold_h1_persistent
mamba=staged_static_fused,staged_static_separate,rankfold_static_separate,rankfold_dynamic_separate
CUDA_VISIBLE_DEVICES=0 python3 -m opgen.cli tune chunk_gla_fwd_o_gk "${common[@]}" --cases bench --variants "$gla" \
    --trials 6 --study-seconds 40 --campaign-seconds "$seconds" --cross-check \
    --storage .tune/h200-chunk_gla_fwd_o_gk.journal > "$out/tune_gla.log" 2>&1 &
(
  CUDA_VISIBLE_DEVICES=1 python3 -m opgen.cli tune mamba3_mimo_bwd_fwd "${common[@]}" --cases official \
      --variants "$mamba" --trials 6 --study-seconds 40 --campaign-seconds $((seconds * 2 / 3)) \
      --storage .tune/h200-mamba3_mimo_bwd_fwd.journal
  CUDA_VISIBLE_DEVICES=1 python3 -m opgen.cli tune chunk_gla_fwd_o_gk "${common[@]}" --cases sweep \
      --variants fold_general_tiled --trials 1000 --exhaustive-below 1000 --study-seconds $((seconds / 3)) \
      --storage /tmp/sweep.journal --records "$out/sweep_fold_general_tiled.jsonl"
) > "$out/tune_mamba3_sweep.log" 2>&1 &
wait
grep -v "A new study created" "$out/tune_gla.log" | tail -60
grep -v "A new study created" "$out/tune_mamba3_sweep.log" | tail -40
mkdir -p "$out/records"
cp records/h200/*.jsonl "$out/records/"
cp .tune/*.journal "$out/" 2>/dev/null || true
