#!/usr/bin/env bash
# mamba3_mimo_bwd_fwd on the shapes users call (the spec's sampling section, specs/cases/), on one
# H200 or H100 (CHIP: h200 by default) with no network, in one run of about 9 minutes at most: the
# tuned winners
# re-measured on the buckets of users_measure that no official shape reaches (the measure step,
# bounded by MEASURE_SECONDS), the table rebuilt, then the holdout part, which nothing was tuned or
# measured on, against upstream's TileLang kernel compiled per case (tilelang_static). Wheels in
# .whl/ (scripts/device_env.sh), the TileLang bundle in .tilelang/ (tilelang_bundle.sh): both
# git-ignored: copy them beside the tree.
# TileLang's kernels for the holdout are compiled into TileLang's disk cache by
# scripts/tilelang_warm.py, started at once at the lowest CPU priority so that it overlaps the
# measure step (which compiles in parallel at normal priority; its times are device times, the
# device held busy before each call); the holdout's own kernels are compiled by WARM_PROCS bench
# processes, one share of the cases each, before the cases are timed side by side in one process.
# Usage: [STEPS="measure build bench"] bash scripts/h200_mamba3_users.sh OUT_DIR
#   STEPS: the steps to run, in the order given (bench_before: the holdout on the table as it
#   stands, before the measure step; bench: after it, on the rebuilt table; tune: a search of
#   TUNE_TRIALS (60) points on each of the cases TUNE_CASES names by id in the case set TUNE_SET
#   (users_holdout), within TUNE_SECONDS (200), for a bucket no carried point serves; its log goes
#   to measure_fill.log); MEASURE_CASES
#   (users_measure): the case sets whose untuned buckets the measure step measures, in turn;
#   MEASURE_SECONDS (300): it begins no bucket of a case set past this (a later run resumes with
#   the rest); COMPILE_WORKERS (12): its compiling and
#   checking processes; WARM_PROCS (8): processes compiling the holdout benchmark's kernels, 0
#   skips them; TILELANG_PROCS (8): tilelang_warm.py's processes; ROUNDS (2), REPEAT (10): the
#   bench's; DEVICE (cuda:0); TILELANG_CACHE_DIR (/tmp/tilelang-cache).
# Writes into OUT_DIR (8 files): run.log (this script's output), measure_fill.log, records.jsonl
# (records/CHIP/mamba3_mimo_bwd_fwd.jsonl, copied every 15 s and at the end: copy it back over the
# repository's), tilelang_warm.log, and per bench step warm_TAG.log (the compiling bench processes)
# and bench_holdout_TAG.{txt,json,log} (the table, every case with each output's agreement, the
# bench's log), TAG before or after.
set -uo pipefail
out=${1:?output dir}; steps=" ${STEPS:-measure build bench} "
op=mamba3_mimo_bwd_fwd; device=${DEVICE:-cuda:0}; chip=${CHIP:-h200}
mkdir -p "$out" .tune
start=$SECONDS
stamp() { echo "[$((SECONDS - start)) s] $*"; }
bench() {  # the holdout against tilelang_static, its kernels compiled first by WARM_PROCS processes
    # (one share each); files bench_holdout_$1.{txt,json,log}
    local tag=$1 procs=${WARM_PROCS:-8} k pids=() warm
    if [[ -n $warmer ]]; then
        stamp "waiting for tilelang_warm.py"
        wait "$warmer"; warmer=""
        tail -3 "$out/tilelang_warm.log"
    fi
    stamp "compiling the holdout benchmark's kernels in $procs processes"
    warm=$(mktemp -d)
    for ((k = 0; k < procs; k++)); do
        python3 -m opgen.cli bench "$op" --baseline tilelang_static --cases users_holdout --compile-only \
            --device "$device" --shard "$k/$procs" > "$warm/$k.log" 2>&1 &
        pids+=($!)
    done
    if ((procs)); then wait "${pids[@]}"; fi
    for ((k = 0; k < procs; k++)); do
        echo "== shard $k/$procs"; cat "$warm/$k.log"
    done > "$out/warm_$tag.log"
    stamp "bench users_holdout against tilelang_static ($tag)"
    python3 -m opgen.cli bench "$op" --baseline tilelang_static --cases users_holdout \
        --rounds "${ROUNDS:-2}" --repeat "${REPEAT:-10}" --device "$device" \
        --output "$out/bench_holdout_$tag.txt" --json "$out/bench_holdout_$tag.json" > "$out/bench_holdout_$tag.log" 2>&1
    echo "exit status $?"; tail -22 "$out/bench_holdout_$tag.log"
}
main() {
    source scripts/device_env.sh || exit 1
    source .tilelang/activate.sh || exit 1
    export TILELANG_CACHE_DIR=${TILELANG_CACHE_DIR:-/tmp/tilelang-cache}
    python3 -m opgen.cli build --check || exit 1
    python3 -m opgen.cli cases "$op" --check || exit 1
    records=records/$chip/$op.jsonl
    (while sleep 15; do cp "$records" "$out/records.jsonl"; done) > /dev/null 2>&1 &
    keeper=$!
    warmer=""
    trap 'kill $keeper $warmer 2>/dev/null; cp "$records" "$out/records.jsonl"' EXIT
    if [[ $steps == *" bench"* ]]; then
        stamp "compiling TileLang's kernels of users_holdout in the background"
        nice -n 19 python3 scripts/tilelang_warm.py --cases users_holdout --static-only \
            --workers "${TILELANG_PROCS:-8}" > "$out/tilelang_warm.log" 2>&1 &
        warmer=$!
    fi
    for step in $steps; do
        case $step in
            measure)
                for cases in ${MEASURE_CASES:-users_measure}; do
                    stamp "measure step on $cases (no bucket begun past ${MEASURE_SECONDS:-300} s)"
                    python3 -m opgen.cli tune "$op" --chip "$chip" --cases "$cases" --trials 0 \
                        --measure-fill --campaign-seconds "${MEASURE_SECONDS:-300}" \
                        --compile-workers "${COMPILE_WORKERS:-12}" --point-timeout 120 --device "$device" \
                        --no-progress >> "$out/measure_fill.log" 2>&1
                    echo "exit status $?"; tail -20 "$out/measure_fill.log"
                done ;;
            tune)
                local ids=()
                for c in ${TUNE_CASES:?TUNE_CASES: the ids of the cases to tune}; do ids+=(--case "$c"); done
                stamp "tune ${TUNE_CASES} of ${TUNE_SET:-users_holdout} (no trial begun past ${TUNE_SECONDS:-200} s)"
                python3 -m opgen.cli tune "$op" --chip "$chip" --cases "${TUNE_SET:-users_holdout}" "${ids[@]}" \
                    --trials "${TUNE_TRIALS:-60}" --campaign-seconds "${TUNE_SECONDS:-200}" \
                    --compile-workers "${COMPILE_WORKERS:-12}" --point-timeout 120 --device "$device" \
                    --no-progress >> "$out/measure_fill.log" 2>&1
                echo "exit status $?"; tail -20 "$out/measure_fill.log" ;;
            build)
                stamp "build"
                python3 -m opgen.cli build | tail -3 || exit 1
                python3 -m opgen.cli records "$op" --chip "$chip" 2>&1 | tail -30 ;;
            bench) bench after ;;
            bench_before) bench before ;;
            *) echo "unknown step $step"; exit 2 ;;
        esac
    done
    stamp "done"
}
main 2>&1 | tee -a "$out/run.log"
exit "${PIPESTATUS[0]}"
