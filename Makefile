SHELL := /bin/bash
# kvchat - see README.md.  `make run` builds and starts; `make check` runs every test.
CC      ?= cc
PREFIX  ?= /usr/local
DESTDIR ?=
SHARED  ?= ../shared
MODEL   ?= $(SHARED)/models/stories260K.gguf
PYTHON  ?= /usr/bin/python3
ARCH_FLAGS ?= -march=native
# `make check` compiles on every core, then runs the tests in order
NPROC   := $(shell nproc 2>/dev/null || echo 1)

WARN    = -Wall -Wextra -Werror
BASE    = -std=c11 -D_GNU_SOURCE -fopenmp $(WARN)
CFLAGS  ?= -O2 -g
LIBS    = -lpcre2-8 -lreadline -lm -fopenmp
CHECK_LIBS = $(shell pkg-config --libs check 2>/dev/null || echo -lcheck -lsubunit -lrt -lm -lpthread) -lutil

SRC = $(wildcard lm/*.c tok/*.c cache/*.c cli/*.c)
TEST_SRC = $(wildcard tests/*.c)
OBJ = $(SRC:%.c=build/native/%.o)
AOBJ = $(SRC:%.c=build/asan/%.o)
ATOBJ = $(TEST_SRC:%.c=build/asan/%.o)
SAN = -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
POBJ = $(SRC:%.c=build/portable/%.o)
TOBJ = $(TEST_SRC:%.c=build/native/%.o)

# Debian packages the build and the tests need; `make deps` installs the missing ones.
DEB_PKGS = gcc make pkg-config check libpcre2-dev libreadline-dev python3 groff-base \
	clang libclang-rt-14-dev libomp-14-dev

# aarch64: its NEON dots held to the scalar ones bit for bit, and the engine
# built for it held to llama.cpp's logits: cross-built, run under qemu on x86-64.
# A64_RUN_V80 runs on a core without SDOT (ARMv8.0), where there is one to hand.
ifeq ($(shell uname -m),aarch64)
A64_CC  = $(CC)
A64_RUN =
A64_RUN_V80 =
else
A64_CC  = aarch64-linux-gnu-gcc
A64_RUN = qemu-aarch64 -cpu max
A64_RUN_V80 = qemu-aarch64 -cpu cortex-a72
DEB_PKGS += gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user
endif
NEON_TEST_SRC = tests/aarch64/neon_kernels.c tests/qrows.c tests/attcheck.c lm/qdot.c lm/qdot_neon.c lm/qdot_simd.c \
	lm/qdot_avx2.c lm/qact_simd.c lm/quant.c lm/attention.c lm/attention_neon.c lm/attention_simd.c lm/attention_avx2.c lm/pointwise_simd.c \
	lm/model.c lm/gguf.c lm/weights_copy.c lm/repack.c

# x86-64 CPUs with AVX2 but without the AVX-512 that lm_cpu_isa takes (VNNI
# with it): there the AVX-512 kernels run emulated (tests/avx512emu: SIMDe
# and lane loops), held to the same bytes; elsewhere the Check suite runs them.
EMU_OBJ = $(patsubst %.c,build/avx512emu/%.o,$(wildcard lm/*.c))
EMU_REST = $(filter-out build/native/lm/%,$(OBJ))
EMU_HERE := $(shell grep -qw avx2 /proc/cpuinfo 2>/dev/null && ! grep -qw avx512_vnni /proc/cpuinfo && echo yes)
ifeq ($(EMU_HERE),yes)
CHECK_EMU_BUILDS = build/avx512emu/run_tests build/avx512emu/kvchat
CHECK_EMU = check-avx512emu
DEB_PKGS += libsimde-dev
endif

.PHONY: all check check-asan check-aarch64 check-avx512emu check-a64-kernels check-a64-logits check-fuzz run bench install clean portable deps fuzz

all: kvchat

kvchat: $(OBJ) build/native/main.o
	$(CC) -o $@ $^ $(LIBS)

kvchat-portable: $(POBJ) build/portable/main.o
	$(CC) -o $@ $^ $(LIBS)

portable: kvchat-portable

build/native/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(BASE) $(CFLAGS) $(ARCH_FLAGS) -MMD -MP -c -o $@ $<

build/portable/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(BASE) $(CFLAGS) -MMD -MP -c -o $@ $<

# -g1: line tables, all a sanitizer's report needs; full -g tracked every
# variable's location through the unrolled kernels, a third of the build's time.
# LM_CHOSEN_INLINING: GCC chooses what to inline (lm/simd.h): the build
# 88 -> 24 s on a 2-core Zen 1, the suite's run level (110 s).
build/asan/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(BASE) -O1 -g1 -DLM_CHOSEN_INLINING $(SAN) -MMD -MP -c -o $@ $<

kvchat-asan: $(AOBJ) build/asan/main.o
	$(CC) $(SAN) -o $@ $^ $(LIBS)

tests/run_tests-asan: $(AOBJ) $(ATOBJ)
	$(CC) $(SAN) -o $@ $^ $(LIBS) $(CHECK_LIBS)

# The whole suite again, every binary under AddressSanitizer and UBSan.
check-asan: deps
	@test -d $(SHARED) || { echo "make check-asan: $(SHARED) (reference data) is missing"; exit 1; }
	$(MAKE) --no-print-directory kvchat-asan tests/run_tests-asan
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  KVCHAT_SHARED=$(SHARED) KVCHAT_BIN=./kvchat-asan ./tests/run_tests-asan

# libFuzzer targets (clang), each with ASan and UBSan; tests/fuzz/corpus holds
# their seeds and what they found worth keeping.
FUZZ_CC ?= clang
FUZZ_TIME ?= 60
FUZZ_SAN = -fsanitize=address,undefined -fno-sanitize-recover=undefined
FUZZ_TARGETS = gguf tok script
FOBJ = $(SRC:%.c=build/fuzz/%.o)

# -Wno-pass-failed: at -O1 under the sanitizers clang does not vectorize
# the loops marked omp simd, and says so.  LM_CHOSEN_INLINING: the compiler
# chooses what to inline (lm/simd.h): the build 85 -> 20 s, the fuzzers'
# runs level.
build/fuzz/%.o: %.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) -std=c11 -D_GNU_SOURCE -fopenmp $(WARN) -Wno-unknown-warning-option -g -O1 \
	  -Wno-pass-failed -DLM_CHOSEN_INLINING -fsanitize=fuzzer-no-link $(FUZZ_SAN) $(FUZZ_EXTRA) -c -o $@ $<

# clang's pointer-overflow check on the unrolled SIMD kernels takes minutes to
# compile (230 s for attention_simd.c, 13 s without it); ASan still checks
# every access they make, and the gcc sanitizer build keeps the check.
FUZZ_SIMD = $(wildcard lm/*_simd.c) lm/qdot_avx2.c lm/qrow_k_avx2.c lm/attention_avx2.c lm/qgemm.c lm/qgemm_avx2.c lm/qgemm_amx.c
# The AVX-512 kernels with their unrolled copies for each head size, type and
# token count, and the AVX2 prompt kernel (qgemm_avx2.c): -O1 under the
# sanitizers took 45-320 s each on a Zen 1 with the kernels' forced inlining
# (the fuzz build was two thirds of what `make check` compiled), and still
# takes 2.5-14 s each with LM_CHOSEN_INLINING; -O0 about 1 s.  The fuzzers run
# them on a few tiny tensors, so their speed does not matter; the kernels the
# script fuzzer runs for every token stay at -O1 (qdot_avx2.c at -O0 made its
# runs four times slower).
FUZZ_O0 = lm/attention_simd.c lm/qrow_vbmi.c lm/qgemm.c lm/qgemm_amx.c lm/qrow_k.c lm/qrow_k_gfni.c \
	lm/qrow_klanes.c lm/qgemm_avx2.c
# Comparisons in the math are loop bounds, not input bytes worth steering
# the fuzzers by; tracing them was two thirds of the script fuzzer's time.
FUZZ_MATH = $(wildcard lm/attention*.c lm/qdot*.c lm/qgemm*.c lm/qrow*.c) lm/qact_simd.c lm/quant.c \
	lm/matmul.c lm/forward.c
$(patsubst %.c,build/fuzz/%.o,$(FUZZ_MATH)): FUZZ_EXTRA += -fno-sanitize-coverage=trace-cmp
$(patsubst %.c,build/fuzz/%.o,$(FUZZ_SIMD)): FUZZ_EXTRA += -fno-sanitize=pointer-overflow
$(patsubst %.c,build/fuzz/%.o,$(FUZZ_O0)): FUZZ_EXTRA += -O0

tests/fuzz/fuzz_%: tests/fuzz/fuzz_%.c $(FOBJ)
	$(FUZZ_CC) -std=c11 -D_GNU_SOURCE -fopenmp $(WARN) -g -O1 -fsanitize=fuzzer $(FUZZ_SAN) \
	  -o $@ $^ -lpcre2-8 -lreadline -lm

# make fuzz [FUZZ_TIME=seconds per target]: runs each target on its corpus;
# new inputs go to FUZZ_OUT (default: the committed corpus itself).
FUZZ_OUT ?= tests/fuzz/corpus

fuzz: deps
	@$(MAKE) --no-print-directory $(FUZZ_TARGETS:%=tests/fuzz/fuzz_%)
	@for t in $(FUZZ_TARGETS); do \
	  mkdir -p $(FUZZ_OUT)/$$t; \
	  echo "fuzz_$$t: $(FUZZ_TIME) s"; \
	  KVCHAT_SHARED=$(SHARED) ./tests/fuzz/fuzz_$$t $(FUZZ_OUT)/$$t tests/fuzz/corpus/$$t -max_total_time=$(FUZZ_TIME) \
	    -max_len=65536 -rss_limit_mb=4096 -timeout=30 -close_fd_mask=2 -print_final_stats=1 \
	    2>&1 | grep -E "^(stat::|Done|==|SUMMARY|ERROR|INFO: (seed|loaded))|ERROR:" ; \
	  test $${PIPESTATUS[0]} -eq 0 || exit 1; \
	done

tests/run_tests: $(OBJ) $(TOBJ)
	$(CC) -o $@ $^ $(LIBS) $(CHECK_LIBS)

build/aarch64/neon_kernels: $(NEON_TEST_SRC) $(wildcard lm/*.h) tests/qrows.h tests/attcheck.h
	@mkdir -p build/aarch64
	$(A64_CC) $(BASE) -O2 -static -o $@ $(NEON_TEST_SRC) -lm

# the engine alone as `kvchat logits`, for parity.py: every quant type
# (llama) and every architecture (Q4_K_M) of the reference models
build/aarch64/kvchat-logits: tests/aarch64/logits.c $(wildcard lm/*.c lm/*.h)
	@mkdir -p build/aarch64
	$(A64_CC) $(BASE) -O2 -static -o $@ tests/aarch64/logits.c $(wildcard lm/*.c) -lm 2>&1 | \
	  { grep -v "dlopen\|oacc-profiling" || true; }; test -x $@

A64_PARITY = $(sort $(wildcard $(SHARED)/reference/llama-t512-*/ $(SHARED)/reference/*-t512-Q4_K_M/))

# the engine's logits with the ARMv8.0 dots (KVCHAT_ISA=neon), byte for byte
# those with SDOT: block types with and without mins, K-quants, a mixture
A64_V80_SAME = $(wildcard $(SHARED)/reference/llama-t512-Q4_0 $(SHARED)/reference/llama-t512-Q4_1 \
	$(SHARED)/reference/llama-t512-Q8_0 $(SHARED)/reference/llama-t512-Q2_K \
	$(SHARED)/reference/llama-t512-Q6_K $(SHARED)/reference/qwen2-t512-Q4_K_M)

CHECK_A64_BUILDS = build/aarch64/neon_kernels build/aarch64/kvchat-logits
check-aarch64: check-a64-kernels check-a64-logits

# the kernel tests with SDOT and without (ARMv8.0)
check-a64-kernels: deps build/aarch64/neon_kernels
	$(A64_RUN) build/aarch64/neon_kernels
	$(A64_RUN_V80) build/aarch64/neon_kernels

# whole models: without SDOT the same bytes as with it, and parity.py's verdict
check-a64-logits: deps build/aarch64/kvchat-logits
	@for d in $(A64_V80_SAME); do \
	  $(A64_RUN) build/aarch64/kvchat-logits logits -m $$d/model.gguf --ids-file $$d/C.tokens.txt \
	    -o build/aarch64/sdot.logits && \
	  KVCHAT_ISA=neon $(A64_RUN) build/aarch64/kvchat-logits logits -m $$d/model.gguf \
	    --ids-file $$d/C.tokens.txt -o build/aarch64/v80.logits && \
	  cmp -s build/aarch64/sdot.logits build/aarch64/v80.logits || \
	    { echo "aarch64: $$d: logits without SDOT differ from those with it"; exit 1; }; \
	done; echo "aarch64: logits without SDOT = with it on $(words $(A64_V80_SAME)) models"
	@A64_RUN="$(A64_RUN)" $(PYTHON) $(SHARED)/tools/parity.py tests/aarch64/parity.sh $(A64_PARITY) | \
	  tail -1 | sed 's/^/aarch64 (NEON) build: /'; test $${PIPESTATUS[0]} -eq 0

# -O1 without forced inlining: GCC's choice (simd.h) compiles the emulated
# kernels in seconds, where their unrolled copies all inlined took minutes.
build/avx512emu/%.o: %.c tests/avx512emu/avx512emu.h
	@mkdir -p $(dir $@)
	$(CC) $(BASE) -O1 -Wno-psabi -mavx2 -mfma -mf16c -DLM_EMULATE_AVX512 -include tests/avx512emu/avx512emu.h \
	  -MMD -MP -c -o $@ $<

build/avx512emu/run_tests: $(EMU_OBJ) $(EMU_REST) $(TOBJ)
	$(CC) -o $@ $^ $(LIBS) $(CHECK_LIBS)

build/avx512emu/kvchat: $(EMU_OBJ) $(EMU_REST) build/native/main.o
	$(CC) -o $@ $^ $(LIBS)

# The kernel tests on the emulated AVX-512 paths, as a Zen 4 (VBMI, GFNI), a
# Cascade Lake (neither) and a Sapphire Rapids (both, and AMX tiles) take
# them; then whole models' logits, the prompt in one batch and a token at a
# time (not as the Sapphire Rapids: tiles take groups of tokens only, and
# one token goes the Zen 4's way), byte for byte the native build's.
EMU_CASES = kernels quant matmul layer_math
EMU_AMX_CASES = kernels matmul
EMU_MODELS = $(A64_PARITY)
EMU_CPUS = zen4 novbmi spr

check-avx512emu: deps kvchat build/avx512emu/run_tests build/avx512emu/kvchat
	@for run in "zen4 $(EMU_CASES)" "novbmi $(EMU_CASES)" "spr $(EMU_AMX_CASES)"; do \
	  set -- $$run; cpu=$$1; shift; for c in "$$@"; do \
	  out=$$(KVCHAT_EMULATE=$$cpu KVCHAT_SHARED=$(SHARED) CK_RUN_CASE=$$c build/avx512emu/run_tests 2>&1) || \
	    { echo "$$out"; echo "avx512emu ($$cpu): Check case $$c failed"; exit 1; }; \
	done; done; echo "avx512emu: Check cases $(EMU_CASES) pass as a Zen 4 and a Cascade Lake, $(EMU_AMX_CASES) as a Sapphire Rapids"
	@for d in $(EMU_MODELS); do for run in "C.tokens.txt" "B.tokens.txt --sequential"; do \
	  set -- $$run; ./kvchat logits -m $$d/model.gguf --ids-file $$d/$$1 $$2 -o build/avx512emu/native.logits && \
	  for cpu in $(EMU_CPUS); do \
	    test "$$cpu$$2" = spr--sequential && continue; \
	    KVCHAT_EMULATE=$$cpu build/avx512emu/kvchat logits -m $$d/model.gguf --ids-file $$d/$$1 $$2 \
	      -o build/avx512emu/emu.logits && cmp -s build/avx512emu/native.logits build/avx512emu/emu.logits || \
	      { echo "avx512emu ($$cpu): $$d $$run: logits differ from the native build's"; exit 1; }; \
	  done || exit 1; \
	done; done; echo "avx512emu: logits of $(words $(EMU_MODELS)) models = the native build's, on each CPU"

# The whole suite: the aarch64 checks (under qemu), a short fuzz of every
# target, the Check tests under AddressSanitizer and UBSan, then the Check
# tests of the release build (last, so their summary closes the output).  The Check tests also run the
# reference judges of $(SHARED)/tools (parity.py, tokcheck.py).
CHECK_FUZZ_TIME ?= 10

# The aarch64 halves and the fuzz run are one process at a time each (qemu,
# libFuzzer): check runs them side by side, each one's output shown whole
# when it ends (--output-sync).
check-fuzz: deps
	@$(MAKE) --no-print-directory fuzz FUZZ_TIME=$(CHECK_FUZZ_TIME) FUZZ_OUT=build/fuzz-corpus

check: deps
	@test -d $(SHARED) || { echo "make check: $(SHARED) (reference data) is missing"; exit 1; }
	$(MAKE) -j$(NPROC) --no-print-directory kvchat tests/run_tests kvchat-asan tests/run_tests-asan \
	  $(CHECK_A64_BUILDS) $(FUZZ_TARGETS:%=tests/fuzz/fuzz_%) $(CHECK_EMU_BUILDS)
	$(MAKE) -j$(NPROC) --output-sync=target --no-print-directory check-a64-kernels check-a64-logits check-fuzz \
	  $(CHECK_EMU)
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  KVCHAT_SHARED=$(SHARED) KVCHAT_BIN=./kvchat-asan ./tests/run_tests-asan
	KVCHAT_SHARED=$(SHARED) KVCHAT_BIN=./kvchat ./tests/run_tests

run: deps
	@$(MAKE) --no-print-directory kvchat
	@if [ -f "$(MODEL)" ]; then \
	  ./kvchat -m "$(MODEL)"; \
	else echo "No model at $(MODEL): pass MODEL=path/to/model.gguf (models.txt lists known models)"; exit 1; fi

# Benchmark models: synthetic weights of real shapes (../shared/tools/synth_gguf.py),
# made once into bench-models/ (ignored by git), then `kvchat bench` on each, then a chat.
BENCH_DIR ?= bench-models
BENCH_MODELS = smollm2-135m:gpt-2:11:Q8_0 smollm2-135m:gpt-2:11:Q4_K_M \
	tinyllama-1.1b:llama-spm:12:Q4_0 tinyllama-1.1b:llama-spm:12:Q8_0 \
	tinyllama-1.1b:llama-spm:12:Q4_K_M qwen2.5-0.5b:qwen2:13:Q4_0 qwen2.5-0.5b:qwen2:13:Q4_K_M
BENCH_ARGS ?= -p 512 -n 128 -r 3
# the speed issue's chat: time to first token at turn 20 against turn 2
BENCH_CHAT = $(BENCH_DIR)/smollm2-135m-Q4_K_M.gguf
BENCH_CHAT_ARGS ?= -n 32 --temp 0
# runs of the chat: each turn's time is its fastest, so a spell of the
# machine's noise in one run (a stalled core for a few ms) does not stand for the turn
BENCH_CHAT_RUNS ?= 5

bench: deps kvchat
	@dpkg-query -W -f='$${Status}' python3-numpy 2>/dev/null | grep -q "ok installed" || \
	  { if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	    $$SUDO apt-get install -y -qq python3-numpy; }
	@mkdir -p $(BENCH_DIR)
	@for spec in $(BENCH_MODELS); do \
	  set -- $$(echo $$spec | tr ':' ' '); f=$(BENCH_DIR)/$$1-$$4.gguf; \
	  if [ ! -f $$f ]; then echo "making $$f"; \
	    $(PYTHON) $(SHARED)/tools/synth_gguf.py --preset $$1 --vocab $(SHARED)/vocab/ggml-vocab-$$2.gguf \
	      --seed $$3 --ftype $$4 -o $$f.tmp > /dev/null && mv $$f.tmp $$f || exit 1; fi; \
	done
	@for spec in $(BENCH_MODELS); do \
	  set -- $$(echo $$spec | tr ':' ' '); echo; ./kvchat bench -m $(BENCH_DIR)/$$1-$$4.gguf $(BENCH_ARGS) || exit 1; \
	done
	@echo; echo "A 20-turn chat on $(BENCH_CHAT) ($(BENCH_CHAT_ARGS) --stats), each turn's fastest of $(BENCH_CHAT_RUNS) runs:"
	@dir=$$(mktemp -d) || exit 1; \
	for i in $$(seq 1 20); do echo "Tell me about item $$i."; done > $$dir/script; \
	for r in $$(seq 1 $(BENCH_CHAT_RUNS)); do \
	  ./kvchat -m $(BENCH_CHAT) -f $$dir/script $(BENCH_CHAT_ARGS) --stats 2> $$dir/stats > /dev/null || \
	    { cat $$dir/stats; rm -rf $$dir; exit 1; }; \
	  grep -o 'ttft_ms=[0-9.]*' $$dir/stats | cut -d= -f2 | nl -w1 -s' ' >> $$dir/ttft; \
	done; \
	sort -k1,1n -k2,2g $$dir/ttft | awk '!seen[$$1]++ { t[$$1] = $$2 } END { \
	  if (!t[2] || !t[20]) { print "no time to first token for turns 2 and 20"; exit 1 } \
	  printf "time to first token: turn 2 %.1f ms, turn 20 %.1f ms, %.2f times turn 2\n", t[2], t[20], t[20] / t[2] }'; \
	status=$$?; rm -rf $$dir; exit $$status

deps:
	@missing=""; for p in $(DEB_PKGS); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "make deps: installing$$missing"; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing; \
	fi

install: kvchat
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/share/man/man1
	install -m 755 kvchat $(DESTDIR)$(PREFIX)/bin/kvchat
	if [ -f man/kvchat.1 ]; then install -m 644 man/kvchat.1 $(DESTDIR)$(PREFIX)/share/man/man1/; fi

clean:
	rm -rf build kvchat kvchat-portable kvchat-asan tests/run_tests tests/run_tests-asan \
	  $(FUZZ_TARGETS:%=tests/fuzz/fuzz_%)

-include $(OBJ:.o=.d) $(POBJ:.o=.d) $(EMU_OBJ:.o=.d) $(TOBJ:.o=.d) $(AOBJ:.o=.d) $(ATOBJ:.o=.d) $(FOBJ:.o=.d)
