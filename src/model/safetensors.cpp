#include "model/safetensors.h"

#include <algorithm>
#include <cstring>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/mapped_file.h"
#include "model/weights.h"

namespace serval {

namespace {

using nlohmann::json;

constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // safetensors itself caps headers at 100 MB

// Bytes per element of every dtype the format defines (so that tensors we do not
// use can still be bounds-checked); 0 for unknown dtypes.
int64_t element_size(const std::string& d) {
  static const std::map<std::string, int64_t> sizes = {
      {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8}, {"U64", 8}, {"I32", 4}, {"U32", 4},
      {"I16", 2}, {"U16", 2}, {"I8", 1},  {"U8", 1},   {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1},
  };
  auto it = sizes.find(d);
  return it == sizes.end() ? 0 : it->second;
}

int64_t json_nonneg_int(const json& j, const std::string& what) {
  if (!j.is_number_integer()) fail(what, " must be a non-negative integer");
  if (j.is_number_unsigned()) {
    const uint64_t u = j.get<uint64_t>();
    if (u > uint64_t(INT64_MAX)) fail(what, " is out of range");
    return int64_t(u);
  }
  const int64_t v = j.get<int64_t>();
  if (v < 0) fail(what, " must be a non-negative integer, got ", v);
  return v;
}

}  // namespace

DType dtype_from_safetensors(const std::string& dtype, const std::string& tensor_name) {
  if (dtype == "F32") return DType::F32;
  if (dtype == "F16") return DType::F16;
  if (dtype == "BF16") return DType::BF16;
  if (dtype == "F8_E4M3") return DType::FP8_E4M3;  // the weights of FP8 checkpoints (model/hf_quant.h)
  if (dtype == "I8") return DType::I8;              // the weights of int8 checkpoints (model/hf_quant.h)
  fail("tensor \"", tensor_name, "\" has dtype ", dtype,
       ", which Serval does not support (supported: F32, F16, BF16, F8_E4M3, I8)");
}

std::string safetensors_dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::F16: return "F16";
    case DType::BF16: return "BF16";
    case DType::FP8_E4M3: return "F8_E4M3";
    default: fail("dtype ", dtype_name(t), " cannot be stored in safetensors by Serval");
  }
}

std::shared_ptr<SafetensorsFile> SafetensorsFile::parse(const uint8_t* bytes, size_t size, std::string label) {
  auto f = std::make_shared<SafetensorsFile>();
  f->path_ = label;
  try {
    if (size < 8) fail("file is truncated: ", size, " bytes, the header length alone takes 8");
    uint64_t n = 0;
    std::memcpy(&n, bytes, 8);
    if (n > size - 8) fail("file is truncated: header claims ", n, " bytes, only ", size - 8, " follow");
    if (n > kMaxHeaderBytes) fail("header of ", n, " bytes is larger than the ", kMaxHeaderBytes, " allowed");
    json header;
    try {
      header = json::parse(bytes + 8, bytes + 8 + n);
    } catch (const json::exception& e) {
      fail("header is not valid JSON: ", e.what());
    }
    if (!header.is_object()) fail("header must be a JSON object");
    const uint8_t* data = bytes + 8 + n;
    const uint64_t data_size = size - 8 - n;

    for (auto it = header.begin(); it != header.end(); ++it) {
      const std::string& name = it.key();
      const json& v = it.value();
      if (name == "__metadata__") {
        if (!v.is_object()) fail("__metadata__ must be an object of strings");
        for (auto m = v.begin(); m != v.end(); ++m) {
          if (!m.value().is_string()) fail("__metadata__ value \"", m.key(), "\" must be a string");
          f->metadata_[m.key()] = m.value().get<std::string>();
        }
        continue;
      }
      const std::string what = str_cat("tensor \"", name, "\"");
      if (!v.is_object()) fail(what, " must be a JSON object");
      if (!v.contains("dtype") || !v["dtype"].is_string()) fail(what, " has no dtype string");
      if (!v.contains("shape") || !v["shape"].is_array()) fail(what, " has no shape array");
      if (!v.contains("data_offsets") || !v["data_offsets"].is_array() || v["data_offsets"].size() != 2)
        fail(what, " needs data_offsets [begin, end]");
      SafetensorsTensor t;
      t.name = name;
      t.dtype = v["dtype"].get<std::string>();
      const int64_t esize = element_size(t.dtype);
      if (esize == 0) fail(what, " has unknown dtype \"", t.dtype, "\"");
      if (v["shape"].size() > 8) fail(what, " has ", v["shape"].size(), " dimensions (at most 8)");
      int64_t numel = 1;
      for (const json& d : v["shape"]) {
        t.shape.push_back(json_nonneg_int(d, what + " dimension"));
        if (__builtin_mul_overflow(numel, t.shape.back(), &numel)) fail(what, " has too many elements");
      }
      const int64_t begin = json_nonneg_int(v["data_offsets"][0], what + " data_offsets[0]");
      const int64_t end = json_nonneg_int(v["data_offsets"][1], what + " data_offsets[1]");
      if (end < begin) fail(what, " has data_offsets [", begin, ", ", end, "] with end before begin");
      if (uint64_t(end) > data_size)
        fail("file is truncated: ", what, " ends at data offset ", end, " but the data section has ", data_size,
             " bytes");
      int64_t nbytes = 0;
      if (__builtin_mul_overflow(numel, esize, &nbytes) || nbytes != end - begin)
        fail(what, " (", t.dtype, " ", shape_string(t.shape), ") needs ", numel, " x ", esize,
             " bytes but data_offsets [", begin, ", ", end, "] span ", end - begin);
      t.data = data + begin;
      t.nbytes = nbytes;
      f->index_[name] = f->tensors_.size();
      f->tensors_.push_back(std::move(t));
    }
    // Tensors must not share bytes (empty tensors take none).
    std::vector<const SafetensorsTensor*> by_offset;
    for (const auto& t : f->tensors_)
      if (t.nbytes > 0) by_offset.push_back(&t);
    std::sort(by_offset.begin(), by_offset.end(), [](auto* a, auto* b) { return a->data < b->data; });
    for (size_t i = 1; i < by_offset.size(); ++i)
      if (by_offset[i - 1]->data + by_offset[i - 1]->nbytes > by_offset[i]->data)
        fail("tensors \"", by_offset[i - 1]->name, "\" and \"", by_offset[i]->name, "\" overlap");
  } catch (const Error& e) {
    fail("safetensors \"", label, "\": ", e.what());
  }
  return f;
}

std::shared_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  auto mapping = MappedFile::open_read(path);
  auto f = parse(mapping->data(), mapping->size(), path);
  f->mapping_ = mapping;
  return f;
}

const SafetensorsTensor* SafetensorsFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

void write_safetensors(const std::string& path, const std::vector<SafetensorsWriteTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t off = 0;
  for (const auto& t : tensors) {
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {off, off + t.bytes.size()}}};
    off += t.bytes.size();
  }
  std::string text = header.dump();
  while ((8 + text.size()) % 8 != 0) text.push_back(' ');  // keep data 8-byte aligned
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) fail("cannot create \"", path, "\"");
  const uint64_t n = text.size();
  out.write(reinterpret_cast<const char*>(&n), 8);
  out.write(text.data(), std::streamsize(text.size()));
  for (const auto& t : tensors) out.write(reinterpret_cast<const char*>(t.bytes.data()), std::streamsize(t.bytes.size()));
  if (!out) fail("cannot write \"", path, "\"");
}

}  // namespace serval
