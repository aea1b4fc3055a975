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
source scripts/ncu_case.sh
for case in "$@"; do
    ncu_case "$out" "$case" "$regex" "${COUNT:-1}" python3 scripts/mamba3_profile.py "$case"
done
