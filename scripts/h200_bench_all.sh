#!/usr/bin/env bash
# The two benchmarks on a host with two H200s (wheels in .whl/, see scripts/device_env.sh), each
# case side by side in one process, the cases shared over the GPUs of DEVICES:
#   chunk_gla_fwd_o_gk (frozen H200 table) against FLA 0.6.0 on the bench_fla cases;
#   mamba3_mimo_bwd_fwd (frozen H200 table) against its own stage0 on the 11 official shapes.
# Usage: bash scripts/h200_bench_all.sh OUT_DIR [DEVICES] [OPS]   (OPS: "gla mamba3", the default, or one)
set -uo pipefail
out=${1:?output dir}; devices=${2:-cuda:0,cuda:1}; ops=${3:-gla mamba3}
source scripts/device_env.sh
python3 -m opgen.cli build --check || exit 1
[[ " $ops " == *" gla "* ]] && python3 -m opgen.cli bench chunk_gla_fwd_o_gk --baseline fla --cases bench_fla \
    --devices "$devices" --output "$out/bench_fla.txt" > "$out/bench_fla.log" 2>&1
[[ " $ops " == *" mamba3 "* ]] && python3 -m opgen.cli bench mamba3_mimo_bwd_fwd --baseline stage0 --cases official --rounds 3 --repeat 15 \
    --devices "$devices" --output "$out/bench_stage0.txt" > "$out/bench_mamba3.log" 2>&1
tail -3 "$out"/bench_*.log
cat "$out"/bench_*.txt
