# The two commands: `make run` (the main job) and `make test` (the whole suite). Both install
# missing Debian packages first (scripts/install-deps.sh), configure with CMake and build.
BUILD ?= build
ARGS ?=
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
# CI builds with warnings as errors.
ifneq ($(CI),)
WERROR ?= ON
else
WERROR ?= OFF
endif

.PHONY: all deps build run test install sanitize fuzz clean

all: build

deps:
	@scripts/install-deps.sh

build: deps
	cmake -S . -B $(BUILD) -DFLASHJIT_WERROR=$(WERROR) $(CMAKE_FLAGS)
	cmake --build $(BUILD) -j $(JOBS)

run: build
	$(BUILD)/flashjit run $(ARGS)

test: build
	cd $(BUILD) && ctest --output-on-failure -V $(CTEST_ARGS)

# The library, header, CLI, CMake package and pkg-config file under PREFIX.
PREFIX ?= /usr/local
install: build
	cmake --install $(BUILD) --prefix $(PREFIX)

# The unit suite again, built with AddressSanitizer and UBSan (any report fails the test). Left
# out: the Python layout check (the interpreter would need the ASan runtime preloaded), the
# offline cache build (minutes inside NVRTC; its host side runs in `make test`) and the install
# consumers (their programs are not built with the sanitizers). PoCL's own leaks are suppressed
# (tests/lsan.supp). use_tls=0: the leak check does not take thread-local storage as roots. GCC
# 12's LeakSanitizer cannot size glibc 2.36's dynamic TLS blocks and, depending on the heap's
# layout, reads a stale record of one of them at exit and crashes (test_cuda_host, whose NVRTC is
# opened with dlopen). No flashjit pointer lives in thread-local storage, so this can only report
# more, never hide a leak of ours; the libraries' TLS-held memory is suppressed by name.
SANITIZE_LSAN = suppressions=$(CURDIR)/tests/lsan.supp:use_tls=0
sanitize: deps
	cmake -S . -B build-asan -DFLASHJIT_SANITIZE=ON -DFLASHJIT_WERROR=$(WERROR) $(CMAKE_FLAGS)
	cmake --build build-asan -j $(JOBS)
	cd build-asan && LSAN_OPTIONS=$(SANITIZE_LSAN) ctest --output-on-failure \
		-L unit -E "python_layout|python_package|cache_build_offline|install_consumers" $(CTEST_ARGS)

# Each libFuzzer target (fuzz/) for FUZZ_SECONDS over its corpus; needs clang.
FUZZ_SECONDS ?= 60
fuzz:
	@scripts/install-deps.sh fuzz
	CC=clang cmake -S . -B build-fuzz -DFLASHJIT_FUZZ=ON -DFLASHJIT_TESTS=OFF \
		-DFLASHJIT_FUZZ_SECONDS=$(FUZZ_SECONDS) -DFLASHJIT_WERROR=$(WERROR) $(CMAKE_FLAGS)
	cmake --build build-fuzz -j $(JOBS)
	cd build-fuzz && ctest --output-on-failure -L fuzz

clean:
	rm -rf $(BUILD) build-asan build-fuzz
