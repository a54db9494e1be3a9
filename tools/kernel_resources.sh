#!/usr/bin/env bash
# Registers, spills and shared memory of every kernel the trainer builds for sm_90a, from what ptxas reported when
# make compiled gpu/*.cu (build/gpu/NAME.ptxas) and the launch bounds in the PTX it compiled (build/gpu/NAME.keep/).
# Fails on a spill, or on a kernel of which fewer blocks fit on an SM than its __launch_bounds__ ask for (at least
# one of its maximum size). H100/H200 per SM: 65536 registers in units of 256 per warp, 64 warps, 32 blocks,
# 228 KiB of shared memory with 1 KiB reserved per block.
#   tools/kernel_resources.sh [build/gpu]      prints one line per kernel, then "kernel resources: N kernels, ..."
set -euo pipefail
dir=${1:-build/gpu}
shopt -s nullglob
logs=("$dir"/*.ptxas)
if [ ${#logs[@]} -eq 0 ]; then
    echo "kernel_resources: no ptxas reports in $dir (build the GPU code first: make train)" >&2
    exit 2
fi
for log in "${logs[@]}"; do
    name=$(basename "$log" .ptxas)
    cat "$dir/$name.keep/$name.compute_90a.ptx" 2>/dev/null | awk '
        /\.entry / { entry = $0; sub(/.*\.entry /, "", entry); sub(/\(.*/, "", entry) }
        /\.maxntid/ { split($0, n, /[ ,]+/); bounds[entry] = n[2] * (n[3] ? n[3] : 1) * (n[4] ? n[4] : 1) }
        /\.minnctapersm/ { split($0, n, /[ ,]+/); blocks[entry] = n[2] }
        END { for (e in bounds) print "bounds", e, bounds[e], (e in blocks ? blocks[e] : 1) }'
    cat "$log"
done | awk '
    $1 == "bounds" { max_threads[$2] = $3; min_blocks[$2] = $4; next }
    /Compiling entry function/ { kernel = $0; sub(/.*function .\047?/, "", kernel); sub(/\047.*/, "", kernel);
                                 seen[kernel] = 1; next }
    /bytes spill stores/ { spill[kernel] = $5 + $9; next }
    /Used [0-9]+ registers/ { for (i = 1; i <= NF; i++) {
                                  if ($(i + 1) == "registers,") regs[kernel] = $i
                                  if ($(i + 1) == "bytes" && $(i + 2) == "smem") smem[kernel] = $i } }
    END {
        bad = 0; n = 0
        for (k in seen) {
            n++
            line = sprintf("%4d registers %6d bytes smem %5d bytes spilled", regs[k], smem[k], spill[k])
            if (k in max_threads) {
                warps = int((max_threads[k] + 31) / 32)
                per_warp = int((regs[k] * 32 + 255) / 256) * 256
                fit = per_warp > 0 ? int(65536 / (per_warp * warps)) : 32
                by_smem = int(233472 / (smem[k] + 1024)); if (by_smem < fit) fit = by_smem
                by_warps = int(64 / warps); if (by_warps < fit) fit = by_warps
                if (fit > 32) fit = 32
                line = line sprintf("  bounds %4d threads x %d blocks: %2d fit", max_threads[k], min_blocks[k], fit)
                if (fit < min_blocks[k]) { line = line "  FEWER BLOCKS THAN ITS BOUNDS"; bad++ }
            }
            if (spill[k] > 0) { line = line "  SPILLS"; bad++ }
            print line "  " k
        }
        printf "kernel resources: %d kernels for sm_90a, %d with a spill or too few resident blocks\n", n, bad
        exit bad > 0
    }'
