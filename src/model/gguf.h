#pragma once
// GGUF v2/v3 reader. The file is mmap'd; metadata is parsed into GgufValue and
// tensor data stays in the mapping (GgufTensorInfo::data points into it).
// Every malformed input (truncation, wrong magic, absurd counts, overlapping or
// out-of-range tensors, unsupported tensor types when requested) throws
// serval::Error with a message naming the problem and the file.
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"

namespace serval {

enum class GgufType : uint32_t {
  UINT8 = 0, INT8 = 1, UINT16 = 2, INT16 = 3, UINT32 = 4, INT32 = 5, FLOAT32 = 6,
  BOOL = 7, STRING = 8, ARRAY = 9, UINT64 = 10, INT64 = 11, FLOAT64 = 12,
};
std::string_view gguf_type_name(GgufType t);

// One metadata value. Scalars live in one of the fields below according to type;
// an ARRAY keeps its element type and the elements as a vector of values (strings
// in `strs`, numbers in `nums`/`ints` for speed with large vocabularies).
struct GgufValue {
  GgufType type = GgufType::UINT32;
  GgufType elem_type = GgufType::UINT32;  // for ARRAY
  int64_t i = 0;        // every integer type and BOOL (UINT64 above INT64_MAX wraps)
  uint64_t u = 0;       // UINT64 exactly
  double f = 0;         // FLOAT32 / FLOAT64
  std::string s;        // STRING
  std::vector<std::string> strs;  // ARRAY of STRING
  std::vector<int64_t> ints;      // ARRAY of integer or BOOL
  std::vector<double> nums;       // ARRAY of FLOAT32 / FLOAT64
  std::vector<GgufValue> arrays;  // ARRAY of ARRAY (rare)
  size_t array_size() const;
};

// ggml tensor type ids as stored in GGUF (llama.cpp's ggml.h).
enum class GgmlType : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
  Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15,
  IQ2_XXS = 16, IQ2_XS = 17, IQ3_XXS = 18, IQ1_S = 19, IQ4_NL = 20, IQ3_S = 21, IQ2_S = 22,
  IQ4_XS = 23, I8 = 24, I16 = 25, I32 = 26, I64 = 27, F64 = 28, IQ1_M = 29, BF16 = 30,
  TQ1_0 = 34, TQ2_0 = 35, MXFP4 = 39,
};
// Name and block layout of a ggml type; nullptr for ids ggml does not define.
struct GgmlTypeTraits {
  const char* name;
  int64_t block_elems;
  int64_t block_bytes;
};
const GgmlTypeTraits* ggml_type_traits(uint32_t type);
// The name llama.cpp gives a ggml type id ("Q4_K", "IQ2_XS", ...), or "type N".
std::string ggml_type_name(uint32_t type);
// Serval dtype of a ggml type, or throws `tensor "NAME" has type IQ4_XS, which Serval
// does not support (supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, ...)`.
DType dtype_from_ggml(uint32_t type, const std::string& tensor_name);
// The same without the error: nullopt for a type Serval does not read.
std::optional<DType> supported_dtype_of_ggml(uint32_t type);
uint32_t ggml_from_dtype(DType t);

struct GgufTensorInfo {
  std::string name;
  std::vector<int64_t> ne;  // GGUF order: ne[0] is the innermost (contiguous) dimension
  uint32_t ggml_type = 0;
  uint64_t offset = 0;      // relative to the start of tensor data
  const uint8_t* data = nullptr;
  int64_t nbytes = 0;
  // Outermost-first shape (PyTorch order), i.e. ne reversed.
  std::vector<int64_t> shape() const;
};

class GgufFile {
 public:
  // Opens and parses `path`; tensor data is mmap'd, not read.
  static std::shared_ptr<GgufFile> open(const std::string& path);
  // Parses an in-memory image (used by the fuzzer and tests); `bytes` must outlive the result.
  static std::shared_ptr<GgufFile> parse(const uint8_t* bytes, size_t size, std::string label = "<memory>");

  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }  // start of tensor data in the file
  uint64_t file_size() const { return file_size_; }
  const std::string& path() const { return path_; }
  const std::map<std::string, GgufValue>& metadata() const { return kv_; }
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* find_tensor(const std::string& name) const;

  const GgufValue* find(const std::string& key) const;
  bool has(const std::string& key) const { return find(key) != nullptr; }
  // Typed getters: throw naming the key when missing or of the wrong type;
  // the overloads with a default return it when the key is missing.
  std::string get_string(const std::string& key) const;
  std::string get_string(const std::string& key, const std::string& dflt) const;
  int64_t get_int(const std::string& key) const;
  int64_t get_int(const std::string& key, int64_t dflt) const;
  double get_float(const std::string& key) const;  // accepts integer values too
  double get_float(const std::string& key, double dflt) const;
  bool get_bool(const std::string& key, bool dflt) const;
  const std::vector<std::string>& get_string_array(const std::string& key) const;
  std::vector<int64_t> get_int_array(const std::string& key) const;
  std::vector<double> get_float_array(const std::string& key) const;

 private:
  std::string path_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  uint64_t file_size_ = 0;
  std::map<std::string, GgufValue> kv_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t> tensor_index_;
  std::shared_ptr<const void> mapping_;  // keeps the mmap alive
  friend class GgufParser;
};

// GGUF writer (v3 by default): metadata in insertion order, then tensor infos,
// then aligned tensor data. The output is mmap'd and tensors are filled in
// parallel, straight into the mapping, so multi-GB models are written quickly.
class GgufWriter {
 public:
  // Fills `nbytes` bytes at `dst` (the tensor's place in the output mapping).
  using Generator = std::function<void(void* dst, int64_t nbytes)>;

  void set_u8(const std::string& key, uint8_t v);
  void set_i8(const std::string& key, int8_t v);
  void set_u16(const std::string& key, uint16_t v);
  void set_i16(const std::string& key, int16_t v);
  void set_u32(const std::string& key, uint32_t v);
  void set_i32(const std::string& key, int32_t v);
  void set_u64(const std::string& key, uint64_t v);
  void set_i64(const std::string& key, int64_t v);
  void set_f32(const std::string& key, float v);
  void set_f64(const std::string& key, double v);
  void set_bool(const std::string& key, bool v);
  void set_string(const std::string& key, const std::string& v);
  void set_string_array(const std::string& key, const std::vector<std::string>& v);
  void set_f32_array(const std::string& key, const std::vector<float>& v);
  void set_i32_array(const std::string& key, const std::vector<int32_t>& v);
  // Copies any value (for re-writing, and for arrays of other element types);
  // a key set twice keeps its first position and takes the new value.
  void set_value(const std::string& key, const GgufValue& v);
  // Power of two; also written as general.alignment when not 32.
  void set_alignment(uint64_t alignment);
  // 2 or 3 (the formats are the same for little-endian files; 2 is for tests).
  void set_version(uint32_t version) { version_ = version; }

  // Adds a tensor with an outermost-first shape; `data` must stay valid until write().
  void add_tensor(const std::string& name, DType dtype, const std::vector<int64_t>& shape,
                  const void* data, int64_t nbytes);
  // Same, with a raw ggml type id (any type ggml defines, e.g. for test files).
  void add_tensor_raw(const std::string& name, uint32_t ggml_type, const std::vector<int64_t>& shape,
                      const void* data, int64_t nbytes);
  // Adds a tensor whose bytes `fill` writes directly into the output mapping.
  // Generators run in parallel (one tensor per thread), so each must be thread-safe.
  void add_tensor_generated(const std::string& name, DType dtype, const std::vector<int64_t>& shape,
                            Generator fill);
  size_t tensor_count() const { return tensors_.size(); }

  // Writes the file; throws on I/O errors naming the path.
  void write(const std::string& path) const;

 private:
  struct Entry { std::string key; GgufValue value; };
  struct Tensor {
    std::string name;
    uint32_t ggml_type;
    std::vector<int64_t> shape;
    const void* data;
    int64_t nbytes;
    Generator fill;
  };
  void add_tensor_impl(Tensor t);
  std::vector<uint8_t> header_bytes(std::vector<uint64_t>& offsets, uint64_t& data_size) const;
  std::vector<Entry> kv_;
  std::map<std::string, size_t> kv_index_;
  std::vector<Tensor> tensors_;
  std::map<std::string, size_t> tensor_index_;
  uint64_t alignment_ = 32;
  uint32_t version_ = 3;
};

}  // namespace serval
