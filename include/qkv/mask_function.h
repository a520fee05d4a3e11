// Programmable masks: a mask function mask_mod(b, h, q_idx, kv_idx) → bool written as an
// expression, and a BlockMask that says, per block of queries and block of keys, whether the
// function hides every pair, shows every pair, or must be asked pair by pair.
//
// The expression is data, not code: the kernels evaluate it a tile of scores at a time with
// SIMD, and no compiler runs when a mask is made. Written in C++ with the builder below
//
//   using namespace qkv::mask_args;                       // b, h, q_idx, kv_idx
//   qkv::MaskTensor doc("doc", {T}, document_of_each_position);
//   qkv::MaskExpr m = kv_idx <= q_idx && doc[q_idx] == doc[kv_idx];
//
// or as text (the CLI's --mask, qkv::parse_mask): "kv_idx <= q_idx && doc[q_idx] == doc[kv_idx]".
//
// Values. Every value is a 32-bit integer or a boolean. The arithmetic is Python's on integers:
//   a / b   floor division (Python's a // b; "//" is accepted too): -7 / 2 = -4
//   a % b   the remainder with the divisor's sign (Python's a % b): -7 % 2 = 1
//   a / 0 = 0 and a % 0 = a (so a == (a / b) * b + a % b still holds)
//   min, max, abs; comparisons == != < <= > >= give booleans; && || ! (or & | ~) take booleans;
//   where(c, x, y) is x where c holds, else y (both sides are evaluated, as torch.where does).
// A mask whose intermediate values may leave 32 bits for some (b, h, q_idx, kv_idx) of its
// BlockMask is refused when the BlockMask is made (the bound is worked out from the ranges of the
// indices and of the captured tensors' values).
//
// Indices. For attention(args) with args.block_mask, q_idx runs over 0 … Tq − 1 and kv_idx over
// 0 … Tk − 1 (as in PyTorch's flex_attention); b over the batch, h over the query heads. For
// attention over a cache (attention(args, StoredKV)) they are positions: kv_idx the key's, q_idx
// the query's, so a mask means the same in a prefill, a chunked prefill and decoding.
// Captured tensors hold integers the function reads by index (a document id per position, a
// prefix length per sequence): an index outside a tensor, for any (b, h, q_idx, kv_idx) of the
// BlockMask, is a qkv::Error naming the tensor and the index, never a read out of bounds.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace qkv {

namespace detail {
struct MaskNode;
struct MaskTensorData;
struct MaskProgram;
}  // namespace detail

// An integer or boolean expression of b, h, q_idx and kv_idx. Cheap to copy (it shares its
// nodes). Operators build bigger expressions; an operand of the wrong kind (an integer where a
// boolean is needed or the other way) is a qkv::Error naming the operator.
class MaskExpr {
 public:
  MaskExpr(int64_t constant);  // an integer constant (it must fit 32 bits)
  MaskExpr(int constant) : MaskExpr(static_cast<int64_t>(constant)) {}
  MaskExpr(bool constant);
  MaskExpr(double constant);  // a float constant (score functions), held as a 32-bit float
  MaskExpr(float constant) : MaskExpr(static_cast<double>(constant)) {}
  explicit MaskExpr(std::shared_ptr<const detail::MaskNode> node) : node_(std::move(node)) {}

  bool is_bool() const;
  bool is_real() const;  // a float (include/qkv/score_function.h)
  const detail::MaskNode& node() const { return *node_; }
  const std::shared_ptr<const detail::MaskNode>& shared() const { return node_; }

  // The operators and functions are found through their MaskExpr operands only (hidden
  // friends), so that abs(int), min(int, int) and int == int keep their usual meaning.
  friend MaskExpr operator+(const MaskExpr& x, const MaskExpr& y);
  friend MaskExpr operator-(const MaskExpr& x, const MaskExpr& y);
  friend MaskExpr operator*(const MaskExpr& x, const MaskExpr& y);
  friend MaskExpr operator/(const MaskExpr& x, const MaskExpr& y);  // floor division
  friend MaskExpr operator%(const MaskExpr& x, const MaskExpr& y);  // Python's remainder
  friend MaskExpr operator-(const MaskExpr& x);
  friend MaskExpr operator==(const MaskExpr& x, const MaskExpr& y);
  friend MaskExpr operator!=(const MaskExpr& x, const MaskExpr& y);
  friend MaskExpr operator<(const MaskExpr& x, const MaskExpr& y);
  friend MaskExpr operator<=(const MaskExpr& x, const MaskExpr& y);
  friend MaskExpr operator>(const MaskExpr& x, const MaskExpr& y);
  friend MaskExpr operator>=(const MaskExpr& x, const MaskExpr& y);
  friend MaskExpr operator&&(const MaskExpr& x, const MaskExpr& y);  // both sides evaluated
  friend MaskExpr operator||(const MaskExpr& x, const MaskExpr& y);
  friend MaskExpr operator!(const MaskExpr& x);
  friend MaskExpr where(const MaskExpr& condition, const MaskExpr& x, const MaskExpr& y);
  friend MaskExpr min(const MaskExpr& x, const MaskExpr& y);
  friend MaskExpr max(const MaskExpr& x, const MaskExpr& y);
  friend MaskExpr abs(const MaskExpr& x);
  // Floats (score functions, include/qkv/score_function.h): an integer as a float, and the
  // functions of floats. Arithmetic that mixes an integer and a float is float arithmetic.
  friend MaskExpr to_float(const MaskExpr& x);
  friend MaskExpr exp(const MaskExpr& x);
  friend MaskExpr log(const MaskExpr& x);
  friend MaskExpr tanh(const MaskExpr& x);
  friend MaskExpr sigmoid(const MaskExpr& x);
  friend MaskExpr sqrt(const MaskExpr& x);

 private:
  std::shared_ptr<const detail::MaskNode> node_;
};

// The four arguments of a mask function, for `using namespace qkv::mask_args;`.
namespace mask_args {
extern const MaskExpr b, h, q_idx, kv_idx;
}

// PyTorch's and_masks / or_masks: all (any) of the masks; no masks: true (false).
MaskExpr and_masks(std::initializer_list<MaskExpr> masks);
MaskExpr or_masks(std::initializer_list<MaskExpr> masks);

// An integer tensor a mask function reads, captured by value (a copy of `values`, row-major
// over `shape`). Its name appears in errors and in the text form.
class MaskTensor {
 public:
  MaskTensor(std::string name, std::vector<int64_t> shape, std::vector<int32_t> values);
  MaskExpr operator[](const MaskExpr& index) const;         // a 1-D tensor's element
  MaskExpr at(const std::vector<MaskExpr>& indices) const;  // one index per dim
  const std::string& name() const;
  const std::shared_ptr<const detail::MaskTensorData>& data() const { return data_; }

 private:
  std::shared_ptr<const detail::MaskTensorData> data_;
};

// The text form: C-like operators with C's precedence (unary, * / %, + -, comparisons, &&, ||),
// integer literals, true/false, b, h, q_idx, kv_idx, where(c, x, y), min, max, abs, and the
// given tensors by name (doc[q_idx], prefix[b]). A qkv::Error names the column (from 1) of what
// it cannot read and what it expected there.
MaskExpr parse_mask(std::string_view text, std::span<const MaskTensor> tensors = {});
// The expression in the text form (parse_mask reads it back to the same expression).
std::string to_string(const MaskExpr& mask);
// The expression at one point, evaluated node by node in 64-bit integers (the reference the
// kernels are tested against). Throws qkv::Error for an index outside a tensor, or a value
// that leaves 32 bits.
int64_t evaluate(const MaskExpr& mask, int64_t b, int64_t h, int64_t q_idx, int64_t kv_idx);

// Which pairs a block of queries and a block of keys have visible under a mask function.
enum class BlockState : uint8_t { empty, partial, full };

// A mask function's blocks over B batches, H heads, Tq queries and Tk keys, in square blocks
// of `block` positions (128 by default, as PyTorch's; the same on every CPU). B = 1 (H = 1)
// serves every batch (head) of a call when the function does not read b (h). Per block of
// queries, the blocks of keys that are full (every pair visible: the kernels never evaluate the
// function there) and partial (evaluated pair by pair, in registers); the empty ones are never
// read. The transposed lists, per block of keys, serve the backward's dK and dV. Made once, it
// is reused by every layer and call of the same shape. Memory: one byte per block pair plus
// 4 bytes per full or partial pair in each direction, for each batch and head the function
// reads (one when it reads neither b nor h).
class BlockMask {
 public:
  BlockMask() = default;
  const MaskExpr& mask() const { return *mask_; }
  bool has_mask() const { return mask_ != nullptr; }
  int64_t batch() const { return B_; }
  int64_t heads() const { return H_; }
  int64_t queries() const { return Tq_; }
  int64_t keys() const { return Tk_; }
  int64_t block() const { return block_; }
  int64_t query_blocks() const { return q_blocks_; }
  int64_t key_blocks() const { return kv_blocks_; }
  // Whether the function reads b or h (then B or H must be the call's, not 1).
  bool reads_batch() const { return reads_b_; }
  bool reads_head() const { return reads_h_; }

  // The state of query block qb and key block kb for batch b and head h (b, h taken mod 1 when
  // the mask broadcasts).
  BlockState state(int64_t b, int64_t h, int64_t qb, int64_t kb) const {
    return static_cast<BlockState>(state_[((row(b, h) * q_blocks_) + qb) * kv_blocks_ + kb]);
  }
  // Key blocks of query block qb, ascending: the full ones and the partial ones.
  std::span<const int32_t> full_key_blocks(int64_t b, int64_t h, int64_t qb) const;
  std::span<const int32_t> partial_key_blocks(int64_t b, int64_t h, int64_t qb) const;
  // Query blocks of key block kb, ascending (the transposed lists).
  std::span<const int32_t> full_query_blocks(int64_t b, int64_t h, int64_t kb) const;
  std::span<const int32_t> partial_query_blocks(int64_t b, int64_t h, int64_t kb) const;
  // The pairs the mask leaves visible, over all B × H (counted when it was made).
  int64_t visible_pairs() const { return visible_pairs_; }
  // Bytes held (the grid and the lists), and how long making it took.
  int64_t bytes() const;
  double build_seconds() const { return build_seconds_; }

  // The compiled form the kernels evaluate (src/mask/program.h).
  const detail::MaskProgram& program() const { return *program_; }

 private:
  friend BlockMask create_block_mask(const MaskExpr&, int64_t, int64_t, int64_t, int64_t, int64_t);
  // Only the batches (heads) the function reads are stored.
  int64_t row(int64_t b, int64_t h) const {
    return (reads_b_ ? b : 0) * stored_H_ + (reads_h_ ? h : 0);
  }
  std::span<const int32_t> list(const std::vector<int64_t>& offsets,
                                const std::vector<int32_t>& items, int64_t at) const;

  std::shared_ptr<const MaskExpr> mask_;
  std::shared_ptr<const detail::MaskProgram> program_;
  int64_t stored_B_ = 0, stored_H_ = 0;
  int64_t B_ = 0, H_ = 0, Tq_ = 0, Tk_ = 0, block_ = 0, q_blocks_ = 0, kv_blocks_ = 0;
  bool reads_b_ = false, reads_h_ = false;
  std::vector<uint8_t> state_;  // [stored B][stored H][q_blocks][kv_blocks], BlockState
  // Per (b, h, q block) the full then the partial key blocks; per (b, h, key block) the query
  // blocks: offsets [rows + 1] into the items.
  std::vector<int64_t> full_kv_at_, partial_kv_at_, full_q_at_, partial_q_at_;
  std::vector<int32_t> full_kv_, partial_kv_, full_q_, partial_q_;
  int64_t visible_pairs_ = 0;
  double build_seconds_ = 0;
};

// PyTorch's create_block_mask: the blocks of `mask` over [B, H, Tq, Tk]. Tiled and parallel:
// a block whose answer follows from the ranges of its indices (the mask's interval arithmetic)
// is never evaluated pair by pair; the others are, with the kernels' SIMD evaluator. Throws
// qkv::Error when the mask is not a boolean, an index leaves a captured tensor or a value
// leaves 32 bits for some pair, or a size is below 1.
BlockMask create_block_mask(const MaskExpr& mask, int64_t B, int64_t H, int64_t Tq, int64_t Tk,
                            int64_t block = 128);

}  // namespace qkv
