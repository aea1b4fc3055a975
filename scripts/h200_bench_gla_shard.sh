#!/usr/bin/env bash
# One share of the chunk_gla_fwd_o_gk benchmark (frozen H200 table against FLA 0.6.0, bench_fla
# cases) on one H200 (wheels in .whl/, see scripts/device_env.sh), for runs kept short: FLA
# autotunes ~30 s per new shape, so the 22 cases take about 11 minutes on one GPU. Writes
# OUT_DIR/shardK.json; join the shares with
#   opgen bench chunk_gla_fwd_o_gk --baseline fla --cases bench_fla --merge shard0.json ... --output T
# Usage: bash scripts/h200_bench_gla_shard.sh OUT_DIR K/N   (K counts from 0; the committed table
# joins 0/3, 1/3 and 2/3, 180-260 s each)
set -uo pipefail
out=${1:?output dir}; share=${2:?K/N}
source scripts/device_env.sh
python3 -m opgen.cli build --check || exit 1
k=${share%/*}
python3 -m opgen.cli bench chunk_gla_fwd_o_gk --baseline fla --cases bench_fla --shard "$share" \
    --json "$out/shard$k.json" > "$out/bench_fla_shard$k.log" 2>&1
cat "$out/bench_fla_shard$k.log"
