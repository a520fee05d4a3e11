// SIMD targets: which instruction sets the library was compiled for, which of them this CPU
// runs, and which one the kernels use.
//
// One build of qkv holds every kernel once per target (on x86-64: sse4, avx2, avx512 and
// avx512_dl; on AArch64: neon and sve, 256-bit SVE) and picks the best one this CPU supports
// the first time a kernel runs. A lower target can be forced for tests, benchmarks and bug reports:
// with the environment variable QKV_TARGET=avx2 (read once, at the first kernel call), with `qkv …
// --target avx2`, or with set_target("avx2").
#pragma once

#include <string>
#include <vector>

namespace qkv {

// The targets compiled into this build, best first (names as above).
std::vector<std::string> compiled_targets();

// The compiled targets this CPU can run, best first.
std::vector<std::string> supported_targets();

// The target the kernels run now.
std::string current_target();

// Makes the kernels run `name` from now on; "" or "best" goes back to the best supported.
// Throws qkv::Error naming the target and the choices when `name` is unknown, not compiled
// in, or not supported by this CPU. Not to be called while kernels run on other threads.
void set_target(const std::string& name);
// The same, with errors that begin with `where` (the flag or variable that named it).
void set_target_from(const std::string& name, const char* where);

// Reads QKV_TARGET now (otherwise read at the first kernel call): throws qkv::Error when it
// names a target that is unknown or not supported here.
void check_target_environment();

// Vector width (bits) and vector register count of the current target.
int target_vector_bits();
int target_vector_registers();

}  // namespace qkv
