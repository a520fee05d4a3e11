// Attention over stored keys and values (see include/qkv/attention.h): the one road from a
// key/value cache to the kernels. It reads the cache in place (a ring run by run, in position
// order), and gathers an fp32 copy of the positions the queries see only beside fresh rows.
#include <algorithm>
#include <string>
#include <utility>
#include <tuple>
#include <vector>

#include "attention/kernels.h"
#include "attention/plan.h"
#include "attention/masks.h"
#include "attention/overlap.h"
#include "qkv/attention.h"
#include "qkv/error.h"
#include "qkv/mask_function.h"
#include "qkv/number_format.h"
#include "qkv/quant.h"
#include "qkv/threads.h"
#include "util/parallel.h"
#include "util/scratch.h"

namespace qkv {
namespace {

constexpr const char* kWhere = "attention over a cache";

// The first position any query may see (the queries are the last Tq of `length`): after the
// window's left edge, and with a block_mask at its first block that is not empty for some
// query's block (its pairs may still all be hidden). At most the first query's own position.
int64_t first_seen(const AttentionArgs& a, int64_t length, int64_t Tq) {
  const Mask& m = a.mask;
  int64_t first = m.window_left >= 0 ? std::max<int64_t>(0, length - Tq - m.window_left) : 0;
  if (const BlockMask* f = a.block_mask) {
    const int64_t s = f->block();
    int64_t lowest = length - Tq;
    for (int64_t b = 0; b < f->batch(); ++b)
      for (int64_t h = 0; h < f->heads(); ++h)
        for (int64_t qb = (length - Tq) / s; qb <= (length - 1) / s; ++qb)
          for (const auto& blocks : {f->full_key_blocks(b, h, qb), f->partial_key_blocks(b, h, qb)})
            if (!blocks.empty()) lowest = std::min(lowest, blocks.front() * s);
    first = std::max(first, lowest);
  }
  return first;
}

// The first position in [from, to) that a block_mask and the fixed mask show one of the queries
// (the last Tq of `length`), or `to` when they hide every such pair.
int64_t first_shown(const BlockMask& f, const Mask& mask, int64_t length, int64_t Tq, int64_t from,
                    int64_t to) {
  const int64_t s = f.block();
  int64_t shown = to;
  for (int64_t b = 0; b < f.batch(); ++b)
    for (int64_t h = 0; h < f.heads(); ++h)
      for (int64_t q = length - Tq; q < length; ++q) {
        const detail::KeyRange fixed = detail::visible_keys(mask, b, q - (length - Tq), Tq, length);
        for (int64_t kv = std::max(from, fixed.begin); kv < std::min({to, shown, fixed.end});
             ++kv) {
          const BlockState st = f.state(b, h, q / s, kv / s);
          if (st == BlockState::empty) kv = (kv / s + 1) * s - 1;  // (the block's last)
          else if (st == BlockState::full || evaluate(f.mask(), b, h, q, kv)) shown = kv;
        }
      }
  return shown;
}

int64_t fresh_rows(const StoredKV& kv) { return kv.fresh_k.empty() ? 0 : kv.fresh_k.shape[2]; }

// Rows of 32-value blocks (q8_0, q4_0, q4_1).
bool in_blocks(TensorType t) { return is_kv_block_type(t); }
constexpr int64_t kBlock = kKvBlockValues;

// The values' type (the keys' unless StoredKV::v_type says otherwise).
TensorType value_type(const StoredKV& kv) { return kv.v_type.value_or(kv.type); }

// The stored rows of keys (or values) at p, of `type`, from position `first` on: the row source
// the kernels read in place.
detail::KvRows stored_rows(const StoredKV& kv, TensorType type, const void* p, int64_t first,
                           int64_t dim) {
  detail::KvRows r = detail::kv_rows(type, p, kv.batch_stride, kv.head_stride, kv.row_stride,
                                     kv.heads, kv.length - first, dim);
  r.first = first, r.slots = kv.slots;
  r.int8_scores = in_blocks(type) && kv.scores == CacheScores::int8;
  r.positions = true;
  return r;
}
detail::KvRows stored_keys(const StoredKV& kv, int64_t first) {
  return stored_rows(kv, kv.type, kv.k, first, kv.dim_k);
}
detail::KvRows stored_values(const StoredKV& kv, int64_t first) {
  return stored_rows(kv, value_type(kv), kv.v, first, kv.dim_v);
}

void validate(const AttentionArgs& a, const StoredKV& kv) {
  check(a.k.empty() && a.v.empty(), kWhere,
        ": k and v are read from the storage; leave args.k and args.v empty");
  for (const auto& [what, type] : {std::pair{"keys", kv.type}, std::pair{"values", value_type(kv)}})
    if (!is_kv_row_type(type)) {  // (the names only on failure)
      std::string names;
      for (TensorType t : kv_row_types()) names += (names.empty() ? "" : ", ") + to_string(t);
      fail(kWhere, ": ", what, " stored as ", to_string(type), " (", names, " are read)");
    }
  for (const auto& [what, type, dim_name, dim] :
       {std::tuple{"keys", kv.type, "dim_k", kv.dim_k},
        std::tuple{"values", value_type(kv), "dim_v", kv.dim_v}})
    if (in_blocks(type))
      check(dim % kBlock == 0 && kv.batch_stride % kBlock == 0 && kv.head_stride % kBlock == 0 &&
                kv.row_stride % kBlock == 0,
            kWhere, ": ", what, " stored as ", to_string(type), " are rows of 32-value blocks: ",
            dim_name, " ", dim, " and the strides (", kv.batch_stride, ", ", kv.head_stride, ", ",
            kv.row_stride, ") must be multiples of 32");
  check(kv.k != nullptr && kv.v != nullptr, kWhere, ": no stored keys or values (null)");
  check(kv.heads > 0 && kv.dim_k > 0 && kv.dim_v > 0, kWhere,
        ": heads, dim_k and dim_v must be > 0, got ", kv.heads, ", ", kv.dim_k, ", ", kv.dim_v);
  check(kv.slots >= 0 && kv.batch_stride >= 0 && kv.head_stride >= 0 && kv.row_stride >= 0, kWhere,
        ": slots and strides must be >= 0");
  check(kv.rotation == 0 || (kv.rotation > 0 && (kv.rotation & (kv.rotation - 1)) == 0 &&
                             kv.dim_k % kv.rotation == 0 && kv.dim_v % kv.rotation == 0),
        kWhere, ": rotation ", kv.rotation,
        " must be 0 (none) or a power of two that divides dim_k ", kv.dim_k, " and dim_v ",
        kv.dim_v);
  check(a.mask.bias.empty(), kWhere, ": an additive bias is not supported");
  check(a.mask.kv_len == nullptr, kWhere,
        ": padding (kv_len) is not supported: the cache's length is every sequence's");
  check(a.packed.num_seqs == 0, kWhere, ": packed sequences are not supported");
  check(a.dropout.p == 0, kWhere,
        ": dropout is not supported over a cache (it is for training; decoding keeps every "
        "weight)");
  check_ndim(a.q, 4, kWhere, "q [B, Hq, Tq, D]");
  const int64_t B = a.q.shape[0], Tq = a.q.shape[2];
  check(kv.length >= Tq, kWhere, ": the cache holds ", kv.length, " positions, fewer than the ", Tq,
        " queries (the queries' own positions are stored first)");
  // The checks of attention(), on the shapes the stored keys and values have (fp32 views of
  // those shapes over one float that nothing reads).
  static float nothing = 0;
  AttentionArgs shapes = a;
  shapes.block_mask = nullptr;  // (over positions: checked below)
  shapes.k = View(&nothing, {B, kv.heads, kv.length, kv.dim_k}, {0, 0, 0, 0});
  shapes.v = View(&nothing, {B, kv.heads, kv.length, kv.dim_v}, {0, 0, 0, 0});
  detail::validate_shapes(shapes, kWhere);
  if (const BlockMask* m = a.block_mask) {
    detail::validate_block_mask_batch(*m, B, a.q.shape[1], kWhere);
    check(m->queries() >= kv.length && m->keys() >= kv.length, kWhere,
          ": the block_mask is for Q_LEN ", m->queries(), " and KV_LEN ", m->keys(),
          ", but the cache holds ", kv.length,
          " positions (over a cache a mask function reads positions: make it for the cache's "
          "capacity)");
  }
  const int64_t n = fresh_rows(kv);
  if (n > 0 || !kv.fresh_v.empty()) {
    const View& fk = kv.fresh_k;
    const View& fv = kv.fresh_v;
    check(!fk.empty() && !fv.empty() && fk.ndim == 4 && fv.ndim == 4 && fk.shape[0] == B &&
              fk.shape[1] == kv.heads && fk.shape[3] == kv.dim_k && fv.shape[0] == B &&
              fv.shape[1] == kv.heads && fv.shape[2] == n && fv.shape[3] == kv.dim_v &&
              n <= kv.length,
          kWhere, ": fresh_k ", shape_of(fk), " and fresh_v ", shape_of(fv), " must be [", B, ", ",
          kv.heads, ", n <= ", kv.length, ", ", kv.dim_k, " and ", kv.dim_v, "]");
  }
  // The outputs apart from the queries and from the rows the storage holds (in bytes).
  const int64_t rows = kv.slots > 0 ? kv.slots : kv.length;
  auto stored = [&](const char* name, const detail::KvRows& r, const void* p, int64_t dim) {
    int64_t shape[3] = {B, kv.heads, r.bytes((rows - 1) * kv.row_stride + dim)};
    int64_t stride[3] = {r.bytes(kv.batch_stride), r.bytes(kv.head_stride), 1};
    detail::Extent e = detail::extent_of(name, p, 3, shape, stride, 1);
    e.dense = true;  // compared by its whole range: the rows between are the cache's own
    return e;
  };
  using detail::extent_of;
  detail::check_no_overlap(
      kWhere, {extent_of("out", a.out), extent_of("lse", a.lse, B * a.q.shape[1] * Tq)},
      {extent_of("q", a.q), stored("stored keys", stored_keys(kv, 0), kv.k, kv.dim_k),
       stored("stored values", stored_values(kv, 0), kv.v, kv.dim_v),
       extent_of("fresh_k", kv.fresh_k),
       extent_of("fresh_v", kv.fresh_v)});
  const int64_t stored_end = kv.length - n;
  const int64_t held_from = kv.slots > 0 ? std::max<int64_t>(0, stored_end - kv.slots) : 0;
  int64_t seen = first_seen(a, kv.length, Tq);
  if (seen < held_from && a.block_mask)  // (the function may hide the positions the ring lost)
    seen = first_shown(*a.block_mask, a.mask, kv.length, Tq, seen, held_from);
  check(seen >= held_from, kWhere, ": the queries see position ", seen, ", but the ring of ",
        kv.slots, " slots holds positions from ", held_from, " on");
}

// Positions [first, length) of every (sequence, head) into K [B, Hkv, n, D] and V (fp32,
// contiguous): from the storage, or from the fresh rows rounded as the storage would.
void gather(const StoredKV& kv, int64_t B, int64_t first, float* K, float* V) {
  const int64_t n = kv.length - first, D = kv.dim_k, Dv = kv.dim_v;
  const int64_t fresh_from = kv.length - fresh_rows(kv);
  const detail::KvRows stored_k = stored_keys(kv, 0), stored_v = stored_values(kv, 0);
  auto stored_row = [&](const detail::KvRows& r, int64_t b, int64_t h, int64_t p, float* out) {
    const uint8_t* row = r.row(b, h, p);
    switch (r.type) {
      case TensorType::f32: {
        const auto* x = reinterpret_cast<const float*>(row);
        std::copy(x, x + r.dim, out);
        return;
      }
      case TensorType::bf16:
        for (int64_t d = 0; d < r.dim; ++d)
          out[d] = bf16_to_float(reinterpret_cast<const uint16_t*>(row)[d]);
        return;
      case TensorType::f16:
        for (int64_t d = 0; d < r.dim; ++d)
          out[d] = half_to_float(reinterpret_cast<const uint16_t*>(row)[d]);
        return;
      default:
        quant::dequantize(r.type, row, r.dim, out);  // (the blocks; it refuses anything else)
    }
  };
  // A fresh row rounded as storing it in `type` would.
  auto fresh_row = [&](TensorType type, const View& fresh, int64_t b, int64_t h, int64_t t,
                       int64_t dim, float* out) {
    if (in_blocks(type)) {  // quantized and back, as storing it would
      for (int64_t d = 0; d < dim; ++d) out[d] = fresh.get(b, h, t, d);
      for (int64_t e = 0; e < dim; e += kBlock) {  // block by block
        uint8_t block[2 * kBlock];  // more than a block of any cache format (q8_0: 34 bytes)
        quant::quantize_into(type, out + e, kBlock, block);
        quant::dequantize(type, block, kBlock, out + e);
      }
      return;
    }
    for (int64_t d = 0; d < dim; ++d) {
      const float x = fresh.get(b, h, t, d);
      out[d] = type == TensorType::bf16  ? bf16_to_float(float_to_bf16(x))
               : type == TensorType::f16 ? half_to_float(float_to_half(x))
                                         : x;
    }
  };
  const int64_t heads = B * kv.heads;
  // The copy is the cost of a bf16 (or ring) cache's step: the heads in parallel.
  detail::parallel_for(heads, detail::threads_for(heads * n * (D + Dv)), [&](int64_t bh) {
    const int64_t b = bh / kv.heads, h = bh % kv.heads;
    for (int64_t t = 0; t < n; ++t) {
      const int64_t p = first + t;
      float* k = K + (bh * n + t) * D;
      float* v = V + (bh * n + t) * Dv;
      if (p < fresh_from) {
        stored_row(stored_k, b, h, p, k);
        stored_row(stored_v, b, h, p, v);
      } else {
        fresh_row(kv.type, kv.fresh_k, b, h, p - fresh_from, D, k);
        fresh_row(value_type(kv), kv.fresh_v, b, h, p - fresh_from, Dv, v);
      }
    }
  });
}

// The rows attention reads for a call: the stored ones in place, from row `first` on (the
// positions a wrapped ring still holds), or the positions the queries see, from `first` on,
// to be gathered as fp32 (their rows' data null until then).
struct StoredRows {
  detail::KvRows K, V;
  bool in_place = false;
};
StoredRows stored_rows_for(const AttentionArgs& args, const StoredKV& kv) {
  const int64_t B = args.q.shape[0], Tq = args.q.shape[2], Hkv = kv.heads;
  // A ring whose slots are out of order holds the last `slots` positions; the kernels read its
  // rows in position order, run by run (split at the wrap).
  const bool wrapped = kv.slots > 0 && kv.length > kv.slots;
  const int64_t held = wrapped ? kv.length - kv.slots : 0;
  if (fresh_rows(kv) == 0)
    // Read in place, in the storage's type (the kernels widen 16-bit rows and blocks).
    return {stored_keys(kv, held), stored_values(kv, held), true};
  // The positions the queries see, in order, as fp32.
  // (Positions the ring no longer holds are hidden from every query: validate made sure.)
  const int64_t held_from =
      kv.slots > 0 ? std::max<int64_t>(0, kv.length - fresh_rows(kv) - kv.slots) : 0;
  const int64_t first = std::max(first_seen(args, kv.length, Tq), held_from);
  const int64_t n = kv.length - first;
  // (Rows [0, n) hold positions first … length − 1: the functions read those.)
  const auto unread = [&](int64_t dim) {
    return detail::kv_rows(View(static_cast<float*>(nullptr), {B, Hkv, n, dim}));
  };
  StoredRows r{unread(kv.dim_k), unread(kv.dim_v), false};
  r.K.first = r.V.first = first;
  r.K.positions = r.V.positions = true;
  return r;
}

// attention(args, kv) once validated, over rows stored as they are (no rotation).
void attend_stored(const AttentionArgs& args, const StoredKV& kv) {
  StoredRows read = stored_rows_for(args, kv);
  if (read.in_place) return detail::forward_validated(args, read.K, read.V);  // checked above
  const int64_t B = args.q.shape[0], Hkv = kv.heads, n = read.K.rows;
  float* K = detail::team_scratch(detail::StoredSlot::keys, B * Hkv * n * kv.dim_k);
  float* V = detail::team_scratch(detail::StoredSlot::values, B * Hkv * n * kv.dim_v);
  gather(kv, B, read.K.first, K, V);
  read.K.data = K, read.V.data = V;
  detail::forward_validated(args, read.K, read.V);
}

// x's rows (b, h, i) as fp32 into to [B, H, T, E], each rotated by hadamard_rotate.
void rotated_rows(const View& x, int64_t block, float* to) {
  const int64_t B = x.shape[0], H = x.shape[1], T = x.shape[2], E = x.shape[3];
  detail::parallel_for(B * H, detail::threads_for(B * H * T * E), [&](int64_t bh) {
    for (int64_t i = 0; i < T; ++i) {
      float* row = to + (bh * T + i) * E;
      if (x.type == TensorType::f32 && x.stride[3] == 1) {
        const float* from = &x(bh / H, bh % H, i, 0);
        std::copy(from, from + E, row);
      } else {
        for (int64_t e = 0; e < E; ++e) row[e] = x.get(bh / H, bh % H, i, e);
      }
      hadamard_rotate(row, E, block);
    }
  });
}

}  // namespace

detail::Call detail::call_of(const AttentionArgs& args, const StoredKV& kv) {
  const StoredRows read = stored_rows_for(args, kv);
  return call_of(args, read.K, read.V);
}

void attention(const AttentionArgs& args, const StoredKV& kv) {
  validate(args, kv);
  if (kv.rotation == 0) return attend_stored(args, kv);
  // The queries rotated as the rows were; the outputs rotated back: H (Σ p v') = Σ p v.
  const int64_t B = args.q.shape[0], Hq = args.q.shape[1], Tq = args.q.shape[2];
  const int64_t D = kv.dim_k, Dv = kv.dim_v;
  float* q = detail::team_scratch(detail::StoredSlot::rotated_queries, B * Hq * Tq * D);
  float* out = detail::team_scratch(detail::StoredSlot::rotated_out, B * Hq * Tq * Dv);
  rotated_rows(args.q, kv.rotation, q);
  AttentionArgs x = args;
  x.q = View(q, {B, Hq, Tq, D});
  x.out = View(out, {B, Hq, Tq, Dv});
  StoredKV plain = kv;
  plain.rotation = 0;
  attend_stored(x, plain);
  detail::parallel_for(B * Hq, detail::threads_for(B * Hq * Tq * Dv), [&](int64_t bh) {
    for (int64_t i = 0; i < Tq; ++i) {
      float* row = out + (bh * Tq + i) * Dv;
      hadamard_rotate(row, Dv, kv.rotation);
      if (args.out.type == TensorType::f32 && args.out.stride[3] == 1)
        std::copy(row, row + Dv, &args.out(bh / Hq, bh % Hq, i, 0));
      else
        for (int64_t e = 0; e < Dv; ++e) args.out.set(bh / Hq, bh % Hq, i, e, row[e]);
    }
  });
}

}  // namespace qkv
