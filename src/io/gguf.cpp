// GGUF reader (see include/qkv/gguf.h). One Reader walks the bytes; each read checks the
// bytes that remain first, and each count is bounded by them before anything is allocated.
#include "qkv/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <iterator>

#include "qkv/error.h"

namespace qkv::gguf {

namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian u32
constexpr int kMaxDims = 4;              // ggml's GGML_MAX_DIMS
constexpr int kMaxNesting = 3;           // arrays of arrays of arrays at most

struct Reader {
  const uint8_t* data;
  size_t size, pos = 0;
  const std::string& name;

  size_t left() const { return size - pos; }
  void need(uint64_t bytes, const char* what) const {
    check(bytes <= left(), name, ": ", what, " needs ", bytes, " bytes at offset ", pos, " but ",
          left(), " remain (a truncated or corrupt file)");
  }
  template <typename T>
  T read(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, data + pos, sizeof(T));
    pos += sizeof(T);
    return v;
  }
  std::string string(const char* what) {
    const auto n = read<uint64_t>(what);
    need(n, what);
    std::string s(reinterpret_cast<const char*>(data + pos), n);
    pos += n;
    return s;
  }
};

// The fewest bytes one value of this type takes: bounds an array's count by what remains.
uint64_t min_bytes(ValueType t) {
  switch (t) {
    case ValueType::u8:
    case ValueType::i8:
    case ValueType::boolean:
      return 1;
    case ValueType::u16:
    case ValueType::i16:
      return 2;
    case ValueType::u32:
    case ValueType::i32:
    case ValueType::f32:
      return 4;
    case ValueType::u64:
    case ValueType::i64:
    case ValueType::f64:
    case ValueType::string:
      return 8;
    case ValueType::array:
      return 12;
  }
  return 1;
}

bool known(uint32_t t) { return t <= static_cast<uint32_t>(ValueType::f64); }

Value read_value(Reader& r, ValueType type, const std::string& key, int depth) {
  Value v;
  v.type = type;
  switch (type) {
    case ValueType::u8:
      v.data = uint64_t{r.read<uint8_t>(key.c_str())};
      break;
    case ValueType::i8:
      v.data = int64_t{r.read<int8_t>(key.c_str())};
      break;
    case ValueType::u16:
      v.data = uint64_t{r.read<uint16_t>(key.c_str())};
      break;
    case ValueType::i16:
      v.data = int64_t{r.read<int16_t>(key.c_str())};
      break;
    case ValueType::u32:
      v.data = uint64_t{r.read<uint32_t>(key.c_str())};
      break;
    case ValueType::i32:
      v.data = int64_t{r.read<int32_t>(key.c_str())};
      break;
    case ValueType::u64:
      v.data = r.read<uint64_t>(key.c_str());
      break;
    case ValueType::i64:
      v.data = r.read<int64_t>(key.c_str());
      break;
    case ValueType::f32:
      v.data = double{r.read<float>(key.c_str())};
      break;
    case ValueType::f64:
      v.data = r.read<double>(key.c_str());
      break;
    case ValueType::boolean: {
      const auto b = r.read<uint8_t>(key.c_str());
      check(b <= 1, r.name, ": metadata \"", key, "\" is a bool holding ", int(b));
      v.data = b == 1;
      break;
    }
    case ValueType::string:
      v.data = r.string(key.c_str());
      break;
    case ValueType::array: {
      check(depth < kMaxNesting, r.name, ": metadata \"", key, "\" nests arrays deeper than ",
            kMaxNesting);
      const auto et = r.read<uint32_t>(key.c_str());
      check(known(et), r.name, ": metadata \"", key, "\" is an array of unknown type ", et);
      v.element_type = static_cast<ValueType>(et);
      const auto n = r.read<uint64_t>(key.c_str());
      check(n <= r.left() / min_bytes(v.element_type), r.name, ": metadata \"", key, "\" claims ",
            n, " elements, more than the ", r.left(), " bytes left can hold");
      std::vector<Value> items;
      items.reserve(n);
      for (uint64_t i = 0; i < n; ++i)
        items.push_back(read_value(r, v.element_type, key, depth + 1));
      v.data = std::move(items);
      break;
    }
  }
  return v;
}

}  // namespace

std::string to_string(ValueType t) {
  static const char* names[] = {"u8",   "i8",     "u16",   "i16", "u32", "i32", "f32",
                                "bool", "string", "array", "u64", "i64", "f64"};
  const auto i = static_cast<uint32_t>(t);
  return i < std::size(names) ? names[i] : "type " + std::to_string(i);
}

int64_t Value::as_int(const std::string& key) const {
  if (const auto* i = std::get_if<int64_t>(&data)) return *i;
  if (const auto* u = std::get_if<uint64_t>(&data)) {
    check(*u <= uint64_t(INT64_MAX), "gguf: metadata \"", key, "\" = ", *u, " is too large");
    return static_cast<int64_t>(*u);
  }
  fail("gguf: metadata \"", key, "\" should be an integer but is ", to_string(type));
}

double Value::as_float(const std::string& key) const {
  if (const auto* d = std::get_if<double>(&data)) return *d;
  if (std::holds_alternative<int64_t>(data) || std::holds_alternative<uint64_t>(data))
    return static_cast<double>(as_int(key));
  fail("gguf: metadata \"", key, "\" should be a number but is ", to_string(type));
}

bool Value::as_bool(const std::string& key) const {
  if (const auto* b = std::get_if<bool>(&data)) return *b;
  fail("gguf: metadata \"", key, "\" should be a bool but is ", to_string(type));
}

const std::string& Value::as_string(const std::string& key) const {
  if (const auto* s = std::get_if<std::string>(&data)) return *s;
  fail("gguf: metadata \"", key, "\" should be a string but is ", to_string(type));
}

const std::vector<Value>& Value::as_array(const std::string& key) const {
  if (const auto* a = std::get_if<std::vector<Value>>(&data)) return *a;
  fail("gguf: metadata \"", key, "\" should be an array but is ", to_string(type));
}

int64_t TensorInfo::elements() const {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

struct File::Mapping {
  void* base = nullptr;
  size_t size = 0;
  ~Mapping() {
    if (base) munmap(base, size);
  }
};

File File::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  check(fd >= 0, "cannot open GGUF file \"", path, "\" (", std::strerror(errno), ")");
  struct stat st {};
  const bool sized = fstat(fd, &st) == 0;
  auto mapping = std::make_shared<Mapping>();
  if (sized && st.st_size > 0) {
    void* p = mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
    if (p != MAP_FAILED) mapping->base = p, mapping->size = static_cast<size_t>(st.st_size);
  }
  ::close(fd);
  check(sized, "cannot read the size of \"", path, "\"");
  check(mapping->base || st.st_size == 0, "cannot map \"", path, "\" (", std::strerror(errno), ")");
  File f;
  f.mapping_ = mapping;
  f.name_ = path;
  f.parse(static_cast<const uint8_t*>(mapping->base), mapping->size);
  return f;
}

File File::from_bytes(const uint8_t* data, size_t size, const std::string& name) {
  File f;
  f.name_ = name;
  f.parse(data, size);
  return f;
}

void File::parse(const uint8_t* data, size_t size) {
  Reader r{data, size, 0, name_};
  const auto magic = r.read<uint32_t>("the magic number");
  check(magic == kMagic, name_, ": not a GGUF file (its first 4 bytes are not \"GGUF\")");
  version_ = r.read<uint32_t>("the version");
  check(version_ == 2 || version_ == 3, name_, ": GGUF version ", version_,
        " (qkv reads versions 2 and 3)");
  const auto n_tensors = r.read<uint64_t>("the tensor count");
  const auto n_kv = r.read<uint64_t>("the metadata count");
  // Each entry takes at least 12 bytes (key length + type), each tensor info at least 24.
  check(n_kv <= r.left() / 12, name_, ": ", n_kv, " metadata entries cannot fit in ", r.left(),
        " bytes");
  check(n_tensors <= r.left() / 24, name_, ": ", n_tensors, " tensors cannot fit in ", r.left(),
        " bytes");
  for (uint64_t i = 0; i < n_kv; ++i) {
    std::string key = r.string("a metadata key");
    const auto t = r.read<uint32_t>("a metadata type");
    check(known(t), name_, ": metadata \"", key, "\" has unknown type ", t);
    Value v = read_value(r, static_cast<ValueType>(t), key, 0);
    check(!metadata_.count(key), name_, ": metadata \"", key, "\" appears twice");
    metadata_.emplace(std::move(key), std::move(v));
  }
  if (const Value* a = find("general.alignment")) {
    check(a->type == ValueType::u32, name_, ": general.alignment must be a u32, not ",
          to_string(a->type));
    const auto n = static_cast<uint64_t>(a->as_int("general.alignment"));
    check(n > 0 && (n & (n - 1)) == 0, name_, ": general.alignment ", n, " is not a power of two");
    alignment_ = n;
  }
  tensors_.reserve(n_tensors);
  for (uint64_t i = 0; i < n_tensors; ++i) {
    TensorInfo t;
    t.name = r.string("a tensor name");
    const auto n_dims = r.read<uint32_t>("a tensor's dim count");
    check(n_dims >= 1 && n_dims <= kMaxDims, name_, ": tensor \"", t.name, "\" has ", n_dims,
          " dims (1 to ", kMaxDims, ")");
    uint64_t elements = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const auto n = r.read<uint64_t>("a tensor's size");
      check(n >= 1 && n <= (uint64_t{1} << 50) / elements, name_, ": tensor \"", t.name,
            "\" has size ", n, " in dim ", d, " (too large or empty)");
      elements *= n;
      t.dims.push_back(static_cast<int64_t>(n));
    }
    const auto type = r.read<uint32_t>("a tensor's type");
    const auto block = block_size(type);
    check(block.has_value(), name_, ": tensor \"", t.name, "\" has ggml type ", type,
          ", which qkv does not know");
    t.type = static_cast<TensorType>(type);
    check(t.dims[0] % block->elements == 0, name_, ": tensor \"", t.name, "\" (", to_string(t.type),
          ") has rows of ", t.dims[0], " elements, not a multiple of its block of ",
          block->elements);
    t.bytes = elements / block->elements * block->bytes;
    t.offset = r.read<uint64_t>("a tensor's offset");
    check(t.offset % alignment_ == 0, name_, ": tensor \"", t.name, "\" starts at offset ",
          t.offset, ", not a multiple of the alignment ", alignment_);
    check(!by_name_.count(t.name), name_, ": tensor \"", t.name, "\" appears twice");
    by_name_.emplace(t.name, tensors_.size());
    tensors_.push_back(std::move(t));
  }
  const uint64_t data_start = (r.pos + alignment_ - 1) / alignment_ * alignment_;
  const uint64_t data_size = data_start <= size ? size - data_start : 0;
  for (TensorInfo& t : tensors_) {
    check(t.offset <= data_size && t.bytes <= data_size - t.offset, name_, ": tensor \"", t.name,
          "\" needs bytes [", t.offset, ", ", t.offset + t.bytes, ") of a data section of ",
          data_size, " (a truncated or corrupt file)");
    t.data = data + data_start + t.offset;
  }
}

const Value* File::find(const std::string& key) const {
  const auto it = metadata_.find(key);
  return it == metadata_.end() ? nullptr : &it->second;
}

const Value& File::at(const std::string& key) const {
  const Value* v = find(key);
  check(v != nullptr, name_, ": metadata \"", key, "\" is missing");
  return *v;
}

const TensorInfo* File::find_tensor(const std::string& name) const {
  const auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

}  // namespace qkv::gguf
