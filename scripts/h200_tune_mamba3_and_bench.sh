#!/usr/bin/env bash
# The mamba3_mimo_bwd_fwd campaign over the H200s of DEVICES (one share of the buckets each; wheels
# in .whl/, see scripts/device_env.sh; keep .tune/ between runs to resume), `opgen build` to
# freeze it, then the benchmarks named by OPS (scripts/h200_bench_all.sh; "gla mamba3" by default,
# "none" for none). Usage: [DEVICES=cuda:0] bash ... OUT_DIR [SECONDS] [OPS] (DEVICES as in
# h200_tune_gla.sh; TRIALS and STUDY_SECONDS per study, 6 and 40 by default; POINT_TIMEOUT, 20 s
# by default: a longer one measures again the points that timed out under a shorter one)
set -uo pipefail
out=${1:?output dir}; seconds=${2:-120}; ops=${3:-gla mamba3}; devices=${DEVICES:-cuda:0,cuda:1}
trials=${TRIALS:-6}; study_seconds=${STUDY_SECONDS:-40}; point_timeout=${POINT_TIMEOUT:-20}
source scripts/device_env.sh
python3 -m opgen.cli build --check || exit 1
python3 -m opgen.cli tune mamba3_mimo_bwd_fwd --chip h200 --cases official --devices "$devices" \
    --variants staged_static_fused,rankfold_static_separate --trials "$trials" --warmup 2 --repeat 5 \
    --study-seconds "$study_seconds" --point-timeout "$point_timeout" --campaign-seconds "$seconds" --compile-workers 8 --no-progress \
    --storage .tune/h200-mamba3_mimo_bwd_fwd.journal 2>&1 | grep -v "A new study created" > "$out/tune_mamba3.log"
tail -15 "$out/tune_mamba3.log"
mkdir -p "$out/records" && cp records/h200/mamba3_mimo_bwd_fwd.jsonl "$out/records/"
cp .tune/h200-mamba3_mimo_bwd_fwd.journal "$out/" 2>/dev/null || true
python3 -m opgen.cli build | head -5
[ "$ops" = none ] || bash scripts/h200_bench_all.sh "$out" "$devices" "$ops"
