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

#include <string>

namespace qkv::simd {

// qkv::set_target, with errors that begin with `where` (a flag or variable's name). Call
// ensure_target() first, or QKV_TARGET would later undo it.
void force_target(const std::string& name, const char* where);

// Applies QKV_TARGET the first time it is called; throws qkv::Error if it names a target
// that is unknown or not supported here (and again on every later call).
void ensure_target();

}  // namespace qkv::simd

#define QKV_DISPATCH(fn) (::qkv::simd::ensure_target(), HWY_DYNAMIC_DISPATCH(fn))
