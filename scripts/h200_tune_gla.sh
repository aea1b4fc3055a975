#!/usr/bin/env bash
# A chunk_gla_fwd_o_gk search on one case set over the H200s of DEVICES (wheels in .whl/, see
# scripts/device_env.sh; keep .tune/ between runs to resume), a rebuild of the table, and (when
# BENCH=1) those cases against FLA 0.6.0. Records land in records/h200/ and OUT_DIR/records.
# Usage: [DEVICES=cuda:0] bash scripts/h200_tune_gla.sh OUT_DIR SECONDS CASES TRIALS VARIANTS [BENCH]
#   (DEVICES: the GPUs to share the buckets over, cuda:0,cuda:1 by default; cuda:0 on one GPU;
#   CROSS_CHECK=1: then each tuned bucket's winner against the row the table would fill it with;
#   CROSS_CHECK=all: and against every other bucket's winner as well)
# The two runs behind the records of commit 18d6088, on two GPUs:
#   bash scripts/h200_tune_gla.sh OUT_DIR 300 bench_large_v 30 \
#       fold_general_tiled,post_general_tiled,fp32_general_tiled,split_general_tiled 1
#   bash scripts/h200_tune_gla.sh OUT_DIR 480 bench_fla 20 \
#       fold_general_tiled,post_general_tiled,fp32_general_tiled,split_general_tiled,fold_h1_tiled,post_h1_tiled,fold_single_tiled,fp32_single_tiled,split_single_tiled
set -uo pipefail
out=${1:?output dir}; seconds=${2:?seconds}; cases=${3:?case set}; trials=${4:?trials}; variants=${5:?variants}
bench=${6:-0}; devices=${DEVICES:-cuda:0,cuda:1}; cross=()
[ "${CROSS_CHECK:-0}" = 1 ] && cross=(--cross-check)
[ "${CROSS_CHECK:-0}" = all ] && cross=(--cross-check-all)
source scripts/device_env.sh
python3 -m opgen.cli build --check || exit 1
mkdir -p .tune "$out/records"
python3 -m opgen.cli tune chunk_gla_fwd_o_gk --chip h200 --cases "$cases" --variants "$variants" \
    --trials "$trials" --study-seconds $((trials + 10)) --campaign-seconds "$seconds" --point-timeout 60 \
    --compile-workers 8 --no-progress --devices "$devices" ${cross[@]+"${cross[@]}"} --storage .tune/h200-chunk_gla_fwd_o_gk.journal \
    > "$out/tune.log" 2>&1
grep -v "A new study created" "$out/tune.log" | tail -50
cp records/h200/chunk_gla_fwd_o_gk.jsonl "$out/records/"
cp .tune/h200-chunk_gla_fwd_o_gk.journal "$out/" 2>/dev/null || true
python3 -m opgen.cli build > "$out/build.log" 2>&1 || { tail "$out/build.log"; exit 1; }
[ "$bench" = 1 ] || exit 0
python3 -m opgen.cli bench chunk_gla_fwd_o_gk --baseline fla --cases "$cases" --devices "$devices" \
    --output "$out/bench_$cases.txt" > "$out/bench_$cases.log" 2>&1
tail -3 "$out/bench_$cases.log"
cat "$out/bench_$cases.txt"
