# What a new user types. See README.md.
JOBS ?= $(shell nproc)
QKV := build/release/qkv

.PHONY: build demo test deps asan clean

deps:
	@scripts/install-deps

build: deps
	cmake --preset release >/dev/null
	cmake --build --preset release -j $(JOBS)

demo: build
	$(QKV) demo

asan: deps
	cmake --preset asan >/dev/null
	cmake --build --preset asan -j $(JOBS)

# Every test of the release build, then the unit tests again under ASan + UBSan.
test: build asan
	ctest --preset release
	ctest --preset asan

clean:
	rm -rf build
