#!/usr/bin/env bash
# Nsight Compute on the generated mamba3_mimo_bwd_fwd's kernels (frozen H200 choice) for official
# cases, with the SASS source page summarised per opcode (scripts/ncu_source_summary.py).
# Usage: bash scripts/h200_ncu_chunk.sh OUT_DIR KERNEL_REGEX CASE...   (e.g. chunk_kernel N128_P64_R4_C16)
#        COUNT=K: the first K launches the regex matches in the profiled call (default 1), e.g.
#        COUNT=3 with 'increment_kernel|scan_kernel|chunk_kernel' for splitscan's three.
# Writes OUT_DIR/ncu_CASE.txt (details), OUT_DIR/ncu_CASE_source.txt (the summary).
set -uo pipefail
out=${1:?output dir}; regex=${2:?kernel regex}; shift 2
mkdir -p "$out"
source scripts/device_env.sh || exit 1
for case in "$@"; do
    rep=/tmp/ncu_$case
    ncu --clock-control none --set full --import-source yes -k "regex:$regex" --launch-skip "${COUNT:-1}" \
        --launch-count "${COUNT:-1}" -f -o "$rep" python3 scripts/mamba3_profile.py "$case" > "$out/ncu_${case}_run.log" 2>&1
    ncu -i "$rep.ncu-rep" --page details > "$out/ncu_$case.txt" 2>&1
    ncu -i "$rep.ncu-rep" --page source --csv --print-source sass > "/tmp/ncu_${case}_source.csv" 2>&1
    python3 scripts/ncu_source_summary.py "/tmp/ncu_${case}_source.csv" > "$out/ncu_${case}_source.txt" 2>&1 \
        || head -c 4000 "/tmp/ncu_${case}_source.csv" > "$out/ncu_${case}_source.txt"
done
