# llmtrain — `make` builds ./llmtrain (installs nothing; says what is missing),
# `make test` installs what the tests need and runs every test,
# `make test-quick` runs the inner loop's tier (units and a training smoke),
# `make demo` trains the shipped small model on tinyshakespeare,
# `make bench` prints the CPU benchmark,
# `make test-gpu` / `make bench-gpu` check and time the CUDA backend (need a GPU).
CC ?= cc
MPICC ?= mpicc
CFLAGS ?= -O3 -march=native
WARN = -Wall -Wextra -Werror -std=c11
OMP = -fopenmp
BLAS_LIBS = -lopenblas
LIBS = -lcjson $(BLAS_LIBS) -lm
PY = /usr/bin/python3

CPU_KERNELS = kernels_cpu.c kernels_cpu_attention.c kernels_cpu_moe.c
SRC = llmtrain.c steplog.c config.c model.c cp.c moe.c $(CPU_KERNELS) fp8.c kernels_cuda_sizes.c parallel.c shard.c layout.c fit.c data.c indexed.c hf.c export.c init.c ckpt.c ckpt_run.c rendezvous.c profile.c tboard.c util.c
HDR = $(wildcard *.h)
TEST_BINS = tests/test_kernels tests/fp8_tool tests/test_model tests/test_data tests/test_indexed tests/test_ckpt tests/test_rendezvous tests/test_dist_dev tests/test_dist_nccl tests/test_nccl_emu \
            tests/test_gpu_emu tests/llmtrain_emu tests/cuda_emu/build/selftest tests/cuda_emu/build/cudnn_selftest \
            tests/fuzz_replay tests/llmtrain_asan tests/nolock.so

# CUDA backend: built whenever nvcc is found (on PATH or in /usr/local/cuda);
# `make NVCC=` builds the CPU-only binary. CUDA_ARCH lists the SM versions
# to emit machine code for (PTX of the last one is embedded too, for newer GPUs).
ifeq ($(origin NVCC),undefined)
NVCC := $(shell command -v nvcc 2>/dev/null || { [ -x /usr/local/cuda/bin/nvcc ] && echo /usr/local/cuda/bin/nvcc; })
endif
CUDA_ARCH ?= 80 90
ifneq ($(strip $(NVCC)),)
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(realpath $(NVCC)))
CUDA_LIBDIR = $(firstword $(wildcard $(CUDA_HOME)/lib64 $(CUDA_HOME)/targets/x86_64-linux/lib))
CUDA_INCDIR = $(firstword $(wildcard $(CUDA_HOME)/include $(CUDA_HOME)/targets/x86_64-linux/include))
CUDA_GENCODE = $(foreach a,$(CUDA_ARCH),-gencode=arch=compute_$(a),code=sm_$(a)) \
               -gencode=arch=compute_$(lastword $(CUDA_ARCH)),code=compute_$(lastword $(CUDA_ARCH))
NVCCFLAGS ?= -O3
NVCC_WARN = -Werror all-warnings -Xcompiler -Wall,-Wextra,-Werror
CUDA_DEFS = -DLLMTRAIN_CUDA
CUDA_OBJ = kernels_cuda.o
# libcudart statically (it loads the driver only at the first CUDA call, so
# CPU runs need no driver), cuBLASLt from the toolkit
CUDA_LIBS = $(CUDA_OBJ) -L$(CUDA_LIBDIR) -Wl,-rpath,$(CUDA_LIBDIR) -lcublasLt -lcudnn -lcudart_static -ldl -lrt -lpthread -lstdc++
# multi-rank CUDA: NCCL (dist_nccl.c, C with the toolkit's headers), from the
# toolkit's folders unless NCCL_HOME names another installation
NCCL_HOME ?= $(CUDA_HOME)
NCCL_LIBDIR = $(firstword $(wildcard $(NCCL_HOME)/lib64 $(NCCL_HOME)/lib $(NCCL_HOME)/targets/x86_64-linux/lib))
CUDA_SRC = dist_nccl.c
CUDA_INC = -I$(CUDA_HOME)/include -I$(NCCL_HOME)/include
NCCL_LIBS = -L$(NCCL_LIBDIR) -Wl,-rpath,$(NCCL_LIBDIR) -lnccl
endif

.PHONY: all check-deps deps deps-demo test test-quick demo bench clean test-gpu bench-gpu fuzz
all: check-deps llmtrain

# Name the missing package instead of failing inside a compiler error.
check-deps:
	@missing=""; \
	[ -f /usr/include/cjson/cJSON.h ] || missing="$$missing libcjson-dev"; \
	[ -f /usr/include/x86_64-linux-gnu/cblas.h ] || [ -f /usr/include/cblas.h ] || [ -f /usr/include/x86_64-linux-gnu/openblas-pthread/cblas.h ] || missing="$$missing libopenblas-dev"; \
	command -v $(MPICC) >/dev/null 2>&1 || missing="$$missing libopenmpi-dev openmpi-bin"; \
	if [ -n "$$missing" ]; then echo "make: missing Debian packages:$$missing (run scripts/install_deps.sh, or make test / make demo which install them)" >&2; exit 1; fi
	@if [ -n "$(strip $(NVCC))" ] && [ ! -f "$(NCCL_HOME)/include/nccl.h" ]; then \
	  echo "make: nvcc is at $(NVCC) but NCCL is not ($(NCCL_HOME)/include/nccl.h): set NCCL_HOME, or build without CUDA: make NVCC=" >&2; exit 1; fi

llmtrain: $(SRC) $(CUDA_SRC) $(HDR) $(CUDA_OBJ)
	OMPI_CC=$(CC) $(MPICC) $(CFLAGS) $(WARN) $(OMP) $(CUDA_DEFS) $(CUDA_INC) $(SRC) $(CUDA_SRC) $(CUDA_LIBS) $(NCCL_LIBS) $(LIBS) -o $@

KERNEL_PARTS = $(wildcard kernels/*.cuh)
kernels_cuda.o: kernels.cu $(KERNEL_PARTS) kernels.h kernels_ops.h kernels_cuda_sizes.h util.h
	$(NVCC) $(NVCCFLAGS) -std=c++17 $(CUDA_GENCODE) $(NVCC_WARN) $(CUDA_DEFS) -I. -c $< -o $@

# CUDA kernels against the CPU backend, then whole training runs cuda vs cpu:
# fails (non-zero, one line) without a GPU or without nvcc. GPU_TEST_SRC:
# tests/test_gpu's sources (main in tests/test_gpu.c), tests/test_gpu_emu's too
GPU_TEST_SRC = tests/test_gpu.c tests/test_gpu_layers.c tests/test_gpu_matmul.c tests/test_gpu_model.c \
               tests/test_gpu_cp.c tests/test_gpu_fp8.c
tests/test_gpu: $(GPU_TEST_SRC) tests/test_gpu.h $(CPU_KERNELS) fp8.c model.c cp.c moe.c util.c $(HDR) $(CUDA_OBJ)
	@[ -n "$(CUDA_OBJ)" ] || { echo "make test-gpu: FAIL: nvcc not found, this build has no CUDA backend" >&2; exit 1; }
	$(CC) -O2 -march=native $(WARN) $(OMP) $(CUDA_DEFS) -I. -I$(CUDA_INCDIR) $(GPU_TEST_SRC) $(CPU_KERNELS) fp8.c model.c cp.c moe.c util.c $(CUDA_LIBS) $(BLAS_LIBS) -lm -o $@

test-gpu: check-deps llmtrain tests/test_gpu
	tests/gpu_tests.sh

bench-gpu: check-deps llmtrain tests/test_gpu
	bench/run_bench_gpu.sh

# The CUDA backend on the host, for machines without a GPU (make test): the
# source of kernels.cu rewritten to plain C++ (cu2cpp.py: launches and
# dynamic shared memory) over the emulated runtime, cuBLASLt, CUB and NCCL of
# tests/cuda_emu. Needs no nvcc. tests/test_gpu_emu is tests/test_gpu on it,
# tests/llmtrain_emu the trainer (train.device cuda runs there on the host).
CXX ?= g++
EMU = tests/cuda_emu
EMU_DEFS = -DLLMTRAIN_CUDA -I$(EMU)/include -I$(EMU)/nccl
EMU_HDR = $(EMU)/emu.h $(wildcard $(EMU)/include/*.h) $(EMU)/include/cub/device/device_radix_sort.cuh $(EMU)/nccl/nccl.h
EMU_OBJ = $(EMU)/build/kernels_emu.o $(EMU)/build/emu.o $(EMU)/build/cudnn_emu.o
EMU_CXX = $(CXX) -O2 -march=native -std=c++17 -pthread -Wall -Wextra -Werror -Wno-unknown-pragmas

$(EMU)/build/kernels_emu.cpp: kernels.cu $(KERNEL_PARTS) $(EMU)/cu2cpp.py
	@mkdir -p $(EMU)/build
	$(PY) $(EMU)/cu2cpp.py kernels.cu $@

$(EMU)/build/kernels_emu.o: $(EMU)/build/kernels_emu.cpp $(EMU_HDR) kernels.h kernels_ops.h kernels_cuda_sizes.h util.h
	$(EMU_CXX) $(EMU_DEFS) -I. -c $< -o $@

$(EMU)/build/emu.o: $(EMU)/emu.cpp $(EMU_HDR)
	@mkdir -p $(EMU)/build
	$(EMU_CXX) -I$(EMU)/include -c $< -o $@

# cuDNN's backend (graph) API: an interpreter of the operation graph on the host
$(EMU)/build/cudnn_emu.o: $(EMU)/cudnn_emu.cpp $(EMU_HDR)
	@mkdir -p $(EMU)/build
	$(EMU_CXX) -I$(EMU)/include -c $< -o $@

$(EMU)/build/cudnn_selftest: $(EMU)/cudnn_selftest.cpp $(EMU_HDR) $(EMU)/build/cudnn_emu.o
	$(EMU_CXX) -I$(EMU)/include $< $(EMU)/build/cudnn_emu.o -o $@

$(EMU)/build/selftest: $(EMU)/selftest.cu $(EMU)/cu2cpp.py $(EMU_HDR) $(EMU)/build/emu.o
	$(PY) $(EMU)/cu2cpp.py $(EMU)/selftest.cu $(EMU)/build/selftest.cpp
	$(EMU_CXX) $(EMU_DEFS) $(EMU)/build/selftest.cpp $(EMU)/build/emu.o -o $@

tests/test_gpu_emu: $(GPU_TEST_SRC) tests/test_gpu.h $(CPU_KERNELS) fp8.c model.c cp.c moe.c util.c $(HDR) $(EMU_OBJ)
	$(CC) -O2 -march=native $(WARN) $(OMP) $(EMU_DEFS) -I. $(GPU_TEST_SRC) $(CPU_KERNELS) fp8.c model.c cp.c moe.c util.c $(EMU_OBJ) $(BLAS_LIBS) -lm -lstdc++ -lpthread -o $@

tests/llmtrain_emu: $(SRC) dist_nccl.c $(HDR) $(EMU_OBJ) $(EMU)/nccl_emu.c $(EMU_HDR)
	OMPI_CC=$(CC) $(MPICC) $(CFLAGS) $(WARN) $(OMP) $(EMU_DEFS) $(SRC) dist_nccl.c $(EMU)/nccl_emu.c $(EMU_OBJ) $(LIBS) -lstdc++ -lpthread -o $@

tests/test_kernels: tests/test_kernels.c $(CPU_KERNELS) fp8.c util.c $(HDR)
	$(CC) -O2 -march=native $(WARN) $(OMP) -I. $< $(CPU_KERNELS) fp8.c util.c $(BLAS_LIBS) -lm -o $@

# fp8.c on the command line, for tests/test_fp8.py's numpy reference
tests/fp8_tool: tests/fp8_tool.c fp8.c fp8.h
	$(CC) -O2 -march=native $(WARN) $(OMP) -I. $< fp8.c -lm -o $@

tests/test_model: tests/test_model.c tests/check.h model.c cp.c moe.c config.c $(CPU_KERNELS) fp8.c util.c $(HDR)
	$(CC) -O2 -march=native $(WARN) $(OMP) -I. $< model.c cp.c moe.c config.c $(CPU_KERNELS) fp8.c util.c $(LIBS) -o $@

tests/test_data: tests/test_data.c tests/check.h data.c indexed.c util.c $(HDR)
	$(CC) -O2 $(WARN) -I. $< data.c indexed.c util.c -o $@
tests/test_indexed: tests/test_indexed.c tests/check.h data.c indexed.c util.c $(HDR)
	$(CC) -O2 $(WARN) -I. $< data.c indexed.c util.c -o $@

tests/test_rendezvous: tests/test_rendezvous.c tests/check.h rendezvous.c util.c $(HDR)
	$(CC) -O2 $(WARN) -I. $< rendezvous.c util.c -o $@

tests/test_dist_dev: tests/test_dist_dev.c tests/a2a_check.h parallel.c rendezvous.c util.c $(HDR)
	OMPI_CC=$(CC) $(MPICC) -O2 $(WARN) -I. $< parallel.c rendezvous.c util.c -lpthread -o $@

# dist_nccl.c against the fake CUDA runtime and NCCL in tests/fake_cuda (no GPU, any build)
tests/test_dist_nccl: tests/test_dist_nccl.c tests/a2a_check.h dist_nccl.c parallel.c rendezvous.c util.c tests/fake_cuda/cuda_runtime.h tests/fake_cuda/nccl.h $(HDR)
	OMPI_CC=$(CC) $(MPICC) -O2 $(WARN) -DLLMTRAIN_CUDA -Itests/fake_cuda -I. $< dist_nccl.c parallel.c rendezvous.c util.c -lpthread -o $@

# the expert group's all-to-all through dist_nccl.c on the emulation's NCCL and CUDA runtime
tests/test_nccl_emu: tests/test_nccl_emu.c tests/a2a_check.h dist_nccl.c parallel.c rendezvous.c util.c $(EMU)/nccl_emu.c $(EMU)/build/emu.o $(EMU_HDR) $(HDR)
	OMPI_CC=$(CC) $(MPICC) -O2 $(WARN) $(EMU_DEFS) -I. $< dist_nccl.c parallel.c rendezvous.c util.c $(EMU)/nccl_emu.c $(EMU)/build/emu.o -lstdc++ -lpthread -lm -o $@

# --wrap=fsync: the test logs which directories the checkpoint code syncs;
# --wrap=malloc: it makes one allocation fail.
tests/test_ckpt: tests/test_ckpt.c tests/check.h hf.c export.c ckpt.c model.c cp.c moe.c config.c $(CPU_KERNELS) fp8.c util.c $(HDR)
	$(CC) -O2 -march=native $(WARN) $(OMP) -I. $< hf.c export.c ckpt.c model.c cp.c moe.c config.c $(CPU_KERNELS) fp8.c util.c $(LIBS) -lpthread -Wl,--wrap=fsync,--wrap=malloc -o $@

# A file system without locks, for tests/test_ckdir.sh (LD_PRELOAD).
tests/nolock.so: tests/nolock.c
	$(CC) -O2 $(WARN) -fPIC -shared $< -ldl -o $@

# The readers of files a user hands llmtrain (job file, Hugging Face config
# and safetensors, checkpoint manifest, token shard, vocab) under the
# sanitizers (tests/fuzz/fuzz.c). tests/fuzz_replay (gcc) replays the
# committed corpus in make test; make fuzz runs clang's libFuzzer on each
# target for FUZZ_SECONDS (tests/fuzz/run.sh).
FUZZ_SRC = tests/fuzz/fuzz.c config.c hf.c ckpt.c model.c cp.c moe.c data.c indexed.c $(CPU_KERNELS) fp8.c util.c
FUZZ_FLAGS = -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined,float-cast-overflow -fno-sanitize-recover=all $(WARN) -fopenmp -I. \
             -Wl,--wrap=die,--wrap=mmap,--wrap=munmap
tests/fuzz_replay: $(FUZZ_SRC) $(HDR)
	$(CC) $(FUZZ_FLAGS) $(FUZZ_SRC) $(LIBS) -lpthread -o $@
# The whole trainer, CPU-only, under the same sanitizers (tests/test_sanitize.sh).
tests/llmtrain_asan: $(SRC) $(HDR)
	OMPI_CC=$(CC) $(MPICC) -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined,float-cast-overflow -fno-sanitize-recover=all \
	    $(WARN) $(OMP) $(SRC) $(LIBS) -lpthread -o $@
tests/fuzz/build/fuzz: $(FUZZ_SRC) $(HDR)
	@mkdir -p tests/fuzz/build
	clang $(FUZZ_FLAGS) -Wno-pass-failed -DFUZZ_LIBFUZZER -fsanitize=fuzzer $(FUZZ_SRC) $(LIBS) -lpthread -o $@
fuzz: deps
	@command -v clang >/dev/null || { echo "make fuzz: FAIL: needs clang (apt-get install clang)" >&2; exit 1; }
	$(MAKE) tests/fuzz/build/fuzz
	tests/fuzz/run.sh

deps:
	scripts/install_deps.sh test
deps-demo:
	scripts/install_deps.sh demo

test: deps
	$(MAKE) llmtrain $(TEST_BINS)
	tests/run_all.sh

# the inner loop's tier, a few minutes: units and a training smoke
test-quick: deps
	$(MAKE) llmtrain tests/test_kernels tests/fp8_tool tests/test_model tests/test_data tests/test_indexed tests/test_ckpt
	tests/run_all.sh quick

demo: deps-demo
	$(MAKE) llmtrain
	scripts/demo.sh

bench: deps
	$(MAKE) llmtrain
	bench/run_bench.sh

clean:
	rm -f llmtrain $(TEST_BINS) tests/test_gpu kernels_cuda.o
	rm -rf $(EMU)/build tests/fuzz/build
	rm -rf runs
