# moe.cu build. The only build entry: binaries land in the repository root, objects in build/.
#   make run        install what is missing, prepare the default data, train `small` (on the GPU if there is
#                   one and the CUDA toolkit, else on the CPU), sample
#   make test       install what is missing, build everything (CUDA too), run the CPU tests
#   make train      the GPU trainer ./train          make test-gpu   kernels, step and trainers against the CPU (GPU)
#   make bench      the GPU benchmark (GPU)          make bench-comm dispatch/return vs NCCL all-to-all (GPU)
#   make bench-cpu  train_cpu against the PyTorch reference on this CPU    make bench-io  HF export/import speed
#   make bench-emulated  what the GPU step launches, waits for and moves, counted on the kernel emulator
#   make lab        the kernel lab dev/cuda/ (its README)
#   make fuzz       libFuzzer on every file reader, FUZZ_SECONDS each (fuzz/README.md)

CXX      ?= g++
CXXFLAGS ?= -O3 -march=native -std=c++17 -fopenmp -Wall -Wextra -Wno-unused-parameter -I.
NVCC     ?= /usr/local/cuda/bin/nvcc
NVFLAGS  ?= -O3 -std=c++17 -I. -gencode arch=compute_90a,code=sm_90a -gencode arch=compute_80,code=compute_80
PYTHON   ?= /usr/bin/python3
MPI_CFLAGS = $(shell mpicxx --showme:compile 2>/dev/null)
MPI_LIBS   = $(filter-out -lmpi_cxx,$(shell mpicxx --showme:link 2>/dev/null))
THREADS  ?= $(shell nproc)
# OpenMPI refuses root unless told; more ranks than cores need --oversubscribe
MPIRUN   := mpirun --oversubscribe $(if $(filter 0,$(shell id -u)),--allow-run-as-root)

CORE_SRC := $(wildcard model/*.cpp io/*.cpp comm/*.cpp trainer/*.cpp data/*.cpp) tools/plot.cpp
CORE_OBJ := $(patsubst %.cpp,build/%.o,$(CORE_SRC))
TEST_SRC := $(filter-out test/bench_cpu.cpp test/ep_check.cpp test/bench_io.cpp test/gpu_model_check.cpp \
              test/count_step.cpp,\
              $(wildcard test/*.cpp))
TEST_OBJ := $(patsubst %.cpp,build/%.o,$(TEST_SRC))
HEADERS  := $(wildcard model/*.h io/*.h data/*.h comm/*.h tools/*.h trainer/*.h kernels/*.cuh kernels/*.h fuzz/*.h)
GPU_SRC  := $(wildcard gpu/*.cu)
GPU_HEADERS := $(HEADERS) $(wildcard gpu/*.h)
# what the programs checking the GPU model share (test_gpu and the emulated builds)
GPU_TEST_HEADERS := test/gpu_check.cuh test/device_array.h test/random_model.h test/recompute_check.h
EMULATOR_OBJ := build/test/kernel_emulator/emulator.o build/test/kernel_emulator/checker.o

.PHONY: all deps deps-run data run test test-gpu bench-cpu bench-io bench-comm bench bench-emulated lab fuzz clean

all: train_cpu prepare_data plot test_cpu ep_check test_gpu_emulated gpu_model_emulated_check train_emulated \
     bench_gpu_emulated bench_comm_emulated count_step_emulated

build/%.o: %.cpp $(HEADERS)
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -c $< -o $@

build/comm/mpi_comm.o: comm/mpi_comm.cpp $(HEADERS)
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) $(MPI_CFLAGS) -DOMPI_SKIP_MPICXX=1 -c $< -o $@

train_cpu: build/train_cpu.o $(CORE_OBJ)
	$(CXX) $(CXXFLAGS) $^ -o $@ $(MPI_LIBS)

prepare_data: build/tools/prepare_data.o $(CORE_OBJ)
	$(CXX) $(CXXFLAGS) $^ -o $@ $(MPI_LIBS)

plot: build/tools/plot_main.o $(CORE_OBJ)
	$(CXX) $(CXXFLAGS) $^ -o $@ $(MPI_LIBS)

test_cpu: $(TEST_OBJ) $(CORE_OBJ) $(EMULATOR_OBJ) build/emulated/planted_bugs.o build/fuzz/fuzz_targets.o
	$(CXX) $(CXXFLAGS) $^ -o $@ $(MPI_LIBS)

ep_check: build/test/ep_check.o $(CORE_OBJ)
	$(CXX) $(CXXFLAGS) $^ -o $@ $(MPI_LIBS)

bench_cpu: build/test/bench_cpu.o $(CORE_OBJ)
	$(CXX) $(CXXFLAGS) $^ -o $@ $(MPI_LIBS)

bench_io: build/test/bench_io.o $(CORE_OBJ)
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

# the GPU programs, built by make test where the CUDA toolkit is
CUDA_BUILD := $(if $(wildcard $(NVCC)),train test_gpu bench_gpu bench_comm lab-gpu)
test: deps
	$(MAKE) -j$(THREADS) all data $(CUDA_BUILD)
	@if [ -n "$(CUDA_BUILD)" ]; then tools/kernel_resources.sh build/gpu > build/kernel_resources.txt; status=$$?; \
	   tail -1 build/kernel_resources.txt; grep "SPILLS\|FEWER" build/kernel_resources.txt; exit $$status; \
	 else echo "note: $(NVCC) not found: the GPU code is not built (install the CUDA toolkit)"; fi
	OMP_NUM_THREADS=$(THREADS) ./test_cpu

bench-cpu: deps
	$(MAKE) bench_cpu data
	./bench_cpu --config small --batch 8 --seq 128 --steps 10 --threads $(THREADS)

# Hugging Face export and import of a ~1 GB model against the disk's plain write and read speed
bench-io: deps
	$(MAKE) bench_io
	./bench_io

# ---- the real CUDA kernels on the CPU: the kernel emulator (test/kernel_emulator/) ---------------------------
# g++ compiles the kernels of kernels/ and the GPU model of gpu/ as plain C++ against the emulator's CUDA runtime,
# cuBLASLt and NCCL (searched before the real headers), and test_cpu checks them against the CPU reference.
# -fno-strict-aliasing: the kernels read shared memory through other types (BF16 pairs as 32-bit words).
# The files that hold kernels are compiled with CHECKED: g++ then calls the hazard checker (checker.h) before every
# load and store; -g1 gives its reports source lines. It is a compile flag only: no ThreadSanitizer runtime is linked.
EMULATOR := $(wildcard test/kernel_emulator/*.h test/kernel_emulator/kernels/*.cuh)
build/test/test_kernel_emulator.o $(EMULATOR_OBJ): $(EMULATOR)
build/test/test_kernel_emulator.o: CXXFLAGS += -Itest/kernel_emulator
EMULATOR_FLAGS := $(filter-out -I.,$(CXXFLAGS)) -fno-strict-aliasing -Wno-unknown-pragmas -Itest/kernel_emulator -I.
CHECKED := -fsanitize=thread -g1
EMULATED_GPU_OBJ := $(patsubst gpu/%.cu,build/emulated/gpu/%.o,$(GPU_SRC))
EMULATED_OBJ := $(EMULATED_GPU_OBJ) $(EMULATOR_OBJ)
build/emulated/gpu/%.o: gpu/%.cu $(GPU_HEADERS) $(EMULATOR)
	@mkdir -p $(dir $@)
	$(CXX) $(EMULATOR_FLAGS) $(CHECKED) -x c++ -c $< -o $@
build/emulated/planted_bugs.o: test/kernel_emulator/planted_bugs.cpp $(GPU_HEADERS) $(EMULATOR)
	@mkdir -p $(dir $@)
	$(CXX) $(EMULATOR_FLAGS) $(CHECKED) -c $< -o $@
build/emulated/test/%.o: test/%.cu $(GPU_HEADERS) $(GPU_TEST_HEADERS) $(EMULATOR)
	@mkdir -p $(dir $@)
	$(CXX) $(EMULATOR_FLAGS) $(CHECKED) -x c++ -c $< -o $@
build/emulated/nccl_comm.o: comm/nccl_comm.cu $(EMULATOR) $(HEADERS)
	@mkdir -p $(dir $@)
	$(CXX) $(EMULATOR_FLAGS) $(MPI_CFLAGS) -DOMPI_SKIP_MPICXX=1 -x c++ -c $< -o $@

# test_gpu's kernel, GEMM and step checks
TEST_GPU_EMULATED_OBJ := build/emulated/test/test_gpu_kernels.o build/emulated/test/test_gpu_matmul.o \
                         build/emulated/test/test_gpu_train.o
test_gpu_emulated: $(TEST_GPU_EMULATED_OBJ) test/kernel_emulator/test_gpu_emulated.cpp build/emulated/nccl_comm.o \
                   $(EMULATED_OBJ) $(CORE_OBJ)
	$(CXX) $(EMULATOR_FLAGS) $(TEST_GPU_EMULATED_OBJ) test/kernel_emulator/test_gpu_emulated.cpp \
	  build/emulated/nccl_comm.o $(EMULATED_OBJ) $(CORE_OBJ) -o $@ $(MPI_LIBS)

# the GPU model against the CPU model, alone and under mpirun
gpu_model_emulated_check: test/gpu_model_check.cpp $(EMULATED_OBJ) $(EMULATOR) $(CORE_OBJ) $(GPU_HEADERS) \
                          $(GPU_TEST_HEADERS)
	$(CXX) $(EMULATOR_FLAGS) test/gpu_model_check.cpp $(EMULATED_OBJ) $(CORE_OBJ) -o $@ $(MPI_LIBS)

# the GPU trainer, with the real NCCL Comm over the emulator's NCCL (MPI)
train_emulated: train.cu build/emulated/nccl_comm.o $(EMULATED_OBJ) $(EMULATOR) $(CORE_OBJ) $(GPU_HEADERS)
	$(CXX) $(EMULATOR_FLAGS) -x c++ train.cu -x none build/emulated/nccl_comm.o $(EMULATED_OBJ) $(CORE_OBJ) -o $@ \
	  $(MPI_LIBS)

# make bench's and make bench-comm's programs, run by test_cpu on small shapes
bench_gpu_emulated: test/bench_gpu.cu $(EMULATED_OBJ) $(EMULATOR) $(CORE_OBJ) $(GPU_HEADERS)
	$(CXX) $(EMULATOR_FLAGS) -x c++ test/bench_gpu.cu -x none $(EMULATED_OBJ) $(CORE_OBJ) -o $@ $(MPI_LIBS)

# make bench-emulated: the GPU step's launches, products, host waits and bytes, counted (test/count_step.cpp)
count_step_emulated: test/count_step.cpp build/emulated/nccl_comm.o $(EMULATED_OBJ) $(EMULATOR) $(CORE_OBJ) \
                     $(GPU_HEADERS)
	$(CXX) $(EMULATOR_FLAGS) test/count_step.cpp build/emulated/nccl_comm.o $(EMULATED_OBJ) $(CORE_OBJ) -o $@ \
	  $(MPI_LIBS)

bench-emulated: deps
	$(MAKE) count_step_emulated
	./count_step_emulated --config small --dtype bf16 --steps 4
	./count_step_emulated --config small --dtype fp8 --steps 4
	STAND_IN_GPUS=2 $(MPIRUN) -np 2 ./count_step_emulated --config small --dtype bf16 --steps 4 --ep 2

bench_comm_emulated: test/bench_comm.cu build/emulated/nccl_comm.o $(EMULATED_OBJ) $(EMULATOR) $(CORE_OBJ) $(HEADERS)
	$(CXX) $(EMULATOR_FLAGS) $(MPI_CFLAGS) -DOMPI_SKIP_MPICXX=1 -x c++ test/bench_comm.cu -x none \
	  build/emulated/nccl_comm.o $(EMULATED_OBJ) $(CORE_OBJ) -o $@ $(MPI_LIBS)

# ---- the GPU programs (nvcc; they build anywhere the toolkit is, and run on a GPU) ----------------------------
# Hopper machine code (sm_90a), plus compute_80 PTX that the driver compiles at first start for any other GPU from
# Ampere on, linked with the shared host code.
GPU_OBJ := $(patsubst gpu/%.cu,build/gpu/%.o,$(GPU_SRC))
GPU_LIBS := -Xcompiler -fopenmp -lcublasLt -lnccl $(MPI_LIBS)
build/comm/nccl_comm.o: comm/nccl_comm.cu comm/comm.h
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) $(MPI_CFLAGS) -c $< -o $@
# ptxas's report of each kernel goes to build/gpu/NAME.ptxas and the PTX to build/gpu/NAME.keep/, for
# tools/kernel_resources.sh (make test runs it); anything else nvcc says is printed.
build/gpu/%.o: gpu/%.cu $(GPU_HEADERS)
	@mkdir -p $(dir $@) build/gpu/$*.keep
	@echo "$(NVCC) $(NVFLAGS) -Xptxas -v -keep -keep-dir build/gpu/$*.keep -c $< -o $@ 2> build/gpu/$*.ptxas"
	@$(NVCC) $(NVFLAGS) -Xptxas -v -keep -keep-dir build/gpu/$*.keep -c $< -o $@ 2> build/gpu/$*.ptxas; \
	 status=$$?; grep -v '^ptxas info\|^    [0-9]* bytes stack frame' build/gpu/$*.ptxas >&2; exit $$status

train: train.cu $(GPU_OBJ) build/comm/nccl_comm.o $(CORE_OBJ) $(GPU_HEADERS)
	$(NVCC) $(NVFLAGS) train.cu $(GPU_OBJ) build/comm/nccl_comm.o $(CORE_OBJ) -o $@ $(GPU_LIBS)

# every kernel, the GEMMs, the whole step and the trainers against the CPU reference
TEST_GPU_OBJ := $(patsubst %.cu,build/%.o,test/test_gpu.cu test/test_gpu_kernels.cu test/test_gpu_matmul.cu \
                  test/test_gpu_train.cu)
build/test/%.o: test/%.cu $(GPU_HEADERS) $(GPU_TEST_HEADERS)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -c $< -o $@
test_gpu: $(TEST_GPU_OBJ) $(GPU_OBJ) build/comm/nccl_comm.o $(CORE_OBJ)
	$(NVCC) $(NVFLAGS) $^ -o $@ $(GPU_LIBS)

test-gpu: deps
	$(MAKE) -j$(THREADS) train_cpu train test_gpu data
	./test_gpu

# Expert-parallel dispatch and return bandwidth (GB/s) against NCCL's all-to-all on the same bytes. One rank alone,
# or BENCH_RANKS=N for mpirun -np N (one rank per GPU).
BENCH_COMM_OBJ := build/comm/nccl_comm.o build/model/expert_plan.o build/comm/comm.o build/comm/mpi_comm.o
bench_comm: test/bench_comm.cu $(BENCH_COMM_OBJ) $(HEADERS)
	$(NVCC) $(NVFLAGS) test/bench_comm.cu $(BENCH_COMM_OBJ) -o $@ -lnccl $(MPI_LIBS)

bench-comm: bench_comm
	$(if $(BENCH_RANKS),mpirun -np $(BENCH_RANKS) ./bench_comm,./bench_comm)

# DeepSeek-V2-Lite shapes with as many layers as fit, B 2 x T 4096: tokens/s, model TFLOP/s, MFU, the per-region
# step time, the memory-bound kernels' GB/s and the measured ceilings they are read against. ./bench_gpu --help.
bench_gpu: test/bench_gpu.cu $(GPU_OBJ) $(CORE_OBJ) $(GPU_HEADERS)
	$(NVCC) $(NVFLAGS) test/bench_gpu.cu $(GPU_OBJ) $(CORE_OBJ) -o $@ $(GPU_LIBS)

bench: bench_gpu
	./bench_gpu

# ---- the kernel lab --------------------------------------------------------------------------------------------
# ---- fuzzing (fuzz/README.md): the file readers under libFuzzer, AddressSanitizer and UBSan, built by clang ----
FUZZ_CXX     ?= clang++
FUZZ_FLAGS   := -g -O1 -std=c++17 -I. -fsanitize=address,undefined -fno-sanitize-recover=undefined -Wno-unknown-pragmas
FUZZ_SECONDS ?= 60
FUZZ_OBJ     := $(patsubst %.cpp,build/fuzz_clang/%.o,$(CORE_SRC) fuzz/fuzz_targets.cpp fuzz/libfuzzer_main.cpp)
build/fuzz_clang/%.o: %.cpp $(HEADERS)
	@mkdir -p $(dir $@)
	$(FUZZ_CXX) $(FUZZ_FLAGS) -fsanitize=fuzzer-no-link $(MPI_CFLAGS) -DOMPI_SKIP_MPICXX=1 -c $< -o $@
build/fuzz_clang/moe_fuzz: $(FUZZ_OBJ)
	$(FUZZ_CXX) $(FUZZ_FLAGS) -fsanitize=fuzzer $^ -o $@ $(MPI_LIBS)
build/write_seeds: build/fuzz/write_seeds.o build/fuzz/fuzz_targets.o $(CORE_OBJ)
	$(CXX) $(CXXFLAGS) $^ -o $@ $(MPI_LIBS)
fuzz:
	@./tools/install_deps.sh fuzz
	$(MAKE) -j$(THREADS) build/fuzz_clang/moe_fuzz build/write_seeds
	tools/fuzz.sh

lab:
	$(MAKE) -C dev/cuda
lab-gpu:
	$(MAKE) -C dev/cuda gpu

clean:
	rm -rf build train_cpu prepare_data plot test_cpu ep_check bench_cpu bench_io train test_gpu bench_gpu bench_comm \
	  test_gpu_emulated gpu_model_emulated_check train_emulated bench_gpu_emulated bench_comm_emulated count_step_emulated
	$(MAKE) -C dev/cuda clean
