// GGUF reader. The file format (little-endian):
//   magic "GGUF", u32 version, u64 tensor_count, u64 kv_count,
//   kv_count x (string key, u32 value type, value),
//   tensor_count x (string name, u32 n_dims, n_dims x u64 ne, u32 ggml type, u64 offset),
//   padding to `general.alignment` (default 32), tensor data.
// Strings are u64 length + bytes; arrays are u32 element type + u64 count + elements.
// Every read is bounds-checked and every count is capped by the bytes left, so a
// hostile file costs at most its own size in memory and never reads out of range.
#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "model/gguf.h"
#include "model/mapped_file.h"

namespace serval {

namespace {

constexpr uint32_t kMaxDims = 4;         // GGML_MAX_DIMS
constexpr int kMaxArrayDepth = 8;        // nested arrays deeper than this are not metadata
constexpr uint64_t kMaxAlignment = 1ull << 20;

bool is_integer(GgufType t) {
  switch (t) {
    case GgufType::UINT8: case GgufType::INT8: case GgufType::UINT16: case GgufType::INT16:
    case GgufType::UINT32: case GgufType::INT32: case GgufType::UINT64: case GgufType::INT64:
    case GgufType::BOOL:
      return true;
    default:
      return false;
  }
}
bool is_float(GgufType t) { return t == GgufType::FLOAT32 || t == GgufType::FLOAT64; }

// Smallest number of bytes one value of type t can take in a file.
uint64_t min_value_size(GgufType t) {
  switch (t) {
    case GgufType::UINT8: case GgufType::INT8: case GgufType::BOOL: return 1;
    case GgufType::UINT16: case GgufType::INT16: return 2;
    case GgufType::UINT32: case GgufType::INT32: case GgufType::FLOAT32: return 4;
    case GgufType::UINT64: case GgufType::INT64: case GgufType::FLOAT64: case GgufType::STRING: return 8;
    case GgufType::ARRAY: return 12;
  }
  return 1;
}

}  // namespace

// Parses one GGUF image; a friend of GgufFile so it can fill it in.
class GgufParser {
 public:
  GgufParser(const uint8_t* bytes, size_t size, std::string label)
      : begin_(bytes), pos_(bytes), end_(bytes + size), label_(std::move(label)) {}

  std::shared_ptr<GgufFile> parse() {
    auto file = std::make_shared<GgufFile>();
    file->path_ = label_;
    file->file_size_ = uint64_t(end_ - begin_);
    parse_header(*file);
    return file;
  }

 private:
  template <typename... Args>
  [[noreturn]] void error(const Args&... args) const {
    fail("GGUF \"", label_, "\": ", args...);
  }
  uint64_t offset() const { return uint64_t(pos_ - begin_); }
  uint64_t remaining() const { return uint64_t(end_ - pos_); }

  void need(uint64_t n, const char* what) const {
    if (n > remaining())
      error("file is truncated: ", what, " at offset ", offset(), " needs ", n, " bytes, only ",
            remaining(), " left");
  }
  template <typename T>
  T read(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string read_string(const char* what) {
    const uint64_t len = read<uint64_t>(what);
    if (len > remaining())
      error("file is truncated or corrupt: ", what, " at offset ", offset() - 8, " claims ", len,
            " bytes, only ", remaining(), " left");
    std::string s(reinterpret_cast<const char*>(pos_), size_t(len));
    pos_ += len;
    return s;
  }
  // A count of items that each take at least `min_size` bytes cannot exceed what is left.
  void check_count(uint64_t count, uint64_t min_size, const std::string& what) const {
    if (min_size > 0 && count > remaining() / min_size)
      error("file is truncated or corrupt: ", what, " claims ", count, " entries, more than the ", remaining(),
            " bytes left in the file can hold");
  }

  GgufType read_type(const std::string& key) {
    const uint32_t t = read<uint32_t>("value type");
    if (t > uint32_t(GgufType::FLOAT64)) error("key \"", key, "\" has unknown value type ", t);
    return GgufType(t);
  }

  void read_scalar(GgufType type, GgufValue& v, const std::string& key) {
    switch (type) {
      case GgufType::UINT8: v.i = read<uint8_t>("u8 value"); break;
      case GgufType::INT8: v.i = read<int8_t>("i8 value"); break;
      case GgufType::UINT16: v.i = read<uint16_t>("u16 value"); break;
      case GgufType::INT16: v.i = read<int16_t>("i16 value"); break;
      case GgufType::UINT32: v.i = read<uint32_t>("u32 value"); break;
      case GgufType::INT32: v.i = read<int32_t>("i32 value"); break;
      case GgufType::UINT64: v.u = read<uint64_t>("u64 value"); v.i = int64_t(v.u); return;
      case GgufType::INT64: v.i = read<int64_t>("i64 value"); break;
      case GgufType::FLOAT32: v.f = read<float>("f32 value"); return;
      case GgufType::FLOAT64: v.f = read<double>("f64 value"); return;
      case GgufType::BOOL: {
        const uint8_t b = read<uint8_t>("bool value");
        if (b > 1) error("key \"", key, "\" has a bool of value ", int(b), " (must be 0 or 1)");
        v.i = b;
        break;
      }
      case GgufType::STRING: v.s = read_string("string value"); return;
      case GgufType::ARRAY: error("internal: array read as scalar");
    }
    v.u = uint64_t(v.i);
  }

  GgufValue read_value(GgufType type, const std::string& key, int depth) {
    GgufValue v;
    v.type = type;
    if (type != GgufType::ARRAY) {
      read_scalar(type, v, key);
      return v;
    }
    if (depth >= kMaxArrayDepth) error("key \"", key, "\" nests arrays deeper than ", kMaxArrayDepth);
    v.elem_type = read_type(key);
    const uint64_t n = read<uint64_t>("array length");
    check_count(n, min_value_size(v.elem_type), str_cat("array \"", key, "\""));
    switch (v.elem_type) {
      case GgufType::STRING:
        v.strs.reserve(n);
        for (uint64_t i = 0; i < n; ++i) v.strs.push_back(read_string("string array element"));
        break;
      case GgufType::ARRAY:
        v.arrays.reserve(n);
        for (uint64_t i = 0; i < n; ++i) v.arrays.push_back(read_value(GgufType::ARRAY, key, depth + 1));
        break;
      case GgufType::FLOAT32: case GgufType::FLOAT64:
        v.nums.reserve(n);
        for (uint64_t i = 0; i < n; ++i) {
          GgufValue e;
          read_scalar(v.elem_type, e, key);
          v.nums.push_back(e.f);
        }
        break;
      default:
        v.ints.reserve(n);
        for (uint64_t i = 0; i < n; ++i) {
          GgufValue e;
          read_scalar(v.elem_type, e, key);
          v.ints.push_back(e.i);
        }
        break;
    }
    return v;
  }

  void parse_header(GgufFile& f) {
    need(4, "magic");
    if (std::memcmp(pos_, "GGUF", 4) != 0) {
      if (std::memcmp(pos_, "FUGG", 4) == 0) error("big-endian GGUF files are not supported");
      error("not a GGUF file (bad magic; expected \"GGUF\")");
    }
    pos_ += 4;
    const uint32_t version = read<uint32_t>("version");
    if ((version & 0xffff) == 0 && version != 0)
      error("big-endian GGUF files are not supported (version field reads ", version,
            " in little-endian); convert the model to little-endian");
    if (version == 1)
      error("GGUF version 1 is not supported (only versions 2 and 3); re-convert the model with a "
            "current llama.cpp");
    if (version != 2 && version != 3)
      error("unsupported GGUF version ", version, " (supported: 2, 3)");
    f.version_ = version;

    const uint64_t n_tensors = read<uint64_t>("tensor count");
    const uint64_t n_kv = read<uint64_t>("metadata count");
    check_count(n_kv, 8 + 4 + 1, "metadata count");
    check_count(n_tensors, 8 + 4 + 8 + 4 + 8, "tensor count");

    for (uint64_t i = 0; i < n_kv; ++i) {
      std::string key = read_string("metadata key");
      const GgufType type = read_type(key);
      GgufValue v = read_value(type, key, 0);
      if (f.kv_.count(key)) error("duplicate metadata key \"", key, "\"");
      f.kv_.emplace(std::move(key), std::move(v));
    }
    read_alignment(f);

    f.tensors_.reserve(n_tensors);
    for (uint64_t i = 0; i < n_tensors; ++i) f.tensors_.push_back(read_tensor_info());

    const uint64_t header_end = offset();
    const uint64_t data_offset = (header_end + f.alignment_ - 1) / f.alignment_ * f.alignment_;
    const uint64_t size = uint64_t(end_ - begin_);
    if (n_tensors > 0 && data_offset > size)
      error("file is truncated: tensor data should start at offset ", data_offset, " but the file has ",
            size, " bytes");
    f.data_offset_ = data_offset;
    place_tensors(f, data_offset, size);
  }

  void read_alignment(GgufFile& f) {
    auto it = f.kv_.find("general.alignment");
    if (it == f.kv_.end()) return;
    const GgufValue& v = it->second;
    if (!is_integer(v.type) || v.type == GgufType::BOOL)
      error("general.alignment must be an integer, got ", gguf_type_name(v.type));
    const uint64_t a = v.u;
    if (a == 0 || (a & (a - 1)) != 0 || a > kMaxAlignment)
      error("general.alignment must be a power of two up to ", kMaxAlignment, ", got ", v.i);
    f.alignment_ = a;
  }

  GgufTensorInfo read_tensor_info() {
    GgufTensorInfo t;
    t.name = read_string("tensor name");
    const uint32_t n_dims = read<uint32_t>("tensor dimension count");
    if (n_dims == 0 || n_dims > kMaxDims)
      error("tensor \"", t.name, "\" has ", n_dims, " dimensions (must be 1 to ", kMaxDims, ")");
    int64_t numel = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t ne = read<uint64_t>("tensor dimension");
      if (ne == 0 || ne > uint64_t(INT64_MAX))
        error("tensor \"", t.name, "\" has an invalid dimension ", d, ": ", ne);
      t.ne.push_back(int64_t(ne));
      if (__builtin_mul_overflow(numel, int64_t(ne), &numel))
        error("tensor \"", t.name, "\" has too many elements (the dimensions' product overflows)");
    }
    t.ggml_type = read<uint32_t>("tensor type");
    const GgmlTypeTraits* traits = ggml_type_traits(t.ggml_type);
    if (!traits) error("tensor \"", t.name, "\" has unknown ggml type id ", t.ggml_type);
    if (t.ne[0] % traits->block_elems != 0)
      error("tensor \"", t.name, "\" of type ", traits->name, " has a row of ", t.ne[0],
            " elements, not a multiple of its block size ", traits->block_elems);
    const int64_t rows = numel / t.ne[0];
    int64_t row_bytes = 0;
    if (__builtin_mul_overflow(t.ne[0] / traits->block_elems, traits->block_bytes, &row_bytes) ||
        __builtin_mul_overflow(rows, row_bytes, &t.nbytes))
      error("tensor \"", t.name, "\" is too large (its byte size overflows)");
    t.offset = read<uint64_t>("tensor offset");
    return t;
  }

  void place_tensors(GgufFile& f, uint64_t data_offset, uint64_t size) {
    std::vector<size_t> order(f.tensors_.size());
    for (size_t i = 0; i < order.size(); ++i) {
      GgufTensorInfo& t = f.tensors_[i];
      order[i] = i;
      if (!f.tensor_index_.emplace(t.name, i).second) error("duplicate tensor \"", t.name, "\"");
      if (t.offset % f.alignment_ != 0)
        error("tensor \"", t.name, "\" has offset ", t.offset, ", not a multiple of the alignment ",
              f.alignment_);
      const uint64_t avail = size - data_offset;  // data_offset <= size when there are tensors
      if (t.offset > avail || uint64_t(t.nbytes) > avail - t.offset)
        error("file is truncated: tensor \"", t.name, "\" needs bytes ", data_offset + t.offset, "..",
              data_offset + t.offset + uint64_t(t.nbytes), " but the file has ", size, " bytes");
      t.data = begin_ + data_offset + t.offset;
    }
    std::sort(order.begin(), order.end(),
              [&](size_t a, size_t b) { return f.tensors_[a].offset < f.tensors_[b].offset; });
    for (size_t k = 1; k < order.size(); ++k) {
      const GgufTensorInfo& prev = f.tensors_[order[k - 1]];
      const GgufTensorInfo& cur = f.tensors_[order[k]];
      if (prev.offset + uint64_t(prev.nbytes) > cur.offset)
        error("tensors \"", prev.name, "\" and \"", cur.name, "\" overlap in the data section");
    }
  }

  const uint8_t* begin_;
  const uint8_t* pos_;
  const uint8_t* end_;
  std::string label_;
};

size_t GgufValue::array_size() const {
  if (type != GgufType::ARRAY) return 0;
  switch (elem_type) {
    case GgufType::STRING: return strs.size();
    case GgufType::ARRAY: return arrays.size();
    case GgufType::FLOAT32: case GgufType::FLOAT64: return nums.size();
    default: return ints.size();
  }
}

std::vector<int64_t> GgufTensorInfo::shape() const { return {ne.rbegin(), ne.rend()}; }

std::shared_ptr<GgufFile> GgufFile::parse(const uint8_t* bytes, size_t size, std::string label) {
  return GgufParser(bytes, size, std::move(label)).parse();
}

std::shared_ptr<GgufFile> GgufFile::open(const std::string& path) {
  auto mapping = MappedFile::open_read(path);
  auto file = parse(mapping->data(), mapping->size(), path);
  file->mapping_ = mapping;
  return file;
}

const GgufTensorInfo* GgufFile::find_tensor(const std::string& name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const GgufValue* GgufFile::find(const std::string& key) const {
  auto it = kv_.find(key);
  return it == kv_.end() ? nullptr : &it->second;
}

namespace {
const GgufValue& require(const GgufFile& f, const std::string& key) {
  const GgufValue* v = f.find(key);
  if (!v) fail("GGUF \"", f.path(), "\": missing metadata key \"", key, "\"");
  return *v;
}
[[noreturn]] void wrong_type(const GgufFile& f, const std::string& key, const GgufValue& v, const char* want) {
  std::string got(gguf_type_name(v.type));
  if (v.type == GgufType::ARRAY) got = str_cat("ARRAY of ", gguf_type_name(v.elem_type));
  fail("GGUF \"", f.path(), "\": key \"", key, "\" should be ", want, ", got ", got);
}
}  // namespace

std::string GgufFile::get_string(const std::string& key) const {
  const GgufValue& v = require(*this, key);
  if (v.type != GgufType::STRING) wrong_type(*this, key, v, "a string");
  return v.s;
}
std::string GgufFile::get_string(const std::string& key, const std::string& dflt) const {
  return has(key) ? get_string(key) : dflt;
}
int64_t GgufFile::get_int(const std::string& key) const {
  const GgufValue& v = require(*this, key);
  if (!is_integer(v.type) || v.type == GgufType::BOOL) wrong_type(*this, key, v, "an integer");
  if (v.type == GgufType::UINT64 && v.u > uint64_t(INT64_MAX))
    fail("GGUF \"", path_, "\": key \"", key, "\" is out of range: ", v.u);
  return v.i;
}
int64_t GgufFile::get_int(const std::string& key, int64_t dflt) const {
  return has(key) ? get_int(key) : dflt;
}
double GgufFile::get_float(const std::string& key) const {
  const GgufValue& v = require(*this, key);
  if (is_float(v.type)) return v.f;
  if (is_integer(v.type) && v.type != GgufType::BOOL)
    return v.type == GgufType::UINT64 ? double(v.u) : double(v.i);
  wrong_type(*this, key, v, "a number");
}
double GgufFile::get_float(const std::string& key, double dflt) const {
  return has(key) ? get_float(key) : dflt;
}
bool GgufFile::get_bool(const std::string& key, bool dflt) const {
  const GgufValue* v = find(key);
  if (!v) return dflt;
  if (v->type != GgufType::BOOL) wrong_type(*this, key, *v, "a bool");
  return v->i != 0;
}
const std::vector<std::string>& GgufFile::get_string_array(const std::string& key) const {
  const GgufValue& v = require(*this, key);
  if (v.type != GgufType::ARRAY || v.elem_type != GgufType::STRING)
    wrong_type(*this, key, v, "an array of strings");
  return v.strs;
}
std::vector<int64_t> GgufFile::get_int_array(const std::string& key) const {
  const GgufValue& v = require(*this, key);
  if (v.type != GgufType::ARRAY || !is_integer(v.elem_type)) wrong_type(*this, key, v, "an array of integers");
  return v.ints;
}
std::vector<double> GgufFile::get_float_array(const std::string& key) const {
  const GgufValue& v = require(*this, key);
  if (v.type != GgufType::ARRAY) wrong_type(*this, key, v, "an array of numbers");
  if (is_float(v.elem_type)) return v.nums;
  if (is_integer(v.elem_type)) return {v.ints.begin(), v.ints.end()};
  wrong_type(*this, key, v, "an array of numbers");
}

}  // namespace serval
