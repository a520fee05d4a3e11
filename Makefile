# What a new user types. See README.md.
JOBS ?= $(shell nproc)
QKV := build/release/qkv
# WERROR=ON (what CI runs): every warning fails the build, the Python package's too.
WERROR ?= OFF
CONFIGURE_FLAGS := -DCMAKE_COMPILE_WARNING_AS_ERROR=$(WERROR)

FUZZ_SECONDS ?= 60

.PHONY: configure build demo check test test-python test-arm deps deps-demo models asan fuzz clean

# What the build and the demo need; `deps` adds what the tests need (scripts/install-deps says
# which packages and why).
deps-demo:
	@scripts/install-deps --demo

deps:
	@scripts/install-deps

# The real models too large for the repository (SmolLM2's GGUF), checked by sha256.
models:
	@scripts/get-models

configure: deps-demo
	cmake --preset release $(CONFIGURE_FLAGS) >/dev/null

# Everything: the library, the tool, the tests, the benchmarks and the examples.
build: configure
	cmake --build --preset release -j $(JOBS)

# The demo needs the tool alone (and the library under it); the tests and benchmarks are built
# by `make build`, `make check` and `make test` when they are asked for.
demo: configure
	cmake --build --preset release -j $(JOBS) --target qkv_cli
	$(QKV) demo

asan: deps
	cmake --preset asan $(CONFIGURE_FLAGS) >/dev/null
	cmake --build --preset asan -j $(JOBS)

# The edit-and-test loop: build, then every unit test once, on the best SIMD target this CPU runs
# (no MPI, no emulated CPUs).
check: build
	ctest --preset quick -j $(JOBS)

# Every test of the release build (the kernels' on each SIMD target this CPU has), then the unit
# tests again under ASan + UBSan, then the Python package's.
test: deps
	$(MAKE) build asan models
	ctest --preset release -j $(JOBS)
	ctest --preset asan -j $(JOBS)
	$(MAKE) test-python

# The Python package as a user gets it: `pip install .` into a fresh virtual environment (with
# Debian's NumPy, PyTorch, pytest and hypothesis; ml_dtypes from PyPI), its tests run from outside
# the source tree.
# CXX as the release build has it (scikit-build-core would take Python's, another name for the
# same g++), so that ccache hands over the library's objects.
VENV := build/venv
test-python: deps
	rm -rf $(VENV) && /usr/bin/python3 -m venv --system-site-packages $(VENV)
	CXX=$${CXX:-c++} $(VENV)/bin/pip install -q . \
	  --config-settings=cmake.define.CMAKE_COMPILE_WARNING_AS_ERROR=$(WERROR)
	$(VENV)/bin/pip install -q "ml_dtypes<0.5"  # NumPy bfloat16; 0.5 on would pull NumPy 2
	mkdir -p build/pytest && cd build/pytest && QKV_SOURCE_DIR=$(CURDIR) ../venv/bin/python -m pytest -q \
	  -p no:cacheprovider $(CURDIR)/python/tests

# The library, the attention tests and the quantized products' tests cross-compiled for AArch64
# (NEON, SVE) and run under QEMU: on a NEON-only CPU (Cortex-A72) the code the dispatcher picks
# there, NEON; on one with 256-bit SVE the NEON code again and the SVE code it picks. The
# 1000-token shapes, a quarter of the emulated time, run natively only: under QEMU they take
# the loops the 129-token shapes take.
ARM_EXCLUDE := Tq1000
test-arm:
	@scripts/install-deps --arm
	cmake --preset arm $(CONFIGURE_FLAGS) >/dev/null
	cmake --build --preset arm -j $(JOBS)
	QEMU_CPU=cortex-a72 ctest --preset arm -j $(JOBS) -R '\.best$$' -E '$(ARM_EXCLUDE)'
	QEMU_CPU=max,sve256=on ctest --preset arm -j $(JOBS) -E '$(ARM_EXCLUDE)'

# Every parser of outside bytes under libFuzzer (clang) for FUZZ_SECONDS each, from the seeds in
# fuzz/corpus/<name>/ (copied: what the fuzzer finds stays in build/fuzz/corpus/). The targets
# are the build's list (fuzz/CMakeLists.txt: fuzz/*.cpp, each with its seeds).
fuzz:
	@scripts/install-deps --fuzz
	cmake --preset fuzz >/dev/null
	cmake --build --preset fuzz -j $(JOBS)
	mkdir -p build/fuzz/corpus && cp -r fuzz/corpus/. build/fuzz/corpus/
	for t in $$(cat build/fuzz/fuzz/fuzz_targets.txt); do \
	  build/fuzz/fuzz/fuzz_$$t -max_total_time=$(FUZZ_SECONDS) -max_len=16384 -rss_limit_mb=2048 \
	    -print_final_stats=1 build/fuzz/corpus/$$t || exit 1; \
	done

clean:
	rm -rf build
