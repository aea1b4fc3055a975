#!/usr/bin/env bash
# chunk_gla_fwd_o_gk on the shapes users call (the spec's sampling section, specs/cases/): a search
# on users_tune (with the bench cases) and its cross-check, the holdout part against FLA 0.6.0 with
# the nearest fill, the tuned winners re-measured on the users_measure buckets, and the holdout
# part against FLA again with the measured fill. Wheels in .whl/ (scripts/device_env.sh); keep
# .tune/ between runs to resume. Records land in records/h200/ and OUT_DIR.
# Usage: [DEVICES=cuda:0] [STEPS="tune nearest measure measured"] bash scripts/h200_gla_users.sh OUT_DIR
#   SECONDS TRIALS [VARIANTS]   (VARIANTS: comma-separated, every legal variant by default; STEPS: the
#   steps to run, in that order, so a campaign can be spread over several runs of bounded time; the
#   records file is copied to OUT_DIR every 15 s and at the end; the step cross_check, in no default, runs
#   the cross-check of the tuned rows alone (after a change to the fill); holdout_measure, in no default,
#   measures the holdout's buckets into OUT_DIR/holdout_measure.jsonl for scripts/fill_oracle.py;
#   WARM_PROCS: processes compiling the benchmark's kernels before it is timed, 0 by default;
#   MEASURE_CASES: the case sets the step measure runs on, in turn, users_measure by default: the
#   step measures the untuned buckets of each, so users_tune's buckets no search reached count too;
#   MEASURE_SECONDS: the step begins no bucket past this many seconds of each case set, so that the
#   steps after it still run in a run of bounded time; the step bench_fla, in no default, times
#   the bench_fla cases against FLA as the holdout is timed, into OUT_DIR/bench_bench_fla.*; the
#   step bench_sets, in no default, each case set of BENCH_SETS (offgrid by default) likewise)
set -uo pipefail
out=${1:?output dir}; seconds=${2:?seconds}; trials=${3:?trials}; variants=${4:-}
devices=${DEVICES:-cuda:0,cuda:1}; steps=" ${STEPS:-tune nearest measure measured} "
source scripts/device_env.sh
python3 -m opgen.cli build --check || exit 1
python3 -m opgen.cli cases chunk_gla_fwd_o_gk --check || exit 1
mkdir -p .tune "$out"
records=records/h200/chunk_gla_fwd_o_gk.jsonl
(while sleep 15; do if [[ -f $records ]]; then cp "$records" "$out/"; fi; done) &
keeper=$!
trap 'kill $keeper 2>/dev/null; if [[ -f $records ]]; then cp "$records" "$out/"; fi' EXIT
tune=(python3 -m opgen.cli tune chunk_gla_fwd_o_gk --chip h200 --point-timeout 60 --compile-workers 8
      --no-progress --devices "$devices" --storage .tune/h200-chunk_gla_fwd_o_gk.journal)
bench() {  # one case set against FLA (exp2 gates, as FLA computes them), one table per step: both
    # compiled first (FLA's autotuning configs too) by WARM_PROCS processes, one share each, their
    # logs in a folder of their own. Usage: bench STEP [CASES] (users_holdout by default)
    local cases=${2:-users_holdout} name=bench_holdout_$1
    if [[ $cases != users_holdout ]]; then name=bench_$cases; fi
    python3 -m opgen.cli build > "$out/build_$1.log" 2>&1 || { tail "$out/build_$1.log"; exit 1; }
    local procs=${WARM_PROCS:-0} k pids=() warm
    warm=$(mktemp -d)
    for ((k = 0; k < procs; k++)); do
        python3 -m opgen.cli bench chunk_gla_fwd_o_gk --baseline fla --cases "$cases" --set use_exp2=true \
            --compile-only --device "${devices%%,*}" --shard "$k/$procs" \
            > "$warm/$k.log" 2>&1 &
        pids+=($!)
    done
    if ((procs)); then wait "${pids[@]}"; fi  # the compiling processes only: the keeper runs to the end
    python3 -m opgen.cli bench chunk_gla_fwd_o_gk --baseline fla --cases "$cases" --set use_exp2=true \
        --devices "$devices" --json "$out/$name.json" --output "$out/$name.txt" > "$out/$name.log" 2>&1
    tail -3 "$out/$name.log"
}
if [[ $steps == *" tune "* ]]; then
    "${tune[@]}" --cases users_tune --trials "$trials" --study-seconds $((trials + 10)) --campaign-seconds "$seconds" \
        ${variants:+--variants "$variants"} --cross-check > "$out/tune.log" 2>&1
    grep -v "A new study created" "$out/tune.log" | tail -50
fi
if [[ $steps == *" cross_check "* ]]; then  # the cross-check alone, of the tuned rows as they stand
    "${tune[@]}" --cases users_tune --trials 0 --cross-check > "$out/cross_check.log" 2>&1
    tail -12 "$out/cross_check.log"
fi
if [[ $steps == *" nearest "* ]]; then bench nearest; fi
if [[ $steps == *" measure "* ]]; then
    for cases in ${MEASURE_CASES:-users_measure}; do
        "${tune[@]}" --cases "$cases" --trials 0 --measure-fill --campaign-seconds "${MEASURE_SECONDS:-10800}" \
            > "$out/measure_fill_$cases.log" 2>&1
        tail -50 "$out/measure_fill_$cases.log"
    done
fi
if [[ $steps == *" measured "* ]]; then bench measured; fi
if [[ $steps == *" bench_fla "* ]]; then bench bench_fla bench_fla; fi
if [[ $steps == *" bench_sets "* ]]; then  # each case set of BENCH_SETS against FLA, a table each
    for cases in ${BENCH_SETS:-offgrid}; do bench "$cases" "$cases"; done
fi
if [[ $steps == *" holdout_measure "* ]]; then  # the measure step on the holdout's own buckets, into
    # a copy of the records (the holdout stays unmeasured for the table), joined with the table
    cp "$records" "$out/holdout_measure.jsonl"
    "${tune[@]}" --cases users_holdout --trials 0 --measure-fill --records "$out/holdout_measure.jsonl" \
        > "$out/measure_fill_holdout.log" 2>&1
    python3 scripts/fill_oracle.py chunk_gla_fwd_o_gk h200 users_holdout "$out/holdout_measure.jsonl" \
        | tee "$out/fill_oracle_holdout.txt" | tail -3
fi
