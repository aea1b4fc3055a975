# Sourced by the Nsight Compute scripts (h200_ncu_chunk.sh, h200_ncu_gla.sh).
# ncu_case OUT_DIR NAME REGEX COUNT CMD...: profile CMD's kernels matching REGEX (the full set, the
# source imported), skipping the first COUNT matching launches (the warm-up) and keeping the next
# COUNT; writes OUT_DIR/ncu_NAME_run.log (the run), OUT_DIR/ncu_NAME.txt (details) and
# OUT_DIR/ncu_NAME_source.txt (the SASS source page summarised per opcode by
# scripts/ncu_source_summary.py, or its first 4000 bytes where that fails).
ncu_case() {
    local out=$1 name=$2 regex=$3 count=$4 rep=/tmp/ncu_$2
    shift 4
    ncu --clock-control none --set full --import-source yes -k "regex:$regex" --launch-skip "$count" \
        --launch-count "$count" -f -o "$rep" "$@" > "$out/ncu_${name}_run.log" 2>&1
    ncu -i "$rep.ncu-rep" --page details > "$out/ncu_$name.txt" 2>&1
    ncu -i "$rep.ncu-rep" --page source --csv --print-source sass > "/tmp/ncu_${name}_source.csv" 2>&1
    python3 scripts/ncu_source_summary.py "/tmp/ncu_${name}_source.csv" > "$out/ncu_${name}_source.txt" 2>&1 \
        || head -c 4000 "/tmp/ncu_${name}_source.csv" > "$out/ncu_${name}_source.txt"
}
