# What a new user types. See README.md.
JOBS ?= $(shell nproc)
QKV := build/release/qkv

FUZZ_SECONDS ?= 60

.PHONY: build demo test deps asan fuzz clean

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

# The loaders under libFuzzer (clang) for FUZZ_SECONDS, from the seeds in fuzz/corpus/.
fuzz:
	@scripts/install-deps --fuzz
	cmake --preset fuzz >/dev/null
	cmake --build --preset fuzz -j $(JOBS)
	mkdir -p build/fuzz/corpus && cp -r fuzz/corpus/. build/fuzz/corpus/
	build/fuzz/fuzz/fuzz_loaders -max_total_time=$(FUZZ_SECONDS) -max_len=8192 -rss_limit_mb=2048 \
	  build/fuzz/corpus/llama2c build/fuzz/corpus/tokenizer

clean:
	rm -rf build
