#!/usr/bin/env bash
# scripts/h200_ab_variant.py over several case sets of one op, each compiled first by WARM_PROCS
# processes side by side (the Triton cache keeps their kernels), then timed alone in one process.
# Wheels in .whl/ (scripts/device_env.sh). Writes OUT_DIR/ab_SET.txt per case set; prints the
# compiling processes' failures and each set's summary.
# Usage: [WARM_PROCS=8] [ROUNDS=3] bash scripts/h200_ab_sets.sh OUT_DIR OP "SET ..." AB_ARGS...
# e.g.   bash scripts/h200_ab_sets.sh /tmp/o chunk_gla_fwd_o_gk "users_holdout bench_fla" GRID=tiled,heads_first
set -uo pipefail
out=${1:?output dir}; op=${2:?op}; sets=${3:?case sets}; shift 3
source scripts/device_env.sh
warm=$(mktemp -d)  # the compiling processes' logs: their failures are printed
mkdir -p "$out"
procs=${WARM_PROCS:-8}
for set in $sets; do
    pids=()
    for ((k = 0; k < procs; k++)); do
        python3 scripts/h200_ab_variant.py "$op" "$set" "$@" --warm "$k/$procs" > "$warm/${set}_$k.log" 2>&1 &
        pids+=($!)
    done
    wait "${pids[@]}"
    grep -h -v "^$" "$warm"/"${set}"_*.log | grep -v " ok " | head -20
done
for set in $sets; do
    python3 scripts/h200_ab_variant.py "$op" "$set" "$@" ${ROUNDS:+--rounds "$ROUNDS"} > "$out/ab_$set.txt" 2>&1
    tail -2 "$out/ab_$set.txt"
done
