// GGUF writer (see include/qkv/gguf.h): the layout gguf.cpp reads, version 3, alignment 32.
#include <cstdio>
#include <cstring>
#include <fstream>

#include "qkv/error.h"
#include "qkv/gguf.h"

namespace qkv::gguf {

namespace {

constexpr uint64_t kAlignment = 32;

struct Out {
  std::vector<uint8_t> bytes;
  template <typename T>
  void put(T v) {
    const size_t at = bytes.size();
    bytes.resize(at + sizeof(T));
    std::memcpy(bytes.data() + at, &v, sizeof(T));
  }
  void put_string(const std::string& s) {
    put<uint64_t>(s.size());
    bytes.insert(bytes.end(), s.begin(), s.end());
  }
  void put_value(const Value& v) {
    switch (v.type) {
      case ValueType::u32:
        put<uint32_t>(static_cast<uint32_t>(std::get<uint64_t>(v.data)));
        break;
      case ValueType::i32:
        put<int32_t>(static_cast<int32_t>(std::get<int64_t>(v.data)));
        break;
      case ValueType::f32:
        put<float>(static_cast<float>(std::get<double>(v.data)));
        break;
      case ValueType::boolean:
        put<uint8_t>(std::get<bool>(v.data) ? 1 : 0);
        break;
      case ValueType::string:
        put_string(std::get<std::string>(v.data));
        break;
      case ValueType::array: {
        const auto& items = std::get<std::vector<Value>>(v.data);
        put<uint32_t>(static_cast<uint32_t>(v.element_type));
        put<uint64_t>(items.size());
        for (const Value& item : items) put_value(item);
        break;
      }
      default:
        fail("gguf writer: value type ", to_string(v.type), " is not written");
    }
  }
  void pad() { bytes.resize((bytes.size() + kAlignment - 1) / kAlignment * kAlignment, 0); }
};

Value array_of(ValueType element, std::vector<Value> items) {
  Value v;
  v.type = ValueType::array;
  v.element_type = element;
  v.data = std::move(items);
  return v;
}

}  // namespace

Value u32_value(uint32_t x) { return Value{ValueType::u32, uint64_t{x}}; }
Value f32_value(float x) { return Value{ValueType::f32, double{x}}; }
Value bool_value(bool x) { return Value{ValueType::boolean, x}; }
Value string_value(std::string x) { return Value{ValueType::string, std::move(x)}; }

Value string_array(const std::vector<std::string>& v) {
  std::vector<Value> items;
  items.reserve(v.size());
  for (const std::string& s : v) items.push_back(string_value(s));
  return array_of(ValueType::string, std::move(items));
}

Value f32_array(const std::vector<float>& v) {
  std::vector<Value> items;
  items.reserve(v.size());
  for (float x : v) items.push_back(f32_value(x));
  return array_of(ValueType::f32, std::move(items));
}

Value i32_array(const std::vector<int32_t>& v) {
  std::vector<Value> items;
  items.reserve(v.size());
  for (int32_t x : v) items.push_back(Value{ValueType::i32, int64_t{x}});
  return array_of(ValueType::i32, std::move(items));
}

void Writer::add(const std::string& key, Value value) {
  for (const auto& [k, v] : metadata_)
    check(k != key, "gguf writer: metadata \"", key, "\" added twice");
  metadata_.emplace_back(key, std::move(value));
}

void Writer::add_tensor(const std::string& name, TensorType type, std::vector<int64_t> dims,
                        std::vector<uint8_t> bytes) {
  const std::optional<BlockSize> b = block_size(static_cast<uint32_t>(type));
  check(b.has_value(), "gguf writer: tensor \"", name, "\" has an unknown type");
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  check(!dims.empty() && dims.size() <= 4 && dims[0] % b->elements == 0 &&
            static_cast<uint64_t>(n / b->elements * b->bytes) == bytes.size(),
        "gguf writer: tensor \"", name, "\": ", bytes.size(), " bytes do not hold its dims as ",
        to_string(type));
  for (const Tensor& t : tensors_)
    check(t.name != name, "gguf writer: tensor \"", name, "\" added twice");
  tensors_.push_back({name, type, std::move(dims), std::move(bytes)});
}

void Writer::write(const std::string& path) const {
  Out o;
  o.put<uint32_t>(0x46554747);  // "GGUF"
  o.put<uint32_t>(3);
  o.put<uint64_t>(tensors_.size());
  o.put<uint64_t>(metadata_.size());
  for (const auto& [key, value] : metadata_) {
    o.put_string(key);
    o.put<uint32_t>(static_cast<uint32_t>(value.type));
    o.put_value(value);
  }
  uint64_t offset = 0;
  for (const Tensor& t : tensors_) {
    o.put_string(t.name);
    o.put<uint32_t>(static_cast<uint32_t>(t.dims.size()));
    for (int64_t d : t.dims) o.put<uint64_t>(static_cast<uint64_t>(d));
    o.put<uint32_t>(static_cast<uint32_t>(t.type));
    o.put<uint64_t>(offset);
    offset += (t.bytes.size() + kAlignment - 1) / kAlignment * kAlignment;
  }
  o.pad();
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary);
    check(f.good(), "gguf writer: cannot write \"", tmp, "\"");
    f.write(reinterpret_cast<const char*>(o.bytes.data()),
            static_cast<std::streamsize>(o.bytes.size()));
    const std::vector<uint8_t> zeros(kAlignment, 0);
    for (const Tensor& t : tensors_) {
      f.write(reinterpret_cast<const char*>(t.bytes.data()),
              static_cast<std::streamsize>(t.bytes.size()));
      f.write(
          reinterpret_cast<const char*>(zeros.data()),
          static_cast<std::streamsize>((kAlignment - t.bytes.size() % kAlignment) % kAlignment));
    }
    f.flush();
    check(f.good(), "gguf writer: writing \"", tmp, "\" failed (disk full?)");
  }
  check(std::rename(tmp.c_str(), path.c_str()) == 0, "gguf writer: cannot rename \"", tmp,
        "\" to \"", path, "\"");
}

}  // namespace qkv::gguf
