// One dispatch point per coarse entry of a kernel file (never per tile):
//
//   #undef HWY_TARGET_INCLUDE
//   #define HWY_TARGET_INCLUDE "attention/flash_forward.cpp"  // this file
//   #include <hwy/foreach_target.h>  // compiles this file once per target
//   #include <hwy/highway.h>
//   ... per-target code in namespace HWY_NAMESPACE ...
//   #if HWY_ONCE
//   HWY_EXPORT(flash_forward);
//   void flash_forward(const AttentionArgs& a) { QKV_DISPATCH(flash_forward)(a); }
//   #endif
//
// QKV_DISPATCH is HWY_DYNAMIC_DISPATCH after the target named by QKV_TARGET, if any, has been
// put in force (once per process; see include/qkv/targets.h).
#pragma once

#include <hwy/highway.h>

namespace qkv::simd {

// Applies QKV_TARGET the first time it is called; throws qkv::Error if it names a target
// that is unknown or not supported here (and again on every later call).
void ensure_target();

}  // namespace qkv::simd

#define QKV_DISPATCH(fn) (::qkv::simd::ensure_target(), HWY_DYNAMIC_DISPATCH(fn))
