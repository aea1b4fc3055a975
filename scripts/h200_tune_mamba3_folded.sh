#!/usr/bin/env bash
# Tune the rank-folded mamba3_mimo_bwd_fwd variants on one H200 over the official shapes with and
# without the Z gate. The records file is copied to OUT_DIR every 15 s and at the end (so a run cut
# short keeps what it measured); copy it back to records/h200/ and run `opgen build` to freeze it.
# Usage: bash scripts/h200_tune_mamba3_folded.sh OUT_DIR [SECONDS per case set] [TRIALS per study]
#        [VARIANTS] (needs the wheels of scripts/device_env.sh). BENCH=1: then `opgen build` here
#        and the frozen table against TileLang compiled per case (scripts/h200_mamba3_vs_tilelang.sh
#        with BASELINES=tilelang_static into OUT_DIR/bench, packed into OUT_DIR/bench.tgz after
#        each table); commit the records with the table their build writes, which is what it measured.
set -uo pipefail
out=${1:?output dir}; seconds=${2:-200}; trials=${3:-8}
variants=${4:-fold_static_separate,split_static_separate}
mkdir -p "$out" .tune
source scripts/device_env.sh
python3 -m opgen.cli build --check || exit 1
(while sleep 15; do cp records/h200/mamba3_mimo_bwd_fwd.jsonl "$out/"; done) &
keeper=$!
trap 'kill $keeper 2>/dev/null' EXIT
for cases in official_z official; do
    python3 -m opgen.cli tune mamba3_mimo_bwd_fwd --chip h200 --cases "$cases" --variants "$variants" \
        --trials "$trials" --warmup 2 --repeat 5 --study-seconds 12 --point-timeout 40 \
        --campaign-seconds "$seconds" --compile-workers 14 --no-progress \
        --storage .tune/h200-mamba3_mimo_bwd_fwd.journal 2>&1 \
        | grep -v "A new study created" > "$out/tune_mamba3_$cases.log"
    tail -15 "$out/tune_mamba3_$cases.log"
done
cp records/h200/mamba3_mimo_bwd_fwd.jsonl "$out/"
if [[ ${BENCH:-0} == 1 ]]; then
    python3 -m opgen.cli build > "$out/build.log" 2>&1 || { tail -5 "$out/build.log"; exit 1; }
    BASELINES=tilelang_static PACK="$out/bench.tgz" bash scripts/h200_mamba3_vs_tilelang.sh "$out/bench"
fi
