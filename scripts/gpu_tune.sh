#!/usr/bin/env bash
# A tuning campaign of one op on the GPUs of one host, case set by case set, then (BUILD=1) the
# table rebuilt from the records. The records file is copied to OUT_DIR every 15 s and at the end,
# so a run cut short keeps what it measured; the optuna journal in .tune/ lets a later run resume.
# Usage: bash scripts/gpu_tune.sh OUT_DIR OP CASE_SET...
# Env: CHIP (h200), DEVICES (cuda:0; cuda:0,cuda:1 shares the buckets over two GPUs), TRIALS (8, a
#   study; 0 with MEASURE_FILL=1 runs the measure step alone), VARIANTS (comma-separated; every
#   legal variant by default), CAMPAIGN_SECONDS (per case set, 300), STUDY_SECONDS
#   (TRIALS + 10), POINT_TIMEOUT (60), COMPILE_WORKERS (8), CROSS_CHECK (1: each tuned bucket's
#   winner against the row the table would fill it with; all: against every other winner too),
#   MEASURE_FILL (1: --measure-fill), TUNE_ARGS (further `opgen tune` arguments), BUILD (1: run
#   `opgen build` at the end). Wheels in .whl/ (scripts/device_env.sh) where the host's Python
#   lacks the packages.
# Writes OUT_DIR/tune_CASE_SET.log per case set, OUT_DIR/records.jsonl and OUT_DIR/build.log.
set -uo pipefail
out=${1:?output dir}; op=${2:?op}; shift 2
(($#)) || { echo "usage: $0 OUT_DIR OP CASE_SET..." >&2; exit 2; }
chip=${CHIP:-h200}; trials=${TRIALS:-8}; records=records/$chip/$op.jsonl
mkdir -p "$out" .tune
source scripts/device_env.sh || exit 1
python3 -m opgen.cli build --check || exit 1
(while sleep 15; do if [[ -f $records ]]; then cp "$records" "$out/records.jsonl"; fi; done) &
keeper=$!
trap 'kill $keeper 2>/dev/null; if [[ -f $records ]]; then cp "$records" "$out/records.jsonl"; fi' EXIT
extra=()
case ${CROSS_CHECK:-0} in 1) extra+=(--cross-check) ;; all) extra+=(--cross-check-all) ;; esac
[[ ${MEASURE_FILL:-0} == 1 ]] && extra+=(--measure-fill)
[[ -n ${VARIANTS:-} ]] && extra+=(--variants "$VARIANTS")
# shellcheck disable=SC2206  # TUNE_ARGS is a list of arguments
extra+=(${TUNE_ARGS:-})
for cases in "$@"; do
    python3 -m opgen.cli tune "$op" --chip "$chip" --cases "$cases" --trials "$trials" \
        --study-seconds "${STUDY_SECONDS:-$((trials + 10))}" --campaign-seconds "${CAMPAIGN_SECONDS:-300}" \
        --point-timeout "${POINT_TIMEOUT:-60}" --compile-workers "${COMPILE_WORKERS:-8}" --no-progress \
        --devices "${DEVICES:-cuda:0}" --storage ".tune/$chip-$op.journal" "${extra[@]}" 2>&1 \
        | grep -v "A new study created" > "$out/tune_$cases.log"
    tail -30 "$out/tune_$cases.log"
done
if [[ ${BUILD:-1} == 1 ]]; then
    python3 -m opgen.cli build > "$out/build.log" 2>&1 || { tail "$out/build.log"; exit 1; }
    tail -3 "$out/build.log"
fi
