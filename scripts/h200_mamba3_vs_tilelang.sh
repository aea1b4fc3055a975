#!/usr/bin/env bash
# generated mamba3_mimo_bwd_fwd (frozen H200 table) against upstream's TileLang kernel
# mamba_mimo_bwd_fwd (mamba-ssm 2.3.2.post1, tilelang 0.1.8) on the 11 official shapes, without
# the Z gate (case set official) and with it (official_z), each case side by side in one process,
# on an H200 host (one GPU, or two with DEVICES=cuda:0,cuda:1), with the wheels of .whl/ and the
# TileLang bundle in .tilelang/. TileLang's kernels are compiled first, in parallel processes, into
# TileLang's disk cache (TILELANG_CACHE_DIR), so the bench's first call of TileLang loads its kernel
# instead of compiling it; OUT_DIR/tilelang_warm.log has each configuration's compile time.
# Usage: bash scripts/h200_mamba3_vs_tilelang.sh OUT_DIR [CASES]   (CASES: "official official_z",
# the default, or one of them). Env: BASELINES ("tilelang", or "tilelang tilelang_static" for the
# build compiled per case too), DEVICES (one share of the cases per device), ROUNDS (2),
# REPEAT (10), TILELANG_CACHE_DIR (/tmp/tilelang-cache), PACK (a .tgz file: OUT_DIR packed into it after
# each table, so a run cut short keeps the tables it finished).
# Writes OUT_DIR/bench_BASELINE_SET.txt (the table), .json (every case, each output's agreement) and .log.
set -uo pipefail
out=${1:?output dir}; sets=${2:-official official_z}
mkdir -p "$out"
source scripts/device_env.sh || exit 1
source .tilelang/activate.sh || exit 1
export TILELANG_CACHE_DIR=${TILELANG_CACHE_DIR:-/tmp/tilelang-cache}
python3 -m opgen.cli build --check || exit 1
baselines=${BASELINES:-tilelang}
static=""; [[ " $baselines " == *" tilelang_static "* ]] && static=--static
[[ -n $static && " $baselines " != *" tilelang "* ]] && static=--static-only
# shellcheck disable=SC2086  # $sets is a list of case-set names
python3 scripts/tilelang_warm.py --cases $sets $static 2>&1 | tee "$out/tilelang_warm.log" \
    || echo "tilelang_warm.py failed: the bench compiles what is missing at its first call"
for base in $baselines; do
    for set in $sets; do
        python3 -m opgen.cli bench mamba3_mimo_bwd_fwd --baseline "$base" --cases "$set" \
            --rounds "${ROUNDS:-2}" --repeat "${REPEAT:-10}" ${DEVICES:+--devices "$DEVICES"} \
            --output "$out/bench_${base}_$set.txt" --json "$out/bench_${base}_$set.json" \
            2>&1 | tee "$out/bench_${base}_$set.log"
        if [[ -n ${PACK:-} ]]; then tar czf "$PACK" -C "$(dirname "$out")" "$(basename "$out")"; fi
    done
done
