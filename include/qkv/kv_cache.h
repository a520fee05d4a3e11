// KVCache: the keys and values a decoder has already computed, kept so that generating the
// next token costs one row of work per layer instead of the whole prefix again.
//
// Per layer, per sequence, per key/value head: `slots` rows of d_head floats for K and for V,
// allocated once. A sequence's keys are written at the positions it has reached; its length
// grows by the tokens run through Model::forward_cached. attend() is how a model reads it:
// every cached attention goes through qkv::attention over the cache's StoredKV. Positions are
// rotated (RoPE) before they are stored, so a cached key never needs touching again.
//
// Storage (keys and values alike, or each in a type of its own): fp32; bf16 or fp16 (half the memory; keys and values are rounded to 8 or 11
// mantissa bits when written); or q8_0, q4_0 or q4_1, ggml's 32-value blocks with an fp16
// scale (q4_1: and an fp16 offset; 34, 18 or 20 bytes per 32 values: 0.27, 0.14 or 0.16 of
// fp32), each row quantized as it is written, as llama.cpp's quantizers do. Scores and softmax stay
// fp32 whatever the storage (see docs/api.md for the measured accuracy). Block storage needs a head
// dim of whole 32s. Rotation: a block-format cache (by default; any cache when asked) stores each
// key and value row rotated by a normalised Walsh–Hadamard transform (hadamard_rotate, in blocks of
// rotation_block(d_head)), and attention over it rotates the queries alike and the outputs
// back: the same result in real arithmetic, while a block's scale is chosen after the rotation
// has spread the row's outliers over the block (on SmolLM2 a q4_0 cache's perplexity cost falls
// from 24% to 7%; docs/api.md has the measurements).
// Ring mode (sliding-window models): only the last window + 1 positions are kept; position p
// lives in slot p mod slots, so memory stays bounded however long the sequence grows.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "qkv/attention.h"
#include <string>

#include "qkv/tensor.h"

namespace qkv {

struct ModelConfig;

enum class CacheType { f32, bf16, f16, q8_0, q4_0, q4_1 };
// "f32", "bf16", "f16", "q8_0", "q4_0" or "q4_1" (the CLI's --cache); a qkv::Error naming the
// choices for anything else.
CacheType cache_type(const std::string& name);
const char* cache_type_name(CacheType type);
// Every cache type's name, in that order (one table, kv_cache.cpp), and as a sentence:
// "f32, bf16, f16, q8_0, q4_0 or q4_1".
const std::vector<std::string>& cache_type_names();
std::string cache_type_choices();
// How the cache stores one element: its TensorType (f32, bf16, f16, q8_0, q4_0, q4_1).
TensorType cache_element_type(CacheType type);

// Whether a cache rotates its rows: automatic (the default) rotates the block formats q8_0,
// q4_0 and q4_1 and not f32, bf16 or f16; on and off force it.
enum class CacheRotation { automatic, on, off };
// "auto", "on" or "off" (the CLI's --cache-rotation); a qkv::Error naming them for anything else.
CacheRotation cache_rotation(const std::string& name);
const char* cache_rotation_name(CacheRotation rotation);
// Whether a cache of this type with this setting rotates; with keys and values of their own
// types, whether it rotates its rows (automatic: when either is a block format).
bool cache_rotates(CacheType type, CacheRotation rotation);
bool cache_rotates(CacheType keys, CacheType values, CacheRotation rotation);
// "int8" or "exact" (the CLI's --cache-scores; CacheScores, qkv/attention.h); a qkv::Error
// naming them for anything else.
CacheScores cache_scores(const std::string& name);
const char* cache_scores_name(CacheScores scores);

struct KVCacheOptions {
  int64_t batch = 1;    // sequences held side by side
  int64_t max_seq = 0;  // positions per sequence; 0 = the model's context
  CacheType type = CacheType::f32;  // keys and values
  // Keys or values in a format of their own, as llama.cpp's --cache-type-k/-v: q8_0 keys with
  // q4_0 values, say (low-bit values cost far less than low-bit keys: docs/api.md). Unset: type.
  std::optional<CacheType> key_type, value_type;
  CacheRotation rotation = CacheRotation::automatic;
  bool ring = false;  // keep only the last window + 1 positions (the model needs a window)
  // How decoding queries meet q8_0, q4_0 and q4_1 keys (StoredKV::scores, include/qkv/
  // attention.h): int8 (the query rounded to int8 blocks, integer dot products) or exact.
  CacheScores scores = CacheScores::int8;
};

class KVCache {
 public:
  KVCache(const ModelConfig& config, const KVCacheOptions& options);

  int64_t batch() const { return batch_; }
  int64_t layers() const { return layers_; }
  int64_t kv_heads() const { return kv_heads_; }
  int64_t d_head() const { return d_head_; }
  int64_t slots() const { return slots_; }      // rows kept per sequence and head
  int64_t max_seq() const { return max_seq_; }  // longest a sequence may grow
  bool ring() const { return ring_; }
  CacheType key_type() const { return key_type_; }
  CacheType value_type() const { return value_type_; }
  CacheType type() const { return key_type_; }  // (the keys': see value_type())
  // The block of the rotation its rows are stored with (StoredKV::rotation); 0: none.
  int64_t rotation() const { return rotation_; }
  CacheScores scores() const { return scores_; }
  int64_t bytes() const;  // memory held for keys and values

  // Positions sequence `seq` has seen so far (its next token goes at this position).
  int64_t length(int64_t seq) const;
  // Forgets one sequence (or all): its next token goes at position 0 again.
  void reset(int64_t seq);
  void reset();

  // Throws qkv::Error when `count` more positions would not fit in sequence `seq`.
  void check_room(int64_t seq, int64_t count) const;

  // Stores the keys and values of sequence `seq`'s next Tq positions (from length(seq) on;
  // key t of head h at k_rows[t · row_stride + h · d_head …], values alike) at `layer`, and runs
  // attention of args.q [1, Hq, Tq, d_head] over every position of the sequence so far, these
  // included, into args.out: qkv::attention(args, StoredKV) over this cache (args as for
  // qkv::attention, with k and v empty and the mask in positions). The sequence's length
  // grows when advance() says so, once every layer has run.
  void attend(int64_t layer, int64_t seq, const AttentionArgs& args, const float* k_rows,
              const float* v_rows, int64_t row_stride);
  void advance(int64_t seq, int64_t count);  // the sequence has grown by `count` positions
  // Stores sequence `seq`'s next `count` positions at `layer` as attend() does (rounded,
  // quantized and rotated as the cache stores them), without attending: a prompt's rows
  // stored ahead, or a cache filled for a benchmark. advance() then grows the sequence.
  void append(int64_t layer, int64_t seq, const float* k_rows, const float* v_rows,
              int64_t row_stride, int64_t count);
  // Positions 0 … length − 1 of one sequence at one layer, as attention reads them
  // (qkv::attention(args, StoredKV)); its batch stride steps to the next sequence.
  StoredKV stored(int64_t layer, int64_t seq, int64_t length) const;

 private:
  // Stores positions [pos0, pos0 + count) of one sequence (rows as attend() takes them).
  void write(int64_t layer, int64_t seq, int64_t pos0, int64_t count, const float* k_rows,
             const float* v_rows, int64_t row_stride);
  // The rows as they are stored: rotated into scratch where the cache rotates (else as given).
  void rotated(const float*& k_rows, const float*& v_rows, int64_t& row_stride,
               int64_t count) const;
  int64_t offset(int64_t layer, int64_t seq, int64_t head, int64_t slot) const;
  CacheType type_of(bool value) const { return value ? value_type_ : key_type_; }
  float* f32(bool value) const { return (value ? v_ : k_).data(); }
  // bf16 or fp16 storage: 16-bit elements.
  uint16_t* bits16(bool value) const {
    return reinterpret_cast<uint16_t*>((value ? v_ : k_).data());
  }
  // Block storage: the byte where element offset `at` (a multiple of 32) begins.
  uint8_t* block_at(bool value, int64_t at) const;
  // One key (or value) row stored at element offset `at`, rounded to its type; the row there.
  void store_row(bool value, int64_t at, const float* x);
  const void* row_at(bool value, int64_t at) const;

  int64_t batch_, layers_, kv_heads_, d_head_, slots_, max_seq_, rotation_;
  bool ring_;
  CacheType key_type_, value_type_;
  CacheScores scores_;
  Tensor k_, v_;  // [layers, batch, kv_heads, slots, d_head] elements, packed into floats
  std::vector<int64_t> length_;
};

}  // namespace qkv
