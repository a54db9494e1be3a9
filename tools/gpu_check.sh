#!/bin/bash
# The first check on a machine with a GPU: builds everything there, runs `make test-gpu`'s program, the benchmark
# and the communication benchmark, and prints a short table. Results go to $OUT (or ./gpu_results) as text files,
# to be copied into docs/performance.md with the date, the commit and the machine.
#   on a machine with the repository:  bash tools/device_bundle.sh   (what a bare CUDA image may lack, into .device/)
#   on the GPU machine, with .device/: bash tools/gpu_check.sh
# A bare CUDA image has nvcc and NCCL but not Debian's MPI or the header-only libraries: they come from .device/.
# If the build fails there, the binaries built beforehand (.device/bin) are tried instead.
# Every stage runs under a timeout cut to what is left of GPU_CHECK_SECONDS (default 540), so the summary prints
# even when a stage hangs; the stages come in order of importance: correctness, speed, communication, then
# compute-sanitizer's memcheck and racecheck of every kernel and the whole step on the small shapes of
# `bench_gpu --smoke`. The results are a few text files in $OUT.
set -u -o pipefail
out=${OUT:-gpu_results}
mkdir -p "$out"
root=$PWD
make_flags=()
if [ -d .device ]; then
    export CPATH="$root/.device/include${CPATH:+:$CPATH}"
    export LIBRARY_PATH="$root/.device/lib${LIBRARY_PATH:+:$LIBRARY_PATH}"
    export LD_LIBRARY_PATH="$root/.device/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    command -v mpicxx > /dev/null ||
        make_flags+=("MPI_CFLAGS=-I$root/.device/mpi_include -I$root/.device/mpi_include/openmpi" "MPI_LIBS=-lmpi")
    [ -d data/default ] || cp -r .device/data/default data/
fi
if [ ! -e /usr/local/cuda/include/nccl.h ]; then  # NCCL from the image's Python wheel (nvidia-nccl-cu13)
    nccl=$(python3 -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__))' 2> /dev/null)
    if [ -n "$nccl" ]; then
        export CPATH="$nccl/include${CPATH:+:$CPATH}" LIBRARY_PATH="$nccl/lib${LIBRARY_PATH:+:$LIBRARY_PATH}"
        export LD_LIBRARY_PATH="$nccl/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
        [ -e "$nccl/lib/libnccl.so" ] || ln -sf libnccl.so.2 "$nccl/lib/libnccl.so" 2> /dev/null
    fi
fi
{
    echo "date: $(date -u +%Y-%m-%dT%H:%MZ)  commit: $(git rev-parse --short HEAD 2> /dev/null || echo unknown)"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1
    /usr/local/cuda/bin/nvcc --version | tail -1
    echo "make flags: ${make_flags[*]:-none}"
} | tee "$out/environment.txt"

status() { printf '%-20s %s\n' "$1" "$2" | tee -a "$out/summary.txt"; }
: > "$out/summary.txt"
deadline=${GPU_CHECK_SECONDS:-540}
# seconds for the next stage: at most $1, and never past the deadline (at least 1: timeout 0 would mean none)
budget() {
    local left=$((deadline - SECONDS))
    [ "$left" -lt "$1" ] && echo $((left > 1 ? left : 1)) || echo "$1"
}
targets=(train_cpu train test_gpu bench_gpu bench_comm)
[ -d data/default ] || targets+=(data)  # the trainer checks of test_gpu train on the default data
if timeout "$(budget 300)" make -j"$(nproc)" "${make_flags[@]}" "${targets[@]}" > "$out/build.txt" 2>&1; then
    status "build" "ok (built here, ${SECONDS} s)"
elif [ -d .device/bin ]; then
    tail -20 "$out/build.txt"
    cp .device/bin/* .
    status "build" "FAILED here (build.txt); running the binaries carried in .device/bin"
else
    tail -30 "$out/build.txt"
    status "build" "FAILED (build.txt)"
    exit 1
fi
# cuBLASLt's error log (level 1) says why it refuses a problem, e.g. an FP8 shape (docs/performance.md, 2026-12-02)
CUBLASLT_LOG_LEVEL=1 timeout "$(budget 200)" ./test_gpu > "$out/test_gpu.txt" 2>&1
grep -E "FAIL|^tests:|error" "$out/test_gpu.txt" | head -40
status "make test-gpu" "$(grep '^tests:' "$out/test_gpu.txt" || echo 'no result line (crashed or timed out)')"
status "FP8 shapes refused" "$(grep -c 'no FP8 algorithm' "$out/test_gpu.txt") (each ran in BF16; test_gpu.txt names them)"
# 4 layers (1 dense + 3 MoE, a 58 GiB plan) rather than the fit: the fit reads the host RAM from MemTotal, which on
# some cloud machines starts far below what they grow to, and a smaller host init stays inside the stage's budget;
# the per-token figures hardly depend on the layer count.
timeout "$(budget 150)" ./bench_gpu --layers 4 > "$out/bench.txt" 2>&1
cat "$out/bench.txt"
status "make bench" "$(grep -E 'model TFLOP/s|MFU' "$out/bench.txt" | head -2 | tr -s ' ' | tr '\n' ';')"
status "attention kernels" "$(grep -E '^(bf16 tensor, [48] warps|fp32 CUDA cores)' "$out/bench.txt" | tr -s ' ' | tr '\n' ';')"
status "expert GEMMs" "$(grep -E '^[0-9]+ experts, ' "$out/bench.txt" | tr -s ' ' | tr '\n' ';')"
# --dtype fp8 (its GEMM table, then its step), appended to bench.txt to keep the results few
timeout "$(budget 120)" ./bench_gpu --layers 4 --dtype fp8 --steps 3 > "$out/bench_fp8.txt" 2>&1
{ echo "==== ./bench_gpu --layers 4 --dtype fp8 --steps 3"; cat "$out/bench_fp8.txt"; } | tee -a "$out/bench.txt"
status "FP8 GEMMs" "$(sed -n '/^GEMM, FP8/,/^fwd =/p' "$out/bench_fp8.txt" | grep -E '^(square|dense|[0-9]+ experts)' |
    tr -s ' ' | tr '\n' ';')"
status "make bench (fp8)" "$(grep -E 'model TFLOP/s|MFU' "$out/bench_fp8.txt" | head -2 | tr -s ' ' | tr '\n' ';')"
rm -f "$out/bench_fp8.txt"
timeout "$(budget 45)" ./bench_comm > "$out/bench_comm.txt" 2>&1
cat "$out/bench_comm.txt"
status "make bench-comm" "$(grep -E '^(ncclAlltoAll|dispatch|return)' "$out/bench_comm.txt" | tr -s ' ' | tr '\n' ';')"
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for tool in memcheck racecheck; do  # out-of-bounds accesses; shared-memory races (the attention kernels' barriers)
    timeout "$(budget 90)" "$sanitizer" --tool "$tool" ./bench_gpu --smoke > "$out/$tool.txt" 2>&1
    status "$tool (smoke)" \
        "$(grep -E 'ERROR SUMMARY' "$out/$tool.txt" || echo 'no summary (not run, crashed or timed out)')"
done
echo
echo "total ${SECONDS} s"
cat "$out/summary.txt"
