#!/usr/bin/env bash
# Both H200 campaigns on a host with two H200s (wheels in .whl/, see scripts/device_env.sh):
#   GPU 0: the chunk_gla_fwd_o_gk campaign on the spec's bench cases (cross-checked);
#   GPU 1: the mamba3_mimo_bwd_fwd campaign on the official shapes, then the exhaustive sweep of
#          one GLA variant space on one case (the input of `opgen replay`).
# Resumable: keep .tune/ (the optuna journals) between runs. Records land in records/h200/ and are
# copied to OUT_DIR/ with the journals.
# Usage: bash scripts/h200_campaign.sh OUT_DIR [SECONDS]
set -uo pipefail
out=${1:?output dir}; seconds=${2:-420}
source scripts/device_env.sh
python3 -m opgen.cli build --check || exit 1
mkdir -p .tune "$out/sweep/h200"
common=(--chip h200 --compile-workers 8 --no-progress)
# The variants that won or came close in a first campaign over every variant
# (benchmarks/logs/h200_gla_tune_bench_6trials_a223cf1.log); the journals resume each study.
gla=fold_general_tiled,fold_h1_tiled,fold_single_tiled,fp32_general_tiled,fp32_single_tiled,split_general_tiled
mamba=staged_static_fused,rankfold_static_separate
CUDA_VISIBLE_DEVICES=0 python3 -m opgen.cli tune chunk_gla_fwd_o_gk "${common[@]}" --cases bench --variants "$gla" \
    --trials 14 --study-seconds 40 --campaign-seconds "$seconds" --point-timeout 60 --cross-check \
    --storage .tune/h200-chunk_gla_fwd_o_gk.journal > "$out/tune_gla.log" 2>&1 &
(
  # The scan takes milliseconds: fewer repeats, and a slow point is cut at 20 s.
  CUDA_VISIBLE_DEVICES=1 python3 -m opgen.cli tune mamba3_mimo_bwd_fwd "${common[@]}" --cases official \
      --variants "$mamba" --trials 6 --warmup 2 --repeat 5 --study-seconds 40 --point-timeout 20 \
      --campaign-seconds $((seconds * 5 / 6)) --storage .tune/h200-mamba3_mimo_bwd_fwd.journal
  CUDA_VISIBLE_DEVICES=1 python3 -m opgen.cli tune chunk_gla_fwd_o_gk "${common[@]}" --cases sweep \
      --variants fold_general_tiled --trials 1000 --exhaustive-below 1000 --study-seconds $((seconds * 2 / 3)) \
      --point-timeout 60 --storage /tmp/sweep.journal --records "$out/sweep/h200/chunk_gla_fwd_o_gk.jsonl"
) > "$out/tune_mamba3_sweep.log" 2>&1 &
wait
grep -v "A new study created" "$out/tune_gla.log" | tail -60
grep -v "A new study created" "$out/tune_mamba3_sweep.log" | tail -40
mkdir -p "$out/records"
cp records/h200/*.jsonl "$out/records/"
cp .tune/*.journal "$out/" 2>/dev/null || true
