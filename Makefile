# llmtrain — `make` builds ./llmtrain (installs nothing; says what is missing),
# `make test` installs what the tests need and runs every test,
# `make demo` trains the shipped small model on tinyshakespeare,
# `make bench` prints the CPU benchmark.
CC ?= cc
MPICC ?= mpicc
CFLAGS ?= -O3 -march=native
WARN = -Wall -Wextra -Werror -std=c11
OMP = -fopenmp
BLAS_LIBS = -lopenblas
LIBS = -lcjson $(BLAS_LIBS) -lm
PY = /usr/bin/python3

SRC = llmtrain.c config.c model.c kernels_cpu.c parallel.c data.c ckpt.c checkpoint.c util.c
HDR = $(wildcard *.h)
TEST_BINS = tests/test_kernels tests/test_data tests/test_ckpt

.PHONY: all check-deps deps test demo bench clean
all: check-deps llmtrain

# Name the missing package instead of failing inside a compiler error.
check-deps:
	@missing=""; \
	[ -f /usr/include/cjson/cJSON.h ] || missing="$$missing libcjson-dev"; \
	[ -f /usr/include/x86_64-linux-gnu/cblas.h ] || [ -f /usr/include/cblas.h ] || [ -f /usr/include/x86_64-linux-gnu/openblas-pthread/cblas.h ] || missing="$$missing libopenblas-dev"; \
	command -v $(MPICC) >/dev/null 2>&1 || missing="$$missing libopenmpi-dev openmpi-bin"; \
	if [ -n "$$missing" ]; then echo "make: missing Debian packages:$$missing (run scripts/install_deps.sh, or make test / make demo which install them)" >&2; exit 1; fi

llmtrain: $(SRC) $(HDR)
	OMPI_CC=$(CC) $(MPICC) $(CFLAGS) $(WARN) $(OMP) $(SRC) $(LIBS) -o $@

tests/test_kernels: tests/test_kernels.c kernels_cpu.c util.c $(HDR)
	$(CC) -O2 -march=native $(WARN) $(OMP) -I. $< kernels_cpu.c util.c $(BLAS_LIBS) -lm -o $@

tests/test_data: tests/test_data.c data.c util.c $(HDR)
	$(CC) -O2 $(WARN) -I. $< data.c util.c -o $@

tests/test_ckpt: tests/test_ckpt.c ckpt.c checkpoint.c model.c config.c kernels_cpu.c util.c $(HDR)
	$(CC) -O2 -march=native $(WARN) $(OMP) -I. $< ckpt.c checkpoint.c model.c config.c kernels_cpu.c util.c $(LIBS) -lpthread -o $@

deps:
	scripts/install_deps.sh

test: deps
	$(MAKE) llmtrain $(TEST_BINS)
	tests/run_all.sh

demo: deps
	$(MAKE) llmtrain
	scripts/demo.sh

bench: deps
	$(MAKE) llmtrain
	bench/run_bench.sh

clean:
	rm -f llmtrain $(TEST_BINS)
	rm -rf runs
