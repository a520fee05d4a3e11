// Included by a kernel file right after <hwy/highway.h>, in every per-target pass (no include
// guard). In the bf16-unit translation units (QKV_BF16_UNITS; src/simd/units.h) the file's
// kernels are compiled for one Highway target only — AVX3 on x86-64, NEON on AArch64 — with the
// bf16 dot-product instructions added to its instruction sets (AVX512-BF16; BF16) and the code
// in a namespace of its own, N_AVX3_BF16 or N_NEON_BF16 (Highway's ops are found through a
// using-directive to N_AVX3 or N_NEON), so that nothing collides with the usual pass.
// QKV_KERNEL_PASS says whether this pass compiles the file's kernels.
#undef QKV_KERNEL_PASS
#if defined(QKV_BF16_UNITS)
#if HWY_TARGET == HWY_AVX3
#undef HWY_NAMESPACE
#define HWY_NAMESPACE N_AVX3_BF16
#undef HWY_TARGET_STR
#define HWY_TARGET_STR HWY_TARGET_STR_AVX3 ",avx512bf16"
namespace hwy::N_AVX3_BF16 {
using namespace ::hwy::N_AVX3;  // NOLINT: every Highway op, under the pass's own namespace
}  // namespace hwy::N_AVX3_BF16
#define QKV_KERNEL_PASS 1
#elif HWY_TARGET == HWY_NEON && HWY_ARCH_ARM_A64
#undef HWY_NAMESPACE
#define HWY_NAMESPACE N_NEON_BF16
#undef HWY_TARGET_STR
#define HWY_TARGET_STR "arch=armv8.2-a+crypto+bf16"
namespace hwy::N_NEON_BF16 {
using namespace ::hwy::N_NEON;  // NOLINT: every Highway op, under the pass's own namespace
}  // namespace hwy::N_NEON_BF16
#define QKV_KERNEL_PASS 1
#else
#define QKV_KERNEL_PASS 0
#endif
#else
#define QKV_KERNEL_PASS 1
#endif
