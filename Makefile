# moe.cu build. The only build entry: binaries land in the repository root, objects in build/.
#   make run        install what is missing, prepare the default data, train `small` on CPU, sample
#   make test       install what is missing, build everything (CUDA too), run the CPU tests
#   make train      the GPU trainer ./train          make test-gpu   the CUDA kernels against the CPU reference
#   make bench-cpu  train_cpu against the PyTorch reference on this CPU    make bench-io  HF export/import speed

CXX      ?= g++
CXXFLAGS ?= -O3 -march=native -std=c++17 -fopenmp -Wall -Wextra -Wno-unused-parameter -I.
NVCC     ?= /usr/local/cuda/bin/nvcc
NVFLAGS  ?= -O3 -std=c++17 -I. -gencode arch=compute_90a,code=sm_90a -gencode arch=compute_90,code=compute_90
PYTHON   ?= /usr/bin/python3
MPI_CFLAGS = $(shell mpicxx --showme:compile 2>/dev/null)
MPI_LIBS   = $(filter-out -lmpi_cxx,$(shell mpicxx --showme:link 2>/dev/null))
THREADS  ?= $(shell nproc)

CORE_SRC := $(wildcard model/*.cpp) $(filter-out data/prepare.cpp,$(wildcard data/*.cpp)) $(wildcard comm/*.cpp) \
            $(filter-out tools/%_main.cpp,$(wildcard tools/*.cpp))
CORE_OBJ := $(patsubst %.cpp,build/%.o,$(CORE_SRC))
TEST_SRC := $(filter-out test/bench_cpu.cpp test/ep_check.cpp test/bench_io.cpp,$(wildcard test/*.cpp))
TEST_OBJ := $(patsubst %.cpp,build/%.o,$(TEST_SRC))
HEADERS  := $(wildcard model/*.h data/*.h comm/*.h tools/*.h kernels/*.cuh)

.PHONY: all deps deps-run data run test test-gpu bench-cpu bench-io clean

all: train_cpu prepare_data test_cpu ep_check $(if $(wildcard tools/plot_main.cpp),plot)

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

test_cpu: $(TEST_OBJ) $(CORE_OBJ)
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

run: deps-run
	$(MAKE) -j$(THREADS) train_cpu data
	OMP_NUM_THREADS=$(THREADS) ./train_cpu --config small --data 'data/default/train_*.bin' --val 'data/default/val_*.bin' \
	  --steps 400 --batch 8 --seq 128 --lr 3e-3 --eval-every 50 --log run.jsonl --sample 200

test: deps
	$(MAKE) -j$(THREADS) all data
	@if [ -x $(NVCC) ]; then $(MAKE) train $(if $(wildcard test/test_gpu.cu),test_gpu); else echo "note: $(NVCC) not found: the GPU code is not built (install the CUDA toolkit)"; fi
	OMP_NUM_THREADS=$(THREADS) ./test_cpu

bench_io: build/test/bench_io.o $(CORE_OBJ)
	$(CXX) $(CXXFLAGS) $^ -o $@ $(MPI_LIBS)

# Hugging Face export and import of a ~1 GB model against the disk's plain write and read speed
bench-io: deps
	$(MAKE) bench_io
	./bench_io

ep_check: build/test/ep_check.o $(CORE_OBJ)
	$(CXX) $(CXXFLAGS) $^ -o $@ $(MPI_LIBS)

bench_cpu: build/test/bench_cpu.o $(CORE_OBJ)
	$(CXX) $(CXXFLAGS) $^ -o $@ $(MPI_LIBS)

bench-cpu: deps
	$(MAKE) bench_cpu data
	./bench_cpu --config small --batch 8 --seq 128 --steps 10 --threads $(THREADS)

clean:
	rm -rf build train_cpu prepare_data test_cpu test_gpu bench_cpu bench_io ep_check plot train

# GPU trainer: CUDA code compiled with nvcc for Hopper, linked with the shared host code.
HOST_OBJ := build/model/config.o build/model/params.o build/model/train_args.o build/comm/comm.o build/comm/mpi_comm.o
build/comm/nccl_comm.o: comm/nccl_comm.cu comm/comm.h
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) $(MPI_CFLAGS) -c $< -o $@
# GPU tests: every kernel against the CPU reference (needs a GPU to run; builds anywhere with the toolkit)
test_gpu: test/test_gpu.cu $(CORE_OBJ) $(HEADERS)
	$(NVCC) $(NVFLAGS) -Xcompiler -fopenmp test/test_gpu.cu $(CORE_OBJ) -o $@ -lcublasLt -lcublas $(MPI_LIBS)

test-gpu: test_gpu
	./test_gpu

train: train.cu build/comm/nccl_comm.o $(HOST_OBJ) $(HEADERS)
	$(NVCC) $(NVFLAGS) train.cu build/comm/nccl_comm.o $(HOST_OBJ) -o $@ -lnccl $(MPI_LIBS)
