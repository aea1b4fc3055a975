#!/usr/bin/env bash
# Nsight Compute on the generated chunk_gla_fwd_o_gk's kernel (its frozen H200 choice) for cases of
# a case set, with the SASS source page summarised per opcode (scripts/ncu_source_summary.py).
# Usage: bash scripts/h200_ncu_gla.sh OUT_DIR CASE_SET CASE...   (CASE as the benchmark tables name it)
# Writes OUT_DIR/ncu_CASE.txt (details) and OUT_DIR/ncu_CASE_source.txt (the summary).
set -uo pipefail
out=${1:?output dir}; cases=${2:?case set}; shift 2
mkdir -p "$out"
source scripts/device_env.sh || exit 1
for case in "$@"; do
    rep=/tmp/ncu_$case
    ncu --clock-control none --set full --import-source yes -k regex:chunk_gla_fwd_o_gk --launch-skip 1 \
        --launch-count 1 -f -o "$rep" python3 scripts/op_profile.py chunk_gla_fwd_o_gk "$cases" "$case" \
        > "$out/ncu_${case}_run.log" 2>&1
    ncu -i "$rep.ncu-rep" --page details > "$out/ncu_$case.txt" 2>&1
    ncu -i "$rep.ncu-rep" --page source --csv --print-source sass > "/tmp/ncu_${case}_source.csv" 2>&1
    python3 scripts/ncu_source_summary.py "/tmp/ncu_${case}_source.csv" > "$out/ncu_${case}_source.txt" 2>&1 \
        || head -c 4000 "/tmp/ncu_${case}_source.csv" > "$out/ncu_${case}_source.txt"
done
