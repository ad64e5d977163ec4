#pragma once
// safetensors reader (and a small writer for tests and tools). Layout:
//   u64 N (little-endian), N bytes of JSON header, data.
// The header maps tensor names to {"dtype", "shape", "data_offsets": [begin, end]}
// (offsets relative to the data section) plus an optional "__metadata__" object
// of strings. Every offset is checked against the file and against the other
// tensors; tensor data stays in the mmap.
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace serval {

struct SafetensorsTensor {
  std::string name;
  std::string dtype;            // as stored: "F32", "BF16", "I64", ...
  std::vector<int64_t> shape;   // outermost first
  const uint8_t* data = nullptr;
  int64_t nbytes = 0;
};

class SafetensorsFile {
 public:
  static std::shared_ptr<SafetensorsFile> open(const std::string& path);
  // Parses an in-memory image; `bytes` must outlive the result.
  static std::shared_ptr<SafetensorsFile> parse(const uint8_t* bytes, size_t size,
                                                std::string label = "<memory>");

  const std::string& path() const { return path_; }
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }
  const SafetensorsTensor* find(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  std::string path_;
  std::vector<SafetensorsTensor> tensors_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
  std::shared_ptr<const void> mapping_;
};

// Serval dtype of a safetensors dtype string; throws `tensor "NAME" has dtype I64,
// which Serval does not support (supported: F32, F16, BF16)`.
DType dtype_from_safetensors(const std::string& dtype, const std::string& tensor_name);
std::string safetensors_dtype_name(DType t);  // "F32", "F16", "BF16"

// Writes a safetensors file (tensors in the given order, no padding).
struct SafetensorsWriteTensor {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};
void write_safetensors(const std::string& path, const std::vector<SafetensorsWriteTensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace serval
