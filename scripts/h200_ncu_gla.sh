#!/usr/bin/env bash
# Nsight Compute on the generated chunk_gla_fwd_o_gk's kernel (its frozen H200 choice) for cases of
# a case set, with the SASS source page summarised per opcode (scripts/ncu_source_summary.py).
# Usage: bash scripts/h200_ncu_gla.sh OUT_DIR CASE_SET CASE...   (CASE as the benchmark tables name it)
# Writes OUT_DIR/ncu_CASE.txt (details) and OUT_DIR/ncu_CASE_source.txt (the summary).
set -uo pipefail
out=${1:?output dir}; cases=${2:?case set}; shift 2
mkdir -p "$out"
source scripts/device_env.sh || exit 1
source scripts/ncu_case.sh
for case in "$@"; do
    ncu_case "$out" "$case" chunk_gla_fwd_o_gk 1 python3 scripts/op_profile.py chunk_gla_fwd_o_gk "$cases" "$case"
done
