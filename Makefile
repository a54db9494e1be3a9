# moe.cu build. The only build entry: binaries land in the repository root, objects in build/.
#   make run        install what is missing, prepare the default data, train `small` (on the GPU if there is
#                   one and the CUDA toolkit, else on the CPU), sample
#   make test       install what is missing, build everything (CUDA too), run the CPU tests
#   make train      the GPU trainer ./train          make test-gpu   kernels, step and trainers against the CPU (GPU)
#   make bench      the GPU benchmark (GPU)          make bench-comm dispatch/combine vs NCCL all-to-all (GPU)
#   make bench-cpu  train_cpu against the PyTorch reference on this CPU    make bench-io  HF export/import speed

CXX      ?= g++
CXXFLAGS ?= -O3 -march=native -std=c++17 -fopenmp -Wall -Wextra -Wno-unused-parameter -I.
NVCC     ?= /usr/local/cuda/bin/nvcc
NVFLAGS  ?= -O3 -std=c++17 -I. -gencode arch=compute_90a,code=sm_90a -gencode arch=compute_80,code=compute_80
PYTHON   ?= /usr/bin/python3
MPI_CFLAGS = $(shell mpicxx --showme:compile 2>/dev/null)
MPI_LIBS   = $(filter-out -lmpi_cxx,$(shell mpicxx --showme:link 2>/dev/null))
THREADS  ?= $(shell nproc)

CORE_SRC := $(wildcard model/*.cpp) $(filter-out data/prepare.cpp,$(wildcard data/*.cpp)) $(wildcard comm/*.cpp) \
            $(filter-out tools/%_main.cpp,$(wildcard tools/*.cpp)) $(wildcard trainer/*.cpp)
CORE_OBJ := $(patsubst %.cpp,build/%.o,$(CORE_SRC))
TEST_SRC := $(filter-out test/bench_cpu.cpp test/ep_check.cpp test/bench_io.cpp test/gpu_model_cpu_check.cpp,$(wildcard test/*.cpp))
TEST_OBJ := $(patsubst %.cpp,build/%.o,$(TEST_SRC))
HEADERS  := $(wildcard model/*.h data/*.h comm/*.h tools/*.h trainer/*.h kernels/*.cuh kernels/*.h)
# what the programs checking gpu/gpu_model.cu share (test_gpu, and its stand-in and emulated builds)
GPU_TEST_HEADERS := test/gpu_check.cuh test/random_model.h test/recompute_check.h

.PHONY: all deps deps-run data run test test-gpu bench-cpu bench-io bench-comm bench clean

all: train_cpu prepare_data test_cpu ep_check gpu_model_cpu_check train_stand_in test_gpu_emulated \
     gpu_model_emulated_check train_emulated bench_gpu_emulated bench_comm_emulated \
     $(if $(wildcard tools/plot_main.cpp),plot)

build/%.o: %.cpp $(HEADERS)
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -c $< -o $@

build/comm/mpi_comm.o: comm/mpi_comm.cpp $(HEADERS)
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) $(MPI_CFLAGS) -DOMPI_SKIP_MPICXX=1 -c $< -o $@

train_cpu: build/train_cpu.o $(CORE_OBJ)
	$(CXX) $(CXXFLAGS) $^ -o $@ $(MPI_LIBS)

prepare_data: build/data/prepare.o $(CORE_OBJ)
	$(CXX) $(CXXFLAGS) $^ -o $@ $(MPI_LIBS)

plot: build/tools/plot_main.o $(CORE_OBJ)
	$(CXX) $(CXXFLAGS) $^ -o $@ $(MPI_LIBS)

test_cpu: $(TEST_OBJ) $(CORE_OBJ) build/test/kernel_emulator/emulator.o
	$(CXX) $(CXXFLAGS) $^ -o $@ $(MPI_LIBS)

# The system packages the build, tests and run need (Debian names); installed only when missing.
deps:
	@./tools/install_deps.sh test

deps-run:
	@./tools/install_deps.sh run

# Default data: the license texts every Debian system ships in /usr/share/common-licenses (base-files).
data/default/train_000000.bin: prepare_data
	./prepare_data --input /usr/share/common-licenses --out-dir data/default --vocab 1024

data: data/default/train_000000.bin

# The main job, with the same flags on either trainer: on the GPU when nvidia-smi lists one from Ampere on (compute
# capability 8.0+, what ./train runs on) and ./train builds here (nvcc, cuBLASLt, NCCL), else on the CPU
RUN_ARGS := --config small --data 'data/default/train_*.bin' --val 'data/default/val_*.bin' --steps 400 --batch 8 \
            --seq 128 --lr 3e-3 --eval-every 50 --log run.jsonl --sample 200
run: deps-run
	$(MAKE) -j$(THREADS) data
	@major=$$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | cut -d. -f1); \
	if [ "$${major:-0}" -ge 8 ] 2>/dev/null && command -v $(NVCC) > /dev/null && $(MAKE) -j$(THREADS) train; then \
	  echo "make run: training on the GPU (./train)"; \
	  ./train $(RUN_ARGS); \
	else \
	  $(MAKE) -j$(THREADS) train_cpu && OMP_NUM_THREADS=$(THREADS) ./train_cpu $(RUN_ARGS); \
	fi

test: deps
	$(MAKE) -j$(THREADS) all data
	@if [ -x $(NVCC) ]; then $(MAKE) -j$(THREADS) train test_gpu bench_gpu bench_comm; else echo "note: $(NVCC) not found: the GPU code is not built (install the CUDA toolkit)"; fi
	OMP_NUM_THREADS=$(THREADS) ./test_cpu

bench_io: build/test/bench_io.o $(CORE_OBJ)
	$(CXX) $(CXXFLAGS) $^ -o $@ $(MPI_LIBS)

# Hugging Face export and import of a ~1 GB model against the disk's plain write and read speed
bench-io: deps
	$(MAKE) bench_io
	./bench_io

ep_check: build/test/ep_check.o $(CORE_OBJ)
	$(CXX) $(CXXFLAGS) $^ -o $@ $(MPI_LIBS)

# The GPU model's orchestration on the CPU: gpu/gpu_model.cu compiled as C++ against the host stand-ins of the CUDA
# runtime and the kernels' launchers in test/cpu_stand_in/ (searched before the real kernels/; -I. filtered out of
# CXXFLAGS to keep that order), checked against the CPU model by test_cpu (test/test_gpu_model_cpu.cpp).
STAND_IN := $(wildcard test/cpu_stand_in/*.h test/cpu_stand_in/kernels/*.cuh)
gpu_model_cpu_check: test/gpu_model_cpu_check.cpp gpu/gpu_model.cu gpu/gpu_model.h $(STAND_IN) $(CORE_OBJ) $(HEADERS) \
                     $(GPU_TEST_HEADERS)
	$(CXX) $(filter-out -I.,$(CXXFLAGS)) -Itest/cpu_stand_in -I. -x c++ gpu/gpu_model.cu -x none \
	  test/gpu_model_cpu_check.cpp $(CORE_OBJ) -o $@ $(MPI_LIBS)

# The GPU trainer on the CPU: train.cu compiled as C++ against the same stand-ins, with make_nccl_comm standing in
# as the host Comm (single process, or MPI under mpirun), so test_cpu runs the GPU trainer's checks against
# train_cpu (test/test_train_stand_in.cpp): the GpuBackend, its load/store placement, logs, checkpoints, sampling.
train_stand_in: train.cu gpu/gpu_model.cu gpu/gpu_model.h test/cpu_stand_in/nccl_comm_stand_in.cpp $(STAND_IN) \
                $(CORE_OBJ) $(HEADERS)
	$(CXX) $(filter-out -I.,$(CXXFLAGS)) -Itest/cpu_stand_in -I. -x c++ train.cu gpu/gpu_model.cu -x none \
	  test/cpu_stand_in/nccl_comm_stand_in.cpp $(CORE_OBJ) -o $@ $(MPI_LIBS)

# The real kernels on the CPU, through the kernel emulator (test/kernel_emulator/: the emulated launch, searched
# before the real kernels/, and a CPU model of cuBLASLt under the real kernels/matmul.cuh), run by test_cpu:
# test_gpu's kernel and GEMM checks and gpu_model_cpu_check's comparison of gpu/gpu_model.cu with the CPU model
# (test/test_kernel_emulator.cpp), and the GPU trainer train.cu against train_cpu (test/test_train_stand_in.cpp).
EMULATOR := $(wildcard test/kernel_emulator/*.h test/kernel_emulator/kernels/*.cuh) $(STAND_IN)
# -fno-strict-aliasing: the kernels read shared memory through other types (BF16 pairs as 32-bit words), as CUDA
# code does
EMULATOR_FLAGS := $(filter-out -I.,$(CXXFLAGS)) -fno-strict-aliasing -Wno-unknown-pragmas -Itest/kernel_emulator -I.
# the model and the NCCL Comm on the emulator, compiled once for the programs below
EMULATED_OBJ := build/emulated/gpu_model.o build/test/kernel_emulator/emulator.o
build/emulated/gpu_model.o: gpu/gpu_model.cu gpu/gpu_model.h $(EMULATOR) $(HEADERS)
	@mkdir -p $(dir $@)
	$(CXX) $(EMULATOR_FLAGS) -x c++ -c $< -o $@
build/emulated/nccl_comm.o: comm/nccl_comm.cu $(EMULATOR) $(HEADERS)
	@mkdir -p $(dir $@)
	$(CXX) $(EMULATOR_FLAGS) $(MPI_CFLAGS) -DOMPI_SKIP_MPICXX=1 -x c++ -c $< -o $@

test_gpu_emulated: test/test_gpu_kernels.cu test/test_gpu_matmul.cu test/test_gpu_train.cu $(GPU_TEST_HEADERS) \
                   test/kernel_emulator/test_gpu_emulated.cpp build/emulated/nccl_comm.o $(EMULATED_OBJ) $(EMULATOR) \
                   $(CORE_OBJ) $(HEADERS)
	$(CXX) $(EMULATOR_FLAGS) -x c++ test/test_gpu_kernels.cu test/test_gpu_matmul.cu test/test_gpu_train.cu \
	  -x none test/kernel_emulator/test_gpu_emulated.cpp build/emulated/nccl_comm.o $(EMULATED_OBJ) $(CORE_OBJ) -o $@ \
	  $(MPI_LIBS)

train_emulated: train.cu build/emulated/nccl_comm.o $(EMULATED_OBJ) $(EMULATOR) $(CORE_OBJ) $(HEADERS)
	$(CXX) $(EMULATOR_FLAGS) -x c++ train.cu -x none build/emulated/nccl_comm.o $(EMULATED_OBJ) $(CORE_OBJ) -o $@ \
	  $(MPI_LIBS)

gpu_model_emulated_check: test/gpu_model_cpu_check.cpp $(EMULATED_OBJ) $(EMULATOR) $(CORE_OBJ) $(HEADERS) \
                          $(GPU_TEST_HEADERS)
	$(CXX) $(EMULATOR_FLAGS) test/gpu_model_cpu_check.cpp $(EMULATED_OBJ) $(CORE_OBJ) -o $@ $(MPI_LIBS)

# make bench's and make bench-comm's programs on the emulator, run by test_cpu on small shapes (bench_gpu --smoke;
# bench_comm under mpirun, through the NCCL model): every line of the benchmarks runs before a GPU session does.
bench_gpu_emulated: test/bench_gpu.cu $(EMULATED_OBJ) $(EMULATOR) $(CORE_OBJ) $(HEADERS)
	$(CXX) $(EMULATOR_FLAGS) -x c++ test/bench_gpu.cu -x none $(EMULATED_OBJ) $(CORE_OBJ) -o $@ $(MPI_LIBS)

bench_comm_emulated: test/bench_comm.cu build/emulated/nccl_comm.o $(EMULATED_OBJ) $(EMULATOR) $(CORE_OBJ) $(HEADERS)
	$(CXX) $(EMULATOR_FLAGS) $(MPI_CFLAGS) -DOMPI_SKIP_MPICXX=1 -x c++ test/bench_comm.cu -x none \
	  build/emulated/nccl_comm.o $(EMULATED_OBJ) $(CORE_OBJ) -o $@ $(MPI_LIBS)

bench_cpu: build/test/bench_cpu.o $(CORE_OBJ)
	$(CXX) $(CXXFLAGS) $^ -o $@ $(MPI_LIBS)

bench-cpu: deps
	$(MAKE) bench_cpu data
	./bench_cpu --config small --batch 8 --seq 128 --steps 10 --threads $(THREADS)

clean:
	rm -rf build train_cpu prepare_data test_cpu test_gpu bench_cpu bench_io bench_comm bench_gpu ep_check plot train \
	  gpu_model_cpu_check train_stand_in test_gpu_emulated gpu_model_emulated_check train_emulated bench_gpu_emulated \
	  bench_comm_emulated

# GPU trainer: CUDA code compiled with nvcc for Hopper (sm_90a), plus compute_80 PTX that the driver compiles, at
# first start, for any other GPU from Ampere on (A100, RTX 30xx/40xx, L40S, Blackwell), linked with the shared host
# code. It builds anywhere the toolkit is; running it needs a GPU.
GPU_HEADERS := $(HEADERS) $(wildcard gpu/*.h)
GPU_LIBS := -Xcompiler -fopenmp -lcublasLt -lnccl $(MPI_LIBS)
build/comm/nccl_comm.o: comm/nccl_comm.cu comm/comm.h
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) $(MPI_CFLAGS) -c $< -o $@
build/gpu/%.o: gpu/%.cu $(GPU_HEADERS)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -c $< -o $@

train: train.cu build/gpu/gpu_model.o build/comm/nccl_comm.o $(CORE_OBJ) $(GPU_HEADERS)
	$(NVCC) $(NVFLAGS) train.cu build/gpu/gpu_model.o build/comm/nccl_comm.o $(CORE_OBJ) -o $@ $(GPU_LIBS)

# GPU tests: every kernel, the GEMMs, the whole step and the trainers against the CPU reference (one object per
# file, so make -j compiles them at once)
TEST_GPU_OBJ := $(patsubst %.cu,build/%.o,test/test_gpu.cu test/test_gpu_kernels.cu test/test_gpu_matmul.cu \
                  test/test_gpu_train.cu)
build/test/%.o: test/%.cu $(GPU_HEADERS) $(GPU_TEST_HEADERS)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -c $< -o $@
test_gpu: $(TEST_GPU_OBJ) build/gpu/gpu_model.o build/comm/nccl_comm.o $(CORE_OBJ)
	$(NVCC) $(NVFLAGS) $^ -o $@ $(GPU_LIBS)

test-gpu: deps
	$(MAKE) -j$(THREADS) train_cpu train test_gpu data
	./test_gpu

# Expert-parallel dispatch and combine bandwidth (GB/s) against NCCL's all-to-all on the same bytes (needs a GPU;
# builds anywhere with the toolkit). One rank alone, or BENCH_RANKS=N for mpirun -np N (one rank per GPU).
BENCH_COMM_OBJ := build/comm/nccl_comm.o build/comm/expert_plan.o build/comm/comm.o build/comm/mpi_comm.o
bench_comm: test/bench_comm.cu $(BENCH_COMM_OBJ) $(HEADERS)
	$(NVCC) $(NVFLAGS) test/bench_comm.cu $(BENCH_COMM_OBJ) -o $@ -lnccl $(MPI_LIBS)

bench-comm: bench_comm
	$(if $(BENCH_RANKS),mpirun -np $(BENCH_RANKS) ./bench_comm,./bench_comm)

# The GPU benchmark (needs a GPU; builds anywhere with the toolkit): DeepSeek-V2-Lite shapes with as many layers as
# fit, B 2 x T 4096: tokens/s, model TFLOP/s, MFU, the per-region step time, the memory-bound kernels' GB/s, and the
# measured copy and BF16 GEMM ceilings they are read against. ./bench_gpu --help for the overrides.
bench_gpu: test/bench_gpu.cu build/gpu/gpu_model.o $(CORE_OBJ) $(GPU_HEADERS)
	$(NVCC) $(NVFLAGS) test/bench_gpu.cu build/gpu/gpu_model.o $(CORE_OBJ) -o $@ $(GPU_LIBS)

bench: bench_gpu
	./bench_gpu
