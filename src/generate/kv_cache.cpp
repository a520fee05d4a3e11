// The key/value cache (see include/qkv/kv_cache.h).
#include "qkv/kv_cache.h"

#include <algorithm>

#include "qkv/error.h"
#include "qkv/model.h"
#include "qkv/number_format.h"
#include "qkv/quant.h"
#include "util/parallel.h"
#include "util/scratch.h"

namespace qkv {

namespace {

// The cache types: name and element type (the one table; kv_row_types() lists what attention
// reads).
struct CacheFormat {
  CacheType type;
  const char* name;
  TensorType element;
};
constexpr CacheFormat kCacheFormats[] = {
    {CacheType::f32, "f32", TensorType::f32},    {CacheType::bf16, "bf16", TensorType::bf16},
    {CacheType::f16, "f16", TensorType::f16},    {CacheType::q8_0, "q8_0", TensorType::q8_0},
    {CacheType::q4_0, "q4_0", TensorType::q4_0}, {CacheType::q4_1, "q4_1", TensorType::q4_1},
};

const CacheFormat& format_of(CacheType type) {
  for (const CacheFormat& f : kCacheFormats)
    if (f.type == type) return f;
  fail("kv cache: unknown cache type ", static_cast<int>(type));
}

}  // namespace

const std::vector<std::string>& cache_type_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const CacheFormat& f : kCacheFormats) out.push_back(f.name);
    return out;
  }();
  return names;
}

std::string cache_type_choices() {
  const std::vector<std::string>& names = cache_type_names();
  std::string s;
  for (size_t i = 0; i < names.size(); ++i)
    s += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  return s;
}

CacheType cache_type(const std::string& name) {
  for (const CacheFormat& f : kCacheFormats)
    if (name == f.name) return f.type;
  fail("kv cache: storage must be ", cache_type_choices(), ", got \"", name, "\"");
}

const char* cache_type_name(CacheType type) { return format_of(type).name; }

TensorType cache_element_type(CacheType type) { return format_of(type).element; }

namespace {
bool in_blocks(CacheType t) { return is_kv_block_type(cache_element_type(t)); }
constexpr int64_t kBlock = kKvBlockValues;
int64_t block_bytes(CacheType t) { return block_of(cache_element_type(t)).bytes; }
}  // namespace

CacheRotation cache_rotation(const std::string& name) {
  if (name == "auto") return CacheRotation::automatic;
  if (name == "on") return CacheRotation::on;
  if (name == "off") return CacheRotation::off;
  fail("kv cache: unknown rotation '", name, "' (auto, on or off)");
}

CacheScores cache_scores(const std::string& name) {
  if (name == "int8") return CacheScores::int8;
  if (name == "exact") return CacheScores::exact;
  fail("kv cache: unknown scores '", name, "' (int8 or exact)");
}

const char* cache_scores_name(CacheScores scores) {
  return scores == CacheScores::exact ? "exact" : "int8";
}

const char* cache_rotation_name(CacheRotation rotation) {
  switch (rotation) {
    case CacheRotation::on:
      return "on";
    case CacheRotation::off:
      return "off";
    default:
      return "auto";
  }
}

bool cache_rotates(CacheType type, CacheRotation rotation) {
  return cache_rotates(type, type, rotation);
}

bool cache_rotates(CacheType keys, CacheType values, CacheRotation rotation) {
  return rotation == CacheRotation::on ||
         (rotation == CacheRotation::automatic && (in_blocks(keys) || in_blocks(values)));
}

KVCache::KVCache(const ModelConfig& config, const KVCacheOptions& o)
    : batch_(o.batch),
      layers_(config.n_layers),
      kv_heads_(config.n_kv_heads),
      d_head_(config.d_head),
      max_seq_(o.max_seq > 0 ? o.max_seq : config.context),
      rotation_(cache_rotates(o.key_type.value_or(o.type), o.value_type.value_or(o.type),
                              o.rotation) &&
                        config.d_head > 0
                    ? rotation_block(config.d_head)
                    : 0),
      ring_(o.ring),
      key_type_(o.key_type.value_or(o.type)),
      value_type_(o.value_type.value_or(o.type)),
      scores_(o.scores) {
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
  for (const CacheType type : {key_type_, value_type_})
    check(!in_blocks(type) || d_head_ % kBlock == 0, "kv cache: a ", cache_type_name(type),
          " cache stores rows as blocks of 32 values; the model's head dim ", d_head_,
          " is not a multiple of 32 (use f32, bf16 or f16 for this model)");
  slots_ = ring_ ? std::min(config.window + 1, max_seq_) : max_seq_;
  const int64_t n = layers_ * batch_ * kv_heads_ * slots_ * d_head_;
  const auto floats = [&](CacheType type) {  // the storage of n values, packed into floats
    const int64_t bytes = type == CacheType::f32 ? 4 * n
                          : in_blocks(type)      ? n / kBlock * block_bytes(type)
                                                 : 2 * n;
    return (bytes + 3) / 4;
  };
  k_ = Tensor({floats(key_type_)});
  v_ = Tensor({floats(value_type_)});
  length_.assign(batch_, 0);
}

int64_t KVCache::bytes() const {
  return (k_.numel() + v_.numel()) * static_cast<int64_t>(sizeof(float));
}

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

uint8_t* KVCache::block_at(bool value, int64_t at) const {
  return reinterpret_cast<uint8_t*>((value ? v_ : k_).data()) +
         at / kBlock * block_bytes(type_of(value));
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
      store_row(false, at, k);
      store_row(true, at, v);
    }
  }
}

void KVCache::store_row(bool value, int64_t at, const float* x) {
  const CacheType type = type_of(value);
  if (type == CacheType::f32) {
    std::copy(x, x + d_head_, f32(value) + at);
  } else if (in_blocks(type)) {
    quant::quantize_into(cache_element_type(type), x, d_head_, block_at(value, at));
  } else {
    const auto round = type == CacheType::bf16 ? float_to_bf16 : float_to_half;
    for (int64_t d = 0; d < d_head_; ++d) bits16(value)[at + d] = round(x[d]);
  }
}

const void* KVCache::row_at(bool value, int64_t at) const {
  const CacheType type = type_of(value);
  if (type == CacheType::f32) return f32(value) + at;
  if (in_blocks(type)) return block_at(value, at);
  return bits16(value) + at;
}

StoredKV KVCache::stored(int64_t layer, int64_t seq, int64_t length) const {
  StoredKV kv;
  kv.type = cache_element_type(key_type_);
  if (value_type_ != key_type_) kv.v_type = cache_element_type(value_type_);
  const int64_t at = offset(layer, seq, 0, 0);
  kv.k = row_at(false, at);
  kv.v = row_at(true, at);
  kv.batch_stride = kv_heads_ * slots_ * d_head_;
  kv.head_stride = slots_ * d_head_;
  kv.row_stride = d_head_;
  kv.heads = kv_heads_;
  kv.dim_k = kv.dim_v = d_head_;
  kv.length = length;
  kv.slots = ring_ ? slots_ : 0;
  kv.rotation = rotation_;
  kv.scores = scores_;
  return kv;
}

void KVCache::rotated(const float*& k_rows, const float*& v_rows, int64_t& row_stride,
                      int64_t count) const {
  if (rotation_ == 0) return;
  const int64_t width = kv_heads_ * d_head_;
  float* k = detail::thread_scratch(detail::CacheSlot::keys, count * width);
  float* v = detail::thread_scratch(detail::CacheSlot::values, count * width);
  for (int64_t t = 0; t < count; ++t)
    for (int64_t h = 0; h < kv_heads_; ++h) {
      const int64_t from = t * row_stride + h * d_head_, to = t * width + h * d_head_;
      std::copy(k_rows + from, k_rows + from + d_head_, k + to);
      std::copy(v_rows + from, v_rows + from + d_head_, v + to);
      hadamard_rotate(k + to, d_head_, rotation_);
      hadamard_rotate(v + to, d_head_, rotation_);
    }
  k_rows = k, v_rows = v, row_stride = width;
}

void KVCache::append(int64_t layer, int64_t seq, const float* k_rows, const float* v_rows,
                     int64_t row_stride, int64_t count) {
  check(layer >= 0 && layer < layers_, "kv cache: layer ", layer, " out of range [0, ", layers_,
        ")");
  check(count >= 0, "kv cache: append of ", count, " positions");
  check(count == 0 || (k_rows && v_rows), "kv cache: append without its keys or values");
  check_room(seq, count);
  rotated(k_rows, v_rows, row_stride, count);
  write(layer, seq, length(seq), count, k_rows, v_rows, row_stride);
}

void KVCache::attend(int64_t layer, int64_t seq, const AttentionArgs& args, const float* k_rows,
                     const float* v_rows, int64_t row_stride) {
  check(layer >= 0 && layer < layers_, "kv cache: layer ", layer, " out of range [0, ", layers_,
        ")");
  check_ndim(args.q, 4, "kv cache: attend", "q [1, Hq, T, d_head]");
  check(args.q.shape[0] == 1, "kv cache: attend runs one sequence, q is ", shape_of(args.q));
  const int64_t pos0 = length(seq), T = args.q.shape[2], end = pos0 + T;
  check_room(seq, T);
  StoredKV kv = stored(layer, seq, end);
  rotated(k_rows, v_rows, row_stride, T);
  const int64_t seen =
      args.mask.window_left >= 0 ? std::max<int64_t>(0, pos0 - args.mask.window_left) : 0;
  if (ring_ && end - seen > slots_) {
    // Storing the new rows first would overwrite positions their queries still see: they go
    // in beside the storage, and are stored after.
    kv.fresh_k =
        View(const_cast<float*>(k_rows), {1, kv_heads_, T, d_head_}, {0, d_head_, row_stride, 1});
    kv.fresh_v =
        View(const_cast<float*>(v_rows), {1, kv_heads_, T, d_head_}, {0, d_head_, row_stride, 1});
    attention(args, kv);
    detail::team_serial([&] { write(layer, seq, pos0, T, k_rows, v_rows, row_stride); });
    return;
  }
  // (In a thread team one thread stores the rows, the others waiting for them at its end.)
  detail::team_serial([&] { write(layer, seq, pos0, T, k_rows, v_rows, row_stride); });
  attention(args, kv);
}

}  // namespace qkv
