#!/bin/bash
# Gathers into .device/ what a GPU machine's bare image may lack, for tools/gpu_check.sh to use there: the
# header-only libraries (nlohmann/json, stb, doctest, xxHash), OpenMPI's headers and shared libraries, and this
# machine's builds of the GPU programs as a fallback if building there fails. .device/ is kept out of git
# (.git/info/exclude); copy it to the GPU machine with the working tree.
#   usage: bash tools/device_bundle.sh        (then, on the GPU machine: bash tools/gpu_check.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
make -j"$(nproc)" train_cpu train test_gpu bench_gpu bench_comm data
rm -rf .device
mkdir -p .device/include .device/lib .device/bin .device/data
cp -r /usr/include/nlohmann /usr/include/doctest /usr/include/stb /usr/include/xxhash.h .device/include/
cp -r "$(mpicxx --showme:incdirs | cut -d' ' -f1)" .device/mpi_include
for lib in $(ldd ./train | awk '/libmpi|libopen-|libhwloc|libevent/ {print $3}'); do cp -L "$lib" .device/lib/; done
ln -sf libmpi.so.40 .device/lib/libmpi.so
cp train train_cpu test_gpu bench_gpu bench_comm .device/bin/
cp -r data/default .device/data/
grep -qx '/.device/' .git/info/exclude 2>/dev/null || echo '/.device/' >> .git/info/exclude
du -sh .device
