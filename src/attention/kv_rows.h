// The row source: where an attention call's keys (or values) live, in what element format and
// layout, which position each row holds, and which rows lie a row apart (runs). The forward kernels (the tiled forward, split-KV
// decoding) read K and V through it, whether they came as views (attention()) or as a cache's
// storage (attention(args, StoredKV)); the backward reads views (it never runs over a cache). A
// new cache layout or a paged cache is one more way of answering row(b, h, j) here.
#pragma once

#include <cstdint>
#include <vector>

#include "qkv/attention.h"
#include "qkv/tensor.h"

namespace qkv::detail {

struct KvRows {
  TensorType type = TensorType::f32;  // f32, bf16, f16 elements; q8_0, q4_0, q4_1 32-value blocks
  const void* data = nullptr;  // element 0 of sequence 0, head 0, slot 0
  int64_t batch_stride = 0, head_stride = 0, row_stride = 0;  // in values
  int64_t heads = 0, rows = 0, dim = 0;
  int64_t first = 0;  // the position row 0 holds: row j holds position first + j
  int64_t slots =
      0;  // a ring of this many slots (0: none): row j lives in slot (first + j) % slots
  int64_t unit_values = 1, unit_bytes = 4;  // an element, or a block of 32 values and its bytes
  bool int8_scores = false;  // blocks: decoding may round the queries to int8 (CacheScores::int8)
  // A cache's rows (attention over a StoredKV): mask and score functions read positions, kv_idx
  // = first + j for row j and q_idx = first + rows − Tq + i for query i (the last Tq
  // positions). Else (views) the call's indices, 0 … Tq − 1 and 0 … rows − 1.
  bool positions = false;

  int64_t query_origin(int64_t Tq) const { return positions ? first + rows - Tq : 0; }
  int64_t key_origin() const { return positions ? first : 0; }

  bool in_blocks() const { return unit_values > 1; }
  int64_t slot(int64_t j) const { return slots > 0 ? (first + j) % slots : j; }
  // The first row that a ring's wrap puts back in slot 0 (rows when none does): rows [0, wrap)
  // and [wrap, rows) each lie row_stride apart.
  int64_t wrap() const {
    if (slots == 0 || (first % slots) == 0) return rows;
    const int64_t w = slots - first % slots;
    return w < rows ? w : rows;
  }
  // Rows [j, j + count) as runs of rows a row_stride apart, in order: f(first, n) for each.
  // A plain source is one run; a ring's wrap splits a range in two (a page table would end a
  // run at each page). The kernels read a run in place.
  template <class F>
  void each_run(int64_t j, int64_t count, F&& f) const {
    const int64_t w = wrap();
    if (j < w && w < j + count) {
      f(j, w - j);
      f(w, j + count - w);
    } else {
      f(j, count);
    }
  }
  bool one_run(int64_t j, int64_t count) const {
    const int64_t w = wrap();
    return !(j < w && w < j + count);
  }
  // Rows [j, j + count) of head (b, h) copied together to `to` (count × row_bytes()), run by
  // run: a range a ring's wrap splits, made one run.
  void copy_rows(int64_t b, int64_t h, int64_t j, int64_t count, void* to) const;
  // Bytes of `values` values (whole blocks for block formats).
  int64_t bytes(int64_t values) const { return values / unit_values * unit_bytes; }
  int64_t row_bytes() const { return bytes(dim); }
  int64_t stride_bytes() const { return bytes(row_stride); }
  const uint8_t* row(int64_t b, int64_t h, int64_t j) const {
    return static_cast<const uint8_t*>(data) +
           bytes(b * batch_stride + h * head_stride + slot(j) * row_stride);
  }
};

// Rows of `type` at `data`, the unit sizes filled in from the type.
KvRows kv_rows(TensorType type, const void* data, int64_t batch_stride, int64_t head_stride,
               int64_t row_stride, int64_t heads, int64_t rows, int64_t dim);
// The rows of a view [B, H, T, dim] of f32, bf16 or f16 whose elements are contiguous.
KvRows kv_rows(const View& v);

// v itself when its head dim is contiguous; else a copy of it with contiguous rows, in its own
// element type, in `storage` (the kernels read rows with unit stride; strided head dims are
// rare).
View contiguous_rows(const View& v, std::vector<char>& storage);

}  // namespace qkv::detail
