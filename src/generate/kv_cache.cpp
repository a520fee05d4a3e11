// The key/value cache (see include/qkv/kv_cache.h).
#include "util/parallel.h"
#include "qkv/kv_cache.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "qkv/error.h"
#include "qkv/model.h"
#include "qkv/threads.h"

namespace qkv {

namespace {

// fp32 → bf16 rounding to nearest, ties to even (NaN stays NaN).
uint16_t to_bf16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  if (std::isnan(x)) return static_cast<uint16_t>((bits >> 16) | 0x40);
  bits += 0x7FFF + ((bits >> 16) & 1);
  return static_cast<uint16_t>(bits >> 16);
}

float from_bf16(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float x;
  std::memcpy(&x, &bits, 4);
  return x;
}

}  // namespace

KVCache::KVCache(const ModelConfig& config, const KVCacheOptions& o)
    : batch_(o.batch),
      layers_(config.n_layers),
      kv_heads_(config.n_kv_heads),
      d_head_(config.d_head),
      max_seq_(o.max_seq > 0 ? o.max_seq : config.context),
      ring_(o.ring),
      type_(o.type) {
  validate(config);
  check(o.batch >= 1, "kv cache: batch must be >= 1, got ", o.batch);
  check(o.max_seq >= 0, "kv cache: max_seq must be >= 0 (0 = the model's context), got ",
        o.max_seq);
  check(!o.ring || config.window > 0,
        "kv cache: ring mode needs a sliding-window model (config.window > 0)");
  check(!o.ring || config.positions != PositionKind::alibi,
        "kv cache: ring mode does not support ALiBi (its bias depends on slot order)");
  // A learned position table has no rows past the context: a longer cache would only fail later.
  if (config.positions == PositionKind::learned)
    check(max_seq_ <= config.context, "kv cache: max_seq ", max_seq_, " is longer than the ",
          config.context, " learned positions of the model");
  slots_ = ring_ ? std::min(config.window + 1, max_seq_) : max_seq_;
  const int64_t n = layers_ * batch_ * kv_heads_ * slots_ * d_head_;
  const int64_t floats = type_ == CacheType::f32 ? n : (n + 1) / 2;
  k_ = Tensor({floats});
  v_ = Tensor({floats});
  length_.assign(batch_, 0);
}

int64_t KVCache::bytes() const { return 2 * k_.numel() * static_cast<int64_t>(sizeof(float)); }

int64_t KVCache::length(int64_t seq) const {
  check(seq >= 0 && seq < batch_, "kv cache: sequence ", seq, " out of range [0, ", batch_, ")");
  return length_[seq];
}

void KVCache::reset(int64_t seq) {
  length(seq);  // range check
  length_[seq] = 0;
}

void KVCache::reset() { std::fill(length_.begin(), length_.end(), 0); }

void KVCache::check_room(int64_t seq, int64_t count) const {
  const int64_t now = length(seq);
  check(now + count <= max_seq_, "kv cache: sequence ", seq, " would grow to ", now + count,
        " positions, more than the cache's max_seq of ", max_seq_);
}

void KVCache::advance(int64_t seq, int64_t count) {
  check_room(seq, count);
  length_[seq] += count;
}

int64_t KVCache::offset(int64_t layer, int64_t seq, int64_t head, int64_t slot) const {
  return (((layer * batch_ + seq) * kv_heads_ + head) * slots_ + slot) * d_head_;
}

void KVCache::write(int64_t layer, int64_t seq, int64_t pos0, int64_t count, const float* k_rows,
                    const float* v_rows, int64_t row_stride) {
  check(pos0 >= 0 && pos0 + count <= max_seq_, "kv cache: positions [", pos0, ", ", pos0 + count,
        ") outside the cache's ", max_seq_);
  // In a ring only the last `slots` positions survive: skip the ones that would be overwritten.
  const int64_t first = std::max<int64_t>(0, count - slots_);
  for (int64_t t = first; t < count; ++t) {
    const int64_t slot = (pos0 + t) % slots_;
    for (int64_t h = 0; h < kv_heads_; ++h) {
      const float* k = k_rows + t * row_stride + h * d_head_;
      const float* v = v_rows + t * row_stride + h * d_head_;
      const int64_t at = offset(layer, seq, h, slot);
      if (type_ == CacheType::f32) {
        std::copy(k, k + d_head_, f32(false) + at);
        std::copy(v, v + d_head_, f32(true) + at);
      } else {
        for (int64_t d = 0; d < d_head_; ++d) {
          bf16(false)[at + d] = to_bf16(k[d]);
          bf16(true)[at + d] = to_bf16(v[d]);
        }
      }
    }
  }
}

void KVCache::write_and_read(int64_t layer, int64_t seq, int64_t pos0, int64_t count,
                             const float* k_rows, const float* v_rows, int64_t row_stride,
                             int64_t first, View k, View v) {
  const int64_t held_from = ring_ ? std::max<int64_t>(0, pos0 - slots_) : 0;
  check(first >= held_from && first <= pos0, "kv cache: position ", first,
        " is not held (the cache keeps positions from ", held_from, " to ", pos0, ")");
  const int64_t n = pos0 + count - first;
  check(k.ndim == 3 && k.shape[0] == kv_heads_ && k.shape[1] >= n && k.shape[2] == d_head_ &&
            v.ndim == 3 && v.shape[0] == kv_heads_ && v.shape[1] >= n && v.shape[2] == d_head_,
        "kv cache: read buffers ", shape_of(k), ", ", shape_of(v), " cannot hold [", kv_heads_,
        ", ", n, ", ", d_head_, "]");
  auto get = [&](bool value, int64_t at, float* out) {
    if (type_ == CacheType::f32) std::copy(f32(value) + at, f32(value) + at + d_head_, out);
    else for (int64_t d = 0; d < d_head_; ++d) out[d] = from_bf16(bf16(value)[at + d]);
  };
  // The copy is the cost of a bf16 (or ring) cache's step: the heads in parallel.
  const int64_t old = pos0 - first;
  detail::parallel_for(kv_heads_, detail::threads_for(kv_heads_ * old * d_head_), [&](int64_t h) {
    for (int64_t t = 0; t < old; ++t) {
      const int64_t at = offset(layer, seq, h, (first + t) % slots_);
      get(false, at, &k(h, t, 0));
      get(true, at, &v(h, t, 0));
    }
  });
  write(layer, seq, pos0, count, k_rows, v_rows, row_stride);
  // The new rows as they are stored: rounded like the cache rounds them.
  const bool round = type_ == CacheType::bf16;
  for (int64_t h = 0; h < kv_heads_; ++h)
    for (int64_t t = 0; t < count; ++t) {
      const float* kr = k_rows + t * row_stride + h * d_head_;
      const float* vr = v_rows + t * row_stride + h * d_head_;
      float* kd = &k(h, pos0 - first + t, 0);
      float* vd = &v(h, pos0 - first + t, 0);
      for (int64_t d = 0; d < d_head_; ++d) {
        kd[d] = round ? from_bf16(to_bf16(kr[d])) : kr[d];
        vd[d] = round ? from_bf16(to_bf16(vr[d])) : vr[d];
      }
    }
}

namespace {

View heads_view(float* base, int64_t heads, int64_t rows, int64_t slots, int64_t d_head) {
  return View(base, {1, heads, rows, d_head}, {heads * slots * d_head, slots * d_head, d_head, 1});
}

}  // namespace

View KVCache::key_slots(int64_t layer, int64_t seq, int64_t n) const {
  if (type_ != CacheType::f32) return {};
  return heads_view(f32(false) + offset(layer, seq, 0, 0), kv_heads_, n, slots_, d_head_);
}

View KVCache::value_slots(int64_t layer, int64_t seq, int64_t n) const {
  if (type_ != CacheType::f32) return {};
  return heads_view(f32(true) + offset(layer, seq, 0, 0), kv_heads_, n, slots_, d_head_);
}

const uint16_t* KVCache::bf16_slots(bool values, int64_t layer, int64_t seq) const {
  if (type_ != CacheType::bf16) return nullptr;
  return bf16(values) + offset(layer, seq, 0, 0);
}

}  // namespace qkv
