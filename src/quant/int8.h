// The int8 products' choice of instructions on x86 (src/quant/int8-inl.h): whether the AVX2
// target multiplies with AVX-VNNI.
#pragma once

#include <atomic>

namespace qkv::quant::int8 {

inline std::atomic<bool> avx_vnni_allowed{true};

// Whether the AVX2 target's products use AVX-VNNI (the VEX vpdpbusd; CPUID leaf 7, sub-leaf 1,
// EAX bit 4): the CPU has it, and allow_avx_vnni did not turn it off.
inline bool avx_vnni() {
#if defined(__x86_64__) || defined(__i386__)
  static const bool has = __builtin_cpu_supports("avxvnni");
  return has && avx_vnni_allowed.load(std::memory_order_relaxed);
#else
  return false;
#endif
}

// For tests: whether avx_vnni() may say yes, so that a CPU with AVX-VNNI checks both paths.
inline void allow_avx_vnni(bool allowed) { avx_vnni_allowed = allowed; }

}  // namespace qkv::quant::int8
