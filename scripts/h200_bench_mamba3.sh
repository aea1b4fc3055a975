#!/usr/bin/env bash
# generated mamba3_mimo_bwd_fwd (frozen H200 table) against its own stage0 on the 11 official
# shapes, on the H200s of DEVICES (wheels in .whl/, see scripts/device_env.sh). Both ops are
# compiled first into Triton's disk cache by WARM_PROCS processes, one share of the cases each, run
# once without a table (stage0's kernels take up to a minute each to compile), then the cases are
# timed side by side, one process per device.
# Usage: bash scripts/h200_bench_mamba3.sh OUT_DIR [DEVICES]   Env: WHERE (a formula of the cases'
# fields, e.g. "chunk_size >= 16": only the cases it passes), WARM_PROCS (11, at most the number of
# cases; 0 skips the warm-up), ROUNDS (2), REPEAT (10).
set -uo pipefail
out=${1:?output dir}; devices=${2:-cuda:0,cuda:1}
mkdir -p "$out"
source scripts/device_env.sh
python3 -m opgen.cli build --check || exit 1
procs=${WARM_PROCS:-11}
first=${devices%%,*}
for ((k = 0; k < procs; k++)); do
    python3 -m opgen.cli bench mamba3_mimo_bwd_fwd --baseline stage0 --cases official --rounds 1 \
        --warmup 0 --repeat 1 --device "$first" --shard "$k/$procs" ${WHERE:+--where "$WHERE"} \
        > "$out/warm_$k.log" 2>&1 &
done
wait
python3 -m opgen.cli bench mamba3_mimo_bwd_fwd --baseline stage0 --cases official \
    --rounds "${ROUNDS:-2}" --repeat "${REPEAT:-10}" --devices "$devices" ${WHERE:+--where "$WHERE"} \
    --output "$out/bench_stage0.txt" --json "$out/bench_stage0.json" 2>&1 | tee "$out/bench_mamba3.log"
