#!/usr/bin/env bash
# An op's frozen table against baselines on case sets, each case side by side in one process, on
# the GPUs of one host. Before the timed run, WARM_PROCS processes (one share of the cases each,
# one call a case) compile both contenders' kernels into the disk caches (FLA's autotuning configs
# too; stage0's kernels take up to a minute each), and for a TileLang baseline
# scripts/tilelang_warm.py compiles TileLang's kernels of mamba3_mimo_bwd_fwd in parallel (.tilelang/
# bundle: tilelang_bundle.sh; other ops' TileLang kernels compile in the WARM_PROCS processes), so
# the timed run's first calls load what they need.
# Usage: bash scripts/gpu_bench.sh OUT_DIR OP BASELINE[,BASELINE...] CASE_SET...
# Env: DEVICES (cuda:0; several share the cases), WARM_PROCS (0; `opgen bench --compile-only` processes:
#   no goldens, but mamba3_mimo_bwd_bwd's inputs hold stage one's float64 recompute, and 14 processes
#   building goldens ran out of memory on its B4 S2048 cases on an 80 GB H100), TILELANG_PROCS (0: one a configuration),
#   TILELANG_CACHE_DIR (/tmp/tilelang-cache), WHERE (an `opgen bench --where` formula), ROUNDS (2),
#   REPEAT (10), BENCH_ARGS (further `opgen bench` arguments, e.g. "--set use_exp2=true" or
#   "--case ID"). Wheels in .whl/ (scripts/device_env.sh) where the host's Python lacks the packages.
# Writes OUT_DIR/bench_BASELINE_CASE_SET.{txt,json,log} (the table, every case, the output) and
# the compiling processes' logs under OUT_DIR/warm/.
set -uo pipefail
out=${1:?output dir}; op=${2:?op}; baselines=${3:?baseline}; shift 3
(($#)) || { echo "usage: $0 OUT_DIR OP BASELINE[,BASELINE...] CASE_SET..." >&2; exit 2; }
devices=${DEVICES:-cuda:0}
mkdir -p "$out/warm"
source scripts/device_env.sh || exit 1
python3 -m opgen.cli build --check || exit 1
# shellcheck disable=SC2206  # BENCH_ARGS is a list of arguments
args=(${BENCH_ARGS:-})
[[ -n ${WHERE:-} ]] && args+=(--where "$WHERE")
if [[ ,$baselines, == *,tilelang* ]]; then
    source .tilelang/activate.sh || exit 1
    export TILELANG_CACHE_DIR=${TILELANG_CACHE_DIR:-/tmp/tilelang-cache}
fi
if [[ ,$baselines, == *,tilelang* && $op == mamba3_mimo_bwd_fwd ]]; then  # tilelang_warm.py builds that stage's kernels
    static=""
    [[ ,$baselines, == *,tilelang_static,* ]] && static=--static
    [[ -n $static && ,$baselines, != *,tilelang,* ]] && static=--static-only
    python3 scripts/tilelang_warm.py --cases "$@" --workers "${TILELANG_PROCS:-0}" $static \
        > "$out/tilelang_warm.log" 2>&1 \
        || echo "tilelang_warm.py failed: the bench compiles what is missing at its first call"
fi
for base in ${baselines//,/ }; do
    for cases in "$@"; do
        name=bench_${base}_$cases procs=${WARM_PROCS:-0} pids=()
        for ((k = 0; k < procs; k++)); do
            python3 -m opgen.cli bench "$op" --baseline "$base" --cases "$cases" "${args[@]}" --compile-only \
                --device "${devices%%,*}" --shard "$k/$procs" \
                > "$out/warm/${name}_$k.log" 2>&1 &
            pids+=($!)
        done
        if ((procs)); then wait "${pids[@]}"; fi
        python3 -m opgen.cli bench "$op" --baseline "$base" --cases "$cases" "${args[@]}" \
            --rounds "${ROUNDS:-2}" --repeat "${REPEAT:-10}" --devices "$devices" \
            --output "$out/$name.txt" --json "$out/$name.json" > "$out/$name.log" 2>&1
        tail -3 "$out/$name.log"
    done
done
