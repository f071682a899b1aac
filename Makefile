# mha — build, demo, tests. `make demo` and `make test` do all set-up
# (scripts/setup.sh installs the Debian packages that are missing).
CC      ?= cc
PYTHON  ?= /usr/bin/python3
OPT     ?= -O2
CFLAGS_BASE = -std=c11 -Wall -Wextra -Werror -g -fPIC -fopenmp -Iinclude -Isrc -Itests \
              -D_DEFAULT_SOURCE
CFLAGS  ?= $(OPT)
LDLIBS  = -fopenmp -ljansson -lpng -lm
LIB_LDLIBS = -fopenmp -ljansson -lm
BUILD   ?= build
MPICC   ?= mpicc
HAVE_MPI := $(shell command -v $(MPICC) 2>/dev/null)
# libmha.so.$(VERSION) has the soname libmha.so.$(VERSION_MAJOR): bump the
# major number when include/mha.h changes incompatibly.
VERSION       = 0.1.0
VERSION_MAJOR = $(firstword $(subst ., ,$(VERSION)))
SONAME        = libmha.so.$(VERSION_MAJOR)
PREFIX  ?= /usr/local

LIB_SRC   = $(sort $(wildcard src/*.c src/*/*.c))
TOOL_SRC  = $(sort $(wildcard tools/*.c))
TEST_SRC  = $(sort $(wildcard tests/*.c))
BENCH_SRC = $(sort $(wildcard bench/*.c))
LIB_OBJ   = $(LIB_SRC:%.c=$(BUILD)/%.o)
TOOL_OBJ  = $(TOOL_SRC:%.c=$(BUILD)/%.o)
TEST_OBJ  = $(TEST_SRC:%.c=$(BUILD)/%.o)
SETUP_CORE = $(BUILD)/.setup-core
SETUP_TEST = $(BUILD)/.setup-test
SETUP_BENCH = $(BUILD)/.setup-bench

.PHONY: all lib demo test test-c test-asan test-tsan test-archer test-python test-examples test-docs test-memory bench bench-load setup clean fuzz \
        check-layers check-exports test-install install uninstall mpi mpi-build \
        mutants mutants-ci coverage
all: lib $(BUILD)/mha $(BUILD)/test_mha $(if $(HAVE_MPI),mpi-build)

$(SETUP_CORE): scripts/setup.sh
	@mkdir -p $(BUILD) && sh scripts/setup.sh core && touch $@
$(SETUP_TEST): scripts/setup.sh
	@mkdir -p $(BUILD) && sh scripts/setup.sh test && touch $@
$(SETUP_BENCH): scripts/setup.sh
	@mkdir -p $(BUILD) && sh scripts/setup.sh bench && touch $@
setup: $(SETUP_TEST)

lib: $(BUILD)/libmha.a $(BUILD)/libmha.so

$(BUILD)/%.o: %.c $(wildcard include/*.h src/*/*.h tools/*.h tests/*.h) | $(SETUP_CORE)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) $(VISIBILITY) $(CFLAGS) -c $< -o $@

# Library objects hide every symbol that include/mha.h does not mark MHA_API,
# so libmha.so exports exactly the header (make check-exports).
$(LIB_OBJ): VISIBILITY = -fvisibility=hidden

# Kernel files named avx2*.c are the only ones built with AVX2/FMA/F16C;
# kernels/dispatch.c picks them at run time after checking CPUID.
AVX2_OBJ = $(filter $(BUILD)/src/kernels/avx2%,$(LIB_OBJ))
AVX512_OBJ = $(filter $(BUILD)/src/kernels/avx512%,$(LIB_OBJ))
$(AVX2_OBJ): CFLAGS += -mavx2 -mfma -mf16c
$(AVX512_OBJ): CFLAGS += -mavx512f -mavx512bw -mavx512vl -mavx512dq -mfma -mf16c
# avx512_amx.c alone also gets the AMX tile instructions (run after
# mha_cpu_has_amx_bf16()).
$(BUILD)/src/kernels/avx512_amx.o: CFLAGS += -mamx-tile -mamx-bf16

$(BUILD)/libmha.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^
# build/libmha.so.0 -> libmha.so too: a program linked against the build
# tree (-Lbuild -lmha) records the soname and finds it there at run time.
$(BUILD)/libmha.so: $(LIB_OBJ)
	$(CC) -shared -Wl,-soname,$(SONAME) -o $@ $^ $(LIB_LDLIBS)
	ln -sf libmha.so $(BUILD)/$(SONAME)

$(BUILD)/mha: $(TOOL_OBJ) $(BUILD)/libmha.a
	$(CC) $(CFLAGS) -o $@ $(TOOL_OBJ) $(BUILD)/libmha.a $(LDLIBS)
$(BUILD)/test_mha: $(TEST_OBJ) $(BUILD)/libmha.a
	$(CC) $(CFLAGS) -o $@ $(TEST_OBJ) $(BUILD)/libmha.a $(LDLIBS)

# libmha_mpi and mha-mpi (mpi/, include/mha_mpi.h): built where mpicc
# exists; `make mpi` installs OpenMPI first. mha-mpi reuses the CLI's flag
# parsing, file loading and atomic outputs by linking the objects of tools/
# (all but its main, tools/mha.o).
MPI_LIB_OBJ = $(patsubst %.c,$(BUILD)/%.o,$(filter-out mpi/mha_mpi.c,$(sort $(wildcard mpi/*.c))))
MPI_CLI_OBJ = $(BUILD)/mpi/mha_mpi.o $(filter-out $(BUILD)/tools/mha.o,$(TOOL_OBJ))
$(BUILD)/mpi/%.o: mpi/%.c $(wildcard include/*.h mpi/*.h tools/*.h) | $(SETUP_CORE)
	@mkdir -p $(dir $@)
	$(MPICC) $(CFLAGS_BASE) -Itools $(CFLAGS) -c $< -o $@
$(BUILD)/libmha_mpi.a: $(MPI_LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^
$(BUILD)/mha-mpi: $(MPI_CLI_OBJ) $(BUILD)/libmha_mpi.a $(BUILD)/libmha.a
	$(MPICC) $(CFLAGS) -o $@ $(MPI_CLI_OBJ) $(BUILD)/libmha_mpi.a $(BUILD)/libmha.a $(LDLIBS)
# the C API's hostile-argument test, run by tests/mpi_test.sh under mpirun
$(BUILD)/mpi_api_test: tests/mpi/api_test.c $(BUILD)/libmha_mpi.a $(BUILD)/libmha.a
	$(MPICC) $(CFLAGS_BASE) $(CFLAGS) -o $@ $< $(BUILD)/libmha_mpi.a $(BUILD)/libmha.a $(LDLIBS)
mpi-build: $(BUILD)/libmha_mpi.a $(BUILD)/mha-mpi $(BUILD)/mpi_api_test
mpi:
	@mkdir -p $(BUILD) && sh scripts/setup.sh mpi
	$(MAKE) mpi-build

demo: $(BUILD)/mha
	./$(BUILD)/mha demo

test-c: $(BUILD)/test_mha $(BUILD)/mha $(BUILD)/bench_mha
	./$(BUILD)/test_mha
	sh tests/cli_test.sh ./$(BUILD)/mha
	sh tests/io_cli_test.sh ./$(BUILD)/mha
	sh tests/mpi_test.sh ./$(BUILD)
	sh tests/bench_smoke.sh $(BUILD)

# The C tests and the CLI suites under AddressSanitizer + UndefinedBehaviorSanitizer;
# mha-mpi too (where mpicc exists) on mpi_test.sh's quick P=2 set, with
# OpenMPI's own start-up allocations kept out of the leak report (full
# stacks: its libraries have no frame pointers, so the fast unwinder stops
# in them and the suppressions could not see which library allocated).
ASAN_OPT = -O1 -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all
test-asan: $(SETUP_CORE)
	$(MAKE) BUILD=build-asan OPT="$(ASAN_OPT)" build-asan/test_mha build-asan/mha $(if $(HAVE_MPI),build-asan/mha-mpi build-asan/mpi_api_test)
	ASAN_OPTIONS=detect_leaks=1 MHA_TEST_PARSE_LIMIT_S=5 ./build-asan/test_mha
	ASAN_OPTIONS=detect_leaks=1 sh tests/cli_test.sh ./build-asan/mha
	ASAN_OPTIONS=detect_leaks=1 sh tests/io_cli_test.sh ./build-asan/mha
	ASAN_OPTIONS=detect_leaks=1:fast_unwind_on_malloc=0 LSAN_OPTIONS=suppressions=$(CURDIR)/tests/lsan_openmpi.supp \
	  MHA_MPI_TEST_QUICK=1 sh tests/mpi_test.sh ./build-asan

# The concurrency tests (tests/test_concurrency.c) under ThreadSanitizer.
# Every call runs on one OpenMP thread (an mha_context, and OMP_NUM_THREADS=1)
# so that the only threads are the test's pthreads: TSan does not see
# libgomp's barriers and reports them as races. No suppression file.
test-tsan: $(SETUP_CORE)
	$(MAKE) BUILD=build-tsan OPT="-O1 -fsanitize=thread -fno-omit-frame-pointer" build-tsan/test_mha
	OMP_NUM_THREADS=1 TSAN_OPTIONS="halt_on_error=1 exitcode=66" ./build-tsan/test_mha concurrency

# The whole C suite with OpenMP's own threads under ThreadSanitizer: clang
# with LLVM's libomp and its Archer tool (libarcher.so tells TSan how
# OpenMP synchronizes), two threads. gcc's libgomp is not instrumented,
# which is why test-tsan runs one thread. ~5 minutes on two cores;
# ARCHER_FILTER=NAME runs the tests whose names contain NAME.
ARCHER_LIB = $(firstword $(wildcard /usr/lib/llvm-*/lib/libarcher.so))
test-archer: $(SETUP_TEST)
	@test -n "$(ARCHER_LIB)" || { echo "test-archer: no /usr/lib/llvm-*/lib/libarcher.so (Debian's libomp-dev; make setup)" >&2; exit 1; }
	$(MAKE) CC=clang BUILD=build-archer OPT="-O1 -fsanitize=thread -fno-omit-frame-pointer" build-archer/test_mha
	OMP_NUM_THREADS=2 OMP_TOOL_LIBRARIES=$(ARCHER_LIB) ARCHER_OPTIONS=verbose=1 MHA_TEST_PARSE_LIMIT_S=5 \
	  TSAN_OPTIONS="halt_on_error=1 exitcode=66 ignore_noninstrumented_modules=1" \
	  ./build-archer/test_mha $(ARCHER_FILTER) > build-archer/output.txt 2>&1; rc=$$?; cat build-archer/output.txt; \
	  grep -q "Archer detected OpenMP application with TSan" build-archer/output.txt || \
	  { echo "test-archer: Archer did not load ($(ARCHER_LIB)); the run proved nothing" >&2; exit 1; }; exit $$rc

# The probes also run build-asan/mha where it exists: rebuilt first, so a
# stale sanitizer build never answers for the current code.
test-python: $(SETUP_TEST) lib $(BUILD)/mha
	@if [ -d build-asan ]; then $(MAKE) --no-print-directory BUILD=build-asan OPT="$(ASAN_OPT)" build-asan/mha; fi
	@if [ -n "$$(ls tests/python/test_*.py 2>/dev/null)" ]; then \
	  $(PYTHON) -m pytest -q tests/python; fi

# Every shell command of README.md and docs/*.md, run as written in a
# temporary directory against build/ (tests/docs_test.py).
test-docs: $(SETUP_TEST) $(BUILD)/mha
	$(PYTHON) tests/docs_test.py

# examples/train_reverse.py: mha.nn trains and follows torch's loss curve (~10 s);
# examples/beam_search_decoder.py: beam search with the KV cache's reorder and
# a cross-attention memory gives torch's beams (~2 s).
test-examples: $(SETUP_TEST) lib
	$(PYTHON) examples/train_reverse.py
	$(PYTHON) examples/beam_search_decoder.py
	$(PYTHON) examples/tree_speculative_decoding.py
	$(PYTHON) examples/train_gated_dropout.py

test: $(SETUP_TEST)
	$(MAKE) all $(BUILD)/bench_mha
	$(MAKE) check-layers check-exports
	$(PYTHON) scripts/mutants.py --check
	$(MAKE) test-c
	$(MAKE) test-asan
	$(MAKE) test-tsan
	$(MAKE) test-archer
	$(MAKE) test-python
	$(MAKE) test-docs
	$(MAKE) test-examples
	$(MAKE) fuzz
	$(MAKE) test-install

# Imports between the folders of src/ flow one way (docs/ARCHITECTURE.md):
# #include lines and, from the objects' nm, calls; then the checker's own test.
check-layers: lib
	$(PYTHON) scripts/check_layers.py --src src --objects $(BUILD)/src
	sh tests/layers_test.sh $(PYTHON)

# libmha.so exports exactly the functions of include/mha.h, and the Python
# binding and the CLI (which links libmha.a) use only those.
check-exports: lib $(BUILD)/mha
	$(PYTHON) scripts/check_exports.py $(BUILD)/libmha.so include/mha.h \
	  --binding python/mha/_lib.py --archive $(BUILD)/libmha.a --clients $(BUILD)/tools
	sh tests/exports_test.sh $(PYTHON)

# make install PREFIX=/usr/local [DESTDIR=staging]: the library (static and
# shared, with soname), the header, the CLI, mha.pc and the man page.
# make uninstall (same PREFIX and DESTDIR) removes exactly these files.
INSTALL_DIR = $(DESTDIR)$(PREFIX)
INSTALLED = lib/libmha.a lib/libmha.so.$(VERSION) lib/$(SONAME) lib/libmha.so include/mha.h \
            bin/mha lib/pkgconfig/mha.pc share/man/man1/mha.1
$(BUILD)/mha.1: $(BUILD)/mha scripts/manpage.sh
	sh scripts/manpage.sh $(BUILD)/mha $(VERSION) >$@.tmp && mv $@.tmp $@

install: lib $(BUILD)/mha $(BUILD)/mha.1
	@case "$(PREFIX)" in /*) ;; *) echo "make install: PREFIX=$(PREFIX) is not absolute; expected a path such as /usr/local" >&2; exit 2;; esac
	install -d $(INSTALL_DIR)/lib/pkgconfig $(INSTALL_DIR)/include $(INSTALL_DIR)/bin $(INSTALL_DIR)/share/man/man1
	install -m 644 $(BUILD)/libmha.a $(INSTALL_DIR)/lib/libmha.a
	install -m 755 $(BUILD)/libmha.so $(INSTALL_DIR)/lib/libmha.so.$(VERSION)
	ln -sf libmha.so.$(VERSION) $(INSTALL_DIR)/lib/$(SONAME)
	ln -sf $(SONAME) $(INSTALL_DIR)/lib/libmha.so
	install -m 644 include/mha.h $(INSTALL_DIR)/include/mha.h
	install -m 755 $(BUILD)/mha $(INSTALL_DIR)/bin/mha
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@VERSION@|$(VERSION)|' scripts/mha.pc.in >$(INSTALL_DIR)/lib/pkgconfig/mha.pc
	install -m 644 $(BUILD)/mha.1 $(INSTALL_DIR)/share/man/man1/mha.1

uninstall:
	rm -f $(addprefix $(INSTALL_DIR)/,$(INSTALLED))

# Installs into a temporary prefix, builds and runs a C program and the
# Python package from outside the repository, then uninstalls.
test-install: $(SETUP_TEST)
	sh tests/install_test.sh $(PYTHON)

# The full-size memory check: causal forward with B=1, T=32768, d_model=768,
# h=12; peak RSS must stay below 2x the tensors it must hold (~10 s).
# Then forward + backward with B=1, T=16384 (causal), stateless and with a
# training tape (mha_forward_train): peak RSS below 2x the
# tensors that must exist, gradients and weights' gradients included.
test-memory: $(BUILD)/test_mha
	MHA_TEST_ISA=auto MHA_TEST_MEMORY_T=32768 ./$(BUILD)/test_mha fast_memory_peak
	MHA_TEST_MEMORY_T=16384 ./$(BUILD)/test_mha backward_memory_peak
	MHA_TEST_MEMORY_T=16384 ./$(BUILD)/test_mha tape_memory_peak

# Coverage-guided fuzzing of the .npy and safetensors readers, the layout
# loaders and the CLI flag parser (bounded time).
fuzz: $(SETUP_TEST)
	sh fuzz/run.sh 60

# Benchmark binary (bench/ is not the library): machine_avx2.c measures the
# AVX2 FMA peak and the read bandwidth, machine_avx512.c the AVX-512 peak
# (context only; run after a CPUID check). `make bench BENCH_ARGS=--quick`
# runs tiny configurations for development.
BENCH_OBJ = $(BENCH_SRC:%.c=$(BUILD)/%.o)
$(BUILD)/bench/machine_avx2.o: CFLAGS += -mavx2 -mfma
$(BUILD)/bench/machine_avx512.o: CFLAGS += -mavx512f
$(BUILD)/bench/machine_amx.o: CFLAGS += -mamx-tile -mamx-bf16
$(BENCH_OBJ): $(wildcard bench/*.h) | $(SETUP_TEST)
$(BUILD)/bench_mha: $(BENCH_OBJ) $(BUILD)/libmha.a
	$(CC) $(CFLAGS) -o $@ $(BENCH_OBJ) $(BUILD)/libmha.a $(LDLIBS) -lopenblas

bench: $(SETUP_BENCH) lib $(BUILD)/bench_mha
	sh bench/run.sh $(BENCH_ARGS)

# Mutation testing (scripts/mutants.py, lists in tests/mutants/): each
# mutation applied alone to a scratch copy of this checkout, rebuilt, and
# the suites that can see it run until one fails. Every mutation must be
# killed. mutants-ci is the subset marked `ci: yes`.
mutants: $(SETUP_TEST) all lib
	$(PYTHON) scripts/mutants.py
mutants-ci: $(SETUP_TEST) all lib
	$(PYTHON) scripts/mutants.py --ci

# Line and branch coverage of src/ per file (gcc --coverage, gcovr) from the
# C tests and both CLI suites, in build-cov/ at -O0. GCOV_ERROR_FILE keeps
# libgcov's complaints (a .gcda it cannot write under the suite's
# `ulimit -f`) off the stderr the suite checks line by line; a .gcda cut
# short there is skipped by gcovr; atomic counters under OpenMP threads.
coverage: $(SETUP_TEST)
	rm -f $$(find build-cov -name '*.gcda' 2>/dev/null)
	$(MAKE) BUILD=build-cov OPT="-O0 --coverage -fprofile-update=atomic" build-cov/test_mha build-cov/mha
	./build-cov/test_mha
	sh tests/cli_test.sh ./build-cov/mha
	GCOV_ERROR_FILE=/dev/null sh tests/io_cli_test.sh ./build-cov/mha
	gcovr -r . --filter 'src/' --gcov-ignore-parse-errors build-cov
	gcovr -r . --filter 'src/' --gcov-ignore-parse-errors --branches build-cov

# The load path (bench/LOAD.md): whole `mha run` processes on the P1 torch
# checkpoint against the in-process forward, the time of each phase, and
# the floor any such process pays besides the forward.
# BENCH_LOAD_ARGS="--base OLD_MHA OLD_PHASES" compares with another build.
$(BUILD)/bench_load_phases: bench/load/phases.c bench/bench_util.c bench/bench.h $(BUILD)/libmha.a | $(SETUP_TEST)
	$(CC) $(CFLAGS_BASE) -Ibench $(CFLAGS) -o $@ bench/load/phases.c bench/bench_util.c $(BUILD)/libmha.a $(LIB_LDLIBS)
# bench_load_floor: the same process's unavoidable steps without the forward
# (the team start, map the inputs, fresh pages, the atomic output), no libmha.
$(BUILD)/bench_load_floor: bench/load/floor.c bench/bench_util.c bench/bench.h | $(SETUP_TEST)
	$(CC) $(CFLAGS_BASE) -Ibench $(CFLAGS) -o $@ bench/load/floor.c bench/bench_util.c
bench-load: $(SETUP_TEST) $(BUILD)/mha $(BUILD)/bench_load_phases $(BUILD)/bench_load_floor
	$(PYTHON) bench/load/run.py $(BENCH_LOAD_ARGS)

clean:
	rm -rf build build-asan build-tsan build-archer build-cov
