#!/usr/bin/env bash
# mamba3_mimo_bwd_bwd on one H100 or H200 (CHIP: h200 by default) with no network: the op's frozen
# choices against upstream's TileLang kernel compiled per case (tilelang_static), side by side in one
# process, after both sides' kernels are compiled by WARM_PROCS bench processes (one share of the
# cases each); optionally a tuning search first. Wheels in .whl/ (scripts/device_env.sh) and the
# TileLang bundle in .tilelang/ (tilelang_bundle.sh), both git-ignored: copy them beside the tree.
# Usage: [STEPS="bench"] bash scripts/gpu_mamba3_bwd_bwd.sh OUT_DIR
#   STEPS, in the order given: tune (TUNE_TRIALS (10) points a bucket of CASES within TUNE_SECONDS
#   (200)), build, bench (CASES against tilelang_static). CASES: case sets (official); ROUNDS (2),
#   REPEAT (10): the bench's; WARM_PROCS (11); DEVICE (cuda:0); TILELANG_CACHE_DIR
#   (/tmp/tilelang-cache).
# Writes into OUT_DIR: run.log, tune.log, records.jsonl (records/CHIP/mamba3_mimo_bwd_bwd.jsonl
# after the run: copy it back over the repository's), warm.log and per case set bench_SET.{txt,json,log}.
set -uo pipefail
out=${1:?output dir}; steps=" ${STEPS:-bench} "
op=mamba3_mimo_bwd_bwd; device=${DEVICE:-cuda:0}; chip=${CHIP:-h200}
mkdir -p "$out"
start=$SECONDS
stamp() { echo "[$((SECONDS - start)) s] $*"; }
bench() {  # one case set against tilelang_static, its kernels compiled first, a share a process
    local cases=$1 procs=${WARM_PROCS:-11} k pids=()
    stamp "compiling $cases's kernels (both sides) in $procs processes"
    for ((k = 0; k < procs; k++)); do
        python3 -m opgen.cli bench "$op" --baseline tilelang_static --cases "$cases" --rounds 1 \
            --warmup 0 --repeat 1 --device "$device" --shard "$k/$procs" > "/tmp/warm_${cases}_$k.log" 2>&1 &
        pids+=($!)
    done
    wait "${pids[@]}"
    for ((k = 0; k < procs; k++)); do echo "== $cases shard $k/$procs"; cat "/tmp/warm_${cases}_$k.log"; done >> "$out/warm.log"
    stamp "bench $cases against tilelang_static"
    python3 -m opgen.cli bench "$op" --baseline tilelang_static --cases "$cases" \
        --rounds "${ROUNDS:-2}" --repeat "${REPEAT:-10}" --device "$device" \
        --output "$out/bench_$cases.txt" --json "$out/bench_$cases.json" > "$out/bench_$cases.log" 2>&1
    echo "exit status $?"; tail -16 "$out/bench_$cases.log"
}
main() {
    source scripts/device_env.sh || exit 1
    source .tilelang/activate.sh || exit 1
    export TILELANG_CACHE_DIR=${TILELANG_CACHE_DIR:-/tmp/tilelang-cache}
    python3 -m opgen.cli build --check || exit 1
    records=records/$chip/$op.jsonl
    trap 'cp "$records" "$out/records.jsonl" 2>/dev/null' EXIT
    for step in $steps; do
        case $step in
            tune)
                stamp "tune ${CASES:-official} (no trial begun past ${TUNE_SECONDS:-200} s)"
                python3 -m opgen.cli tune "$op" --chip "$chip" --cases ${CASES:-official} \
                    --trials "${TUNE_TRIALS:-10}" --campaign-seconds "${TUNE_SECONDS:-200}" \
                    --compile-workers "${COMPILE_WORKERS:-14}" --point-timeout 120 --device "$device" \
                    --no-progress >> "$out/tune.log" 2>&1
                echo "exit status $?"; tail -20 "$out/tune.log" ;;
            build)
                stamp "build"
                python3 -m opgen.cli build | tail -3 || exit 1 ;;
            bench) for cases in ${CASES:-official}; do bench "$cases"; done ;;
            *) echo "unknown step $step"; exit 2 ;;
        esac
    done
    stamp "done"
}
main 2>&1 | tee -a "$out/run.log"
exit "${PIPESTATUS[0]}"
