# mha — build, demo, tests. `make demo` and `make test` do all set-up
# (scripts/setup.sh installs the Debian packages that are missing).
CC      ?= cc
PYTHON  ?= /usr/bin/python3
OPT     ?= -O2
CFLAGS_BASE = -std=c11 -Wall -Wextra -Werror -g -fPIC -fopenmp -Iinclude -Isrc -Itests \
              -D_DEFAULT_SOURCE
CFLAGS  ?= $(OPT)
LDLIBS  = -fopenmp -ljansson -lpng -lm
BUILD   ?= build

LIB_SRC   = $(sort $(wildcard src/*.c src/*/*.c))
TOOL_SRC  = $(sort $(wildcard tools/*.c))
TEST_SRC  = $(sort $(wildcard tests/*.c))
BENCH_SRC = $(sort $(wildcard bench/*.c))
LIB_OBJ   = $(LIB_SRC:%.c=$(BUILD)/%.o)
TOOL_OBJ  = $(TOOL_SRC:%.c=$(BUILD)/%.o)
TEST_OBJ  = $(TEST_SRC:%.c=$(BUILD)/%.o)
SETUP_CORE = $(BUILD)/.setup-core
SETUP_TEST = $(BUILD)/.setup-test

.PHONY: all lib demo test test-c test-asan test-python test-memory bench setup clean fuzz
all: lib $(BUILD)/mha $(BUILD)/test_mha

$(SETUP_CORE): scripts/setup.sh
	@mkdir -p $(BUILD) && sh scripts/setup.sh core && touch $@
$(SETUP_TEST): scripts/setup.sh
	@mkdir -p $(BUILD) && sh scripts/setup.sh test && touch $@
setup: $(SETUP_TEST)

lib: $(BUILD)/libmha.a $(BUILD)/libmha.so

$(BUILD)/%.o: %.c $(wildcard include/*.h src/*/*.h tools/*.h tests/*.h) | $(SETUP_CORE)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) $(CFLAGS) -c $< -o $@

# Kernel files named avx2*.c are the only ones built with AVX2/FMA/F16C;
# kernels/dispatch.c picks them at run time after checking CPUID.
AVX2_OBJ = $(filter $(BUILD)/src/kernels/avx2%,$(LIB_OBJ))
AVX512_OBJ = $(filter $(BUILD)/src/kernels/avx512%,$(LIB_OBJ))
$(AVX2_OBJ): CFLAGS += -mavx2 -mfma -mf16c
$(AVX512_OBJ): CFLAGS += -mavx512f -mavx512bw -mavx512vl -mavx512dq -mfma -mf16c

$(BUILD)/libmha.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^
$(BUILD)/libmha.so: $(LIB_OBJ)
	$(CC) -shared -o $@ $^ $(LDLIBS)

$(BUILD)/mha: $(TOOL_OBJ) $(BUILD)/libmha.a
	$(CC) $(CFLAGS) -o $@ $(TOOL_OBJ) $(BUILD)/libmha.a $(LDLIBS)
$(BUILD)/test_mha: $(TEST_OBJ) $(BUILD)/libmha.a
	$(CC) $(CFLAGS) -o $@ $(TEST_OBJ) $(BUILD)/libmha.a $(LDLIBS)

demo: $(BUILD)/mha
	./$(BUILD)/mha demo

test-c: $(BUILD)/test_mha $(BUILD)/mha
	./$(BUILD)/test_mha
	sh tests/cli_test.sh ./$(BUILD)/mha
	sh tests/io_cli_test.sh ./$(BUILD)/mha

# The C tests and the CLI suites under AddressSanitizer + UndefinedBehaviorSanitizer.
test-asan: $(SETUP_CORE)
	$(MAKE) BUILD=build-asan OPT="-O1 -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all" build-asan/test_mha build-asan/mha
	ASAN_OPTIONS=detect_leaks=1 ./build-asan/test_mha
	ASAN_OPTIONS=detect_leaks=1 sh tests/cli_test.sh ./build-asan/mha
	ASAN_OPTIONS=detect_leaks=1 sh tests/io_cli_test.sh ./build-asan/mha

test-python: $(SETUP_TEST) lib $(BUILD)/mha
	@if [ -n "$$(ls tests/python/test_*.py 2>/dev/null)" ]; then \
	  $(PYTHON) -m pytest -q tests/python; fi

test: $(SETUP_TEST)
	$(MAKE) all
	$(MAKE) test-c
	$(MAKE) test-asan
	$(MAKE) test-python
	$(MAKE) fuzz

# The full-size memory check: causal forward with B=1, T=32768, d_model=768,
# h=12; peak RSS must stay below 2x the tensors it must hold (~10 s).
test-memory: $(BUILD)/test_mha
	MHA_TEST_MEMORY_T=32768 ./$(BUILD)/test_mha fast_memory_peak

# Coverage-guided fuzzing of the .npy and safetensors readers (bounded time).
fuzz: $(SETUP_TEST)
	sh fuzz/run.sh 60

# Benchmark binary (bench/ is not the library): machine_avx2.c measures the
# AVX2 FMA peak and the read bandwidth, machine_avx512.c the AVX-512 peak
# (context only; run after a CPUID check). `make bench BENCH_ARGS=--quick`
# runs tiny configurations for development.
BENCH_OBJ = $(BENCH_SRC:%.c=$(BUILD)/%.o)
$(BUILD)/bench/machine_avx2.o: CFLAGS += -mavx2 -mfma
$(BUILD)/bench/machine_avx512.o: CFLAGS += -mavx512f
$(BENCH_OBJ): $(wildcard bench/*.h) | $(SETUP_TEST)
$(BUILD)/bench_mha: $(BENCH_OBJ) $(BUILD)/libmha.a
	$(CC) $(CFLAGS) -o $@ $(BENCH_OBJ) $(BUILD)/libmha.a $(LDLIBS) -lopenblas

bench: $(SETUP_TEST) lib $(BUILD)/bench_mha
	sh bench/run.sh $(BENCH_ARGS)

clean:
	rm -rf build build-asan
