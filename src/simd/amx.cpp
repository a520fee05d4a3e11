// The AMX stand-in (amx::Emulated, src/simd/amx.h): the tiles' bytes and configuration per
// thread, each instruction's result as Intel's pseudo-code for it; and whether this process
// may use the real tiles.
#include "simd/amx.h"

#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>

#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "qkv/error.h"
#include "qkv/targets.h"
#include "simd/cpu.h"

namespace qkv::amx {
namespace {

struct TileState {
  bool configured = false;
  Config config;
  alignas(64) uint8_t bytes[kTiles][kMaxRows * kMaxRowBytes] = {};
};
thread_local TileState state;

// Tile t, checked to be usable by instruction `op`.
uint8_t* tile(int t, const char* op) {
  if (t < 0 || t >= kTiles) fail("amx ", op, ": there is no tile ", t, " (tiles 0 to 7)");
  if (!state.configured)
    fail("amx ", op, ": tile ", t,
         " used with no tile configuration on this thread (configure first; release ends it)");
  if (state.config.rows[t] == 0 || state.config.row_bytes[t] == 0)
    fail("amx ", op, ": tile ", t, " has no rows in this configuration");
  return state.bytes[t];
}

int rows(int t) { return state.config.rows[t]; }
int row_bytes(int t) { return state.config.row_bytes[t]; }

// What a product leaves past c's configured rows and bytes: zeros, as the instruction does.
void zero_unconfigured(int t) {
  for (int r = 0; r < kMaxRows; ++r) {
    uint8_t* row = state.bytes[t] + r * kMaxRowBytes;
    const int keep = r < rows(t) ? row_bytes(t) : 0;
    std::memset(row + keep, 0, kMaxRowBytes - keep);
  }
}

// The shape rules of both products: c [M × N·4 bytes] += a [M × K·4 bytes] · b [K × N·4 bytes].
void check_product(int c, int a, int b, const char* op) {
  for (int t : {c, a, b}) tile(t, op);
  if (c == a || c == b || a == b)
    fail("amx ", op, ": tiles ", c, ", ", a, " and ", b, " must be three different tiles");
  if (rows(a) != rows(c))
    fail("amx ", op, ": a (tile ", a, ") has ", rows(a), " rows but c (tile ", c, ") has ",
         rows(c));
  if (row_bytes(a) % 4 != 0 || rows(b) != row_bytes(a) / 4)
    fail("amx ", op, ": b (tile ", b, ") has ", rows(b), " rows but a's ", row_bytes(a),
         " bytes a row need ", row_bytes(a) / 4, " (one per 4 bytes)");
  if (row_bytes(b) != row_bytes(c) || row_bytes(c) % 4 != 0)
    fail("amx ", op, ": b (tile ", b, ") has ", row_bytes(b), " bytes a row but c (tile ", c,
         ") has ", row_bytes(c), " (both 4 per column)");
}

template <class T>
T read(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}
template <class T>
void write(uint8_t* p, T v) {
  std::memcpy(p, &v, sizeof(T));
}

// A denormal read as zero (its sign kept).
float denormal_as_zero(float x) {
  return std::fpclassify(x) == FP_SUBNORMAL ? std::copysign(0.0f, x) : x;
}
float bf16_value(uint16_t bits) {
  uint32_t u = static_cast<uint32_t>(bits) << 16;
  float x;
  std::memcpy(&x, &u, 4);
  return denormal_as_zero(x);
}

}  // namespace

void Emulated::configure(const Config& config) {
  for (int t = 0; t < kTiles; ++t) {
    if (config.rows[t] > kMaxRows || config.row_bytes[t] > kMaxRowBytes)
      fail("amx configure: tile ", t, " is ", int(config.rows[t]), " rows of ", config.row_bytes[t],
           " bytes; palette 1 holds at most ", kMaxRows, " rows of ", kMaxRowBytes);
    if ((config.rows[t] == 0) != (config.row_bytes[t] == 0))
      fail("amx configure: tile ", t, " has ", int(config.rows[t]), " rows of ",
           config.row_bytes[t], " bytes (both or neither must be 0)");
  }
  state.config = config;
  state.configured = true;
  std::memset(state.bytes, 0, sizeof(state.bytes));
}

void Emulated::release() {
  state.configured = false;
  state.config = Config{};
  std::memset(state.bytes, 0, sizeof(state.bytes));
}

void Emulated::zero_at(int t) { std::memset(tile(t, "zero"), 0, kMaxRows * kMaxRowBytes); }

void Emulated::load_at(int t, const void* base, int64_t stride) {
  uint8_t* bytes = tile(t, "load");
  std::memset(bytes, 0, kMaxRows * kMaxRowBytes);
  for (int r = 0; r < rows(t); ++r)
    std::memcpy(bytes + r * kMaxRowBytes, static_cast<const uint8_t*>(base) + r * stride,
                row_bytes(t));
}

void Emulated::store_at(int t, void* base, int64_t stride) {
  const uint8_t* bytes = tile(t, "store");
  for (int r = 0; r < rows(t); ++r)
    std::memcpy(static_cast<uint8_t*>(base) + r * stride, bytes + r * kMaxRowBytes, row_bytes(t));
}

void Emulated::dpbf16ps_at(int c, int a, int b) {
  check_product(c, a, b, "dpbf16ps");
  const int M = rows(c), N = row_bytes(c) / 4, K = row_bytes(a) / 4;
  // Intel's order: the even and the odd elements of the pairs each summed over k from zero
  // (the product exact, each sum one rounding), then their sum added to c.
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) {
      float lanes[2] = {0, 0};
      for (int k = 0; k < K; ++k)
        for (int i = 0; i < 2; ++i) {
          const float x =
              bf16_value(read<uint16_t>(state.bytes[a] + m * kMaxRowBytes + 4 * k + 2 * i));
          const float y =
              bf16_value(read<uint16_t>(state.bytes[b] + k * kMaxRowBytes + 4 * n + 2 * i));
          lanes[i] = denormal_as_zero(std::fma(x, y, lanes[i]));
        }
      uint8_t* out = state.bytes[c] + m * kMaxRowBytes + 4 * n;
      const float pair = denormal_as_zero(lanes[0] + lanes[1]);
      write(out, denormal_as_zero(denormal_as_zero(read<float>(out)) + pair));
    }
  zero_unconfigured(c);
}

void Emulated::dpbusd_at(int c, int a, int b) {
  check_product(c, a, b, "dpbusd");
  const int M = rows(c), N = row_bytes(c) / 4, K = row_bytes(a) / 4;
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) {
      uint8_t* out = state.bytes[c] + m * kMaxRowBytes + 4 * n;
      uint32_t sum = read<uint32_t>(out);  // wraps around, as the instruction's sum
      for (int k = 0; k < K; ++k) {
        int32_t quad = 0;  // |4 · 255 · 128| fits
        for (int i = 0; i < 4; ++i)
          quad += int32_t{state.bytes[a][m * kMaxRowBytes + 4 * k + i]} *
                  int32_t{static_cast<int8_t>(state.bytes[b][k * kMaxRowBytes + 4 * n + i])};
        sum += static_cast<uint32_t>(quad);
      }
      write(out, sum);
    }
  zero_unconfigured(c);
}

const char* unavailable_because(bool amx_bf16, bool amx_int8, bool granted, int error) {
  if (!amx_bf16 || !amx_int8)
    return "the CPU has no AMX-BF16 and AMX-INT8 (or the OS does not save the tile state)";
  if (!granted)
    return error == 0 ? "Linux did not grant the tile state (QKV_AMX_REFUSE)"
                      : "Linux refused the tile state (arch_prctl ARCH_REQ_XCOMP_PERM failed: an "
                        "older kernel, or a thread's alternate signal stack too small for it)";
  return nullptr;
}

const char* unavailable() {
  static const char* const why = [] {
    const simd::CpuFeatures& f = simd::cpu_features();
    if (!f.amx_bf16 || !f.amx_int8) return unavailable_because(f.amx_bf16, f.amx_int8, false, 0);
    if (const char* refuse = std::getenv("QKV_AMX_REFUSE"); refuse && *refuse && *refuse != '0')
      return unavailable_because(true, true, false, 0);
#if defined(__linux__) && defined(__x86_64__)
    constexpr long kRequestPermission = 0x1023, kTileData = 18;  // ARCH_REQ_XCOMP_PERM, XTILEDATA
    const bool granted = syscall(SYS_arch_prctl, kRequestPermission, kTileData) == 0;
    return unavailable_because(true, true, granted, granted ? 0 : errno);
#else
    return unavailable_because(true, true, false, 1);
#endif
  }();
  return why;
}

namespace {
// -1: QKV_AMX_STAND_IN not read yet.
std::atomic<int> stand_in_state{-1};
}  // namespace

bool stand_in() {
  int on = stand_in_state.load(std::memory_order_relaxed);
  if (on < 0) {
    const char* env = std::getenv("QKV_AMX_STAND_IN");
    on = env && *env && *env != '0';
    int unread = -1;
    if (!stand_in_state.compare_exchange_strong(unread, on)) on = unread;
  }
  return on;
}

void set_stand_in(bool on) { stand_in_state = on ? 1 : 0; }

}  // namespace qkv::amx

namespace qkv {

const char* amx_unavailable() { return amx::unavailable(); }

}  // namespace qkv
