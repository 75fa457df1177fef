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

.PHONY: all deps build run test clean

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

clean:
	rm -rf $(BUILD)
