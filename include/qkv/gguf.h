// GGUF files (llama.cpp's format, versions 2 and 3): the header, the metadata key/values, the
// tensor infos and the aligned data section, read in place from a memory-mapped file.
//
// Layout (little-endian): "GGUF", u32 version, u64 tensor count, u64 metadata count; each
// metadata entry is a string key (u64 length + bytes), a u32 value type and the value (arrays:
// u32 element type, u64 count, the elements); each tensor info is a name, u32 dims, u64 sizes
// (innermost first), u32 ggml type and u64 offset into the data section, which starts at the
// next multiple of `general.alignment` (default 32) after the infos.
//
// Every count, length, offset and size is checked against the bytes that remain before it is
// used or anything is allocated for it: a corrupt file is a qkv::Error naming what is wrong.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "qkv/number_format.h"

namespace qkv::gguf {

enum class ValueType : uint32_t {
  u8 = 0,
  i8 = 1,
  u16 = 2,
  i16 = 3,
  u32 = 4,
  i32 = 5,
  f32 = 6,
  boolean = 7,
  string = 8,
  array = 9,
  u64 = 10,
  i64 = 11,
  f64 = 12,
};
std::string to_string(ValueType t);

// A metadata value. Integers of every width are held as int64 or uint64, floats as double;
// `type` keeps what the file said.
struct Value {
  ValueType type = ValueType::u8;
  std::variant<int64_t, uint64_t, double, bool, std::string, std::vector<Value>> data;
  ValueType element_type = ValueType::u8;  // for arrays

  // The value as this C++ type, or a qkv::Error naming `key` and what the file holds.
  int64_t as_int(const std::string& key) const;
  double as_float(const std::string& key) const;
  bool as_bool(const std::string& key) const;
  const std::string& as_string(const std::string& key) const;
  const std::vector<Value>& as_array(const std::string& key) const;
};

// The tensor types and their block sizes are qkv's number formats (qkv/number_format.h).
using ::qkv::block_size;
using ::qkv::BlockSize;
using ::qkv::TensorType;
using ::qkv::to_string;

struct TensorInfo {
  std::string name;
  std::vector<int64_t> dims;  // as the file lists them: dims[0] is the innermost (contiguous)
  TensorType type = TensorType::f32;
  uint64_t offset = 0;  // into the data section
  uint64_t bytes = 0;
  const uint8_t* data = nullptr;  // in the mapped file
  int64_t elements() const;
};

class File {
 public:
  // Maps `path` read-only and parses it. The tensors' data stay in the mapping.
  static File open(const std::string& path);
  // Parses bytes the caller keeps alive (the fuzz target); `name` appears in errors.
  static File from_bytes(const uint8_t* data, size_t size, const std::string& name = "gguf bytes");

  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  const std::map<std::string, Value>& metadata() const { return metadata_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const Value* find(const std::string& key) const;  // null when absent
  const Value& at(const std::string& key) const;    // a qkv::Error when absent
  const TensorInfo* find_tensor(const std::string& name) const;
  const std::string& name() const { return name_; }
  // Keeps the mapped file alive for whoever holds it (null for from_bytes: the caller's bytes).
  std::shared_ptr<const void> mapping() const { return mapping_; }

 private:
  struct Mapping;
  std::shared_ptr<Mapping> mapping_;  // keeps the file mapped while tensors point into it
  std::string name_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  std::map<std::string, Value> metadata_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t> by_name_;
  void parse(const uint8_t* data, size_t size);
};

// Value constructors for writers.
Value u32_value(uint32_t v);
Value f32_value(float v);
Value bool_value(bool v);
Value string_value(std::string v);
Value string_array(const std::vector<std::string>& v);
Value f32_array(const std::vector<float>& v);
Value i32_array(const std::vector<int32_t>& v);

// Writes a GGUF v3 file: the metadata in the order added, then the tensors, each aligned to
// 32 bytes. write() goes to path + ".tmp", then renames it: a crash leaves no half file.
class Writer {
 public:
  void add(const std::string& key, Value value);
  // dims innermost first, as the file lists them; `bytes` is the tensor in its block format.
  void add_tensor(const std::string& name, TensorType type, std::vector<int64_t> dims,
                  std::vector<uint8_t> bytes);
  void write(const std::string& path) const;

 private:
  std::vector<std::pair<std::string, Value>> metadata_;
  struct Tensor {
    std::string name;
    TensorType type;
    std::vector<int64_t> dims;
    std::vector<uint8_t> bytes;
  };
  std::vector<Tensor> tensors_;
};

}  // namespace qkv::gguf
