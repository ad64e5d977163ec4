// GGUF writer. The header (metadata + tensor infos) is serialized into memory;
// the output file is then created at its final size, mapped, and every tensor is
// copied or generated straight into its place, tensors in parallel.
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <mutex>

#include "core/error.h"
#include "model/gguf.h"
#include "model/mapped_file.h"
#include "model/weights.h"

namespace serval {

namespace {

class Bytes {
 public:
  template <typename T>
  void put(T v) {
    const size_t at = buf.size();
    buf.resize(at + sizeof(T));
    std::memcpy(buf.data() + at, &v, sizeof(T));
  }
  void put_string(const std::string& s) {
    put<uint64_t>(s.size());
    buf.insert(buf.end(), s.begin(), s.end());
  }
  std::vector<uint8_t> buf;
};

void put_scalar(Bytes& b, GgufType type, int64_t i, double f) {
  switch (type) {
    case GgufType::UINT8: b.put<uint8_t>(uint8_t(i)); break;
    case GgufType::INT8: b.put<int8_t>(int8_t(i)); break;
    case GgufType::UINT16: b.put<uint16_t>(uint16_t(i)); break;
    case GgufType::INT16: b.put<int16_t>(int16_t(i)); break;
    case GgufType::UINT32: b.put<uint32_t>(uint32_t(i)); break;
    case GgufType::INT32: b.put<int32_t>(int32_t(i)); break;
    case GgufType::UINT64: b.put<uint64_t>(uint64_t(i)); break;
    case GgufType::INT64: b.put<int64_t>(i); break;
    case GgufType::FLOAT32: b.put<float>(float(f)); break;
    case GgufType::FLOAT64: b.put<double>(f); break;
    case GgufType::BOOL: b.put<uint8_t>(i ? 1 : 0); break;
    case GgufType::STRING: case GgufType::ARRAY: fail("internal: not a scalar GGUF type");
  }
}

void put_value(Bytes& b, const GgufValue& v) {
  switch (v.type) {
    case GgufType::STRING: b.put_string(v.s); return;
    case GgufType::UINT64: b.put<uint64_t>(v.u); return;
    case GgufType::ARRAY: break;
    default: put_scalar(b, v.type, v.i, v.f); return;
  }
  b.put<uint32_t>(uint32_t(v.elem_type));
  b.put<uint64_t>(v.array_size());
  switch (v.elem_type) {
    case GgufType::STRING: for (const auto& s : v.strs) b.put_string(s); break;
    case GgufType::ARRAY:
      for (const auto& a : v.arrays) {
        SERVAL_CHECK(a.type == GgufType::ARRAY, "GGUF writer: nested array element is not an array");
        put_value(b, a);
      }
      break;
    case GgufType::FLOAT32: case GgufType::FLOAT64:
      for (double x : v.nums) put_scalar(b, v.elem_type, 0, x);
      break;
    default: for (int64_t x : v.ints) put_scalar(b, v.elem_type, x, 0); break;
  }
}

uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

GgufValue scalar(GgufType t, int64_t i) {
  GgufValue v;
  v.type = t;
  v.i = i;
  v.u = uint64_t(i);
  return v;
}

}  // namespace

void GgufWriter::set_u8(const std::string& k, uint8_t v) { set_value(k, scalar(GgufType::UINT8, v)); }
void GgufWriter::set_i8(const std::string& k, int8_t v) { set_value(k, scalar(GgufType::INT8, v)); }
void GgufWriter::set_u16(const std::string& k, uint16_t v) { set_value(k, scalar(GgufType::UINT16, v)); }
void GgufWriter::set_i16(const std::string& k, int16_t v) { set_value(k, scalar(GgufType::INT16, v)); }
void GgufWriter::set_u32(const std::string& k, uint32_t v) { set_value(k, scalar(GgufType::UINT32, v)); }
void GgufWriter::set_i32(const std::string& k, int32_t v) { set_value(k, scalar(GgufType::INT32, v)); }
void GgufWriter::set_i64(const std::string& k, int64_t v) { set_value(k, scalar(GgufType::INT64, v)); }
void GgufWriter::set_bool(const std::string& k, bool v) { set_value(k, scalar(GgufType::BOOL, v)); }
void GgufWriter::set_u64(const std::string& k, uint64_t v) {
  GgufValue x = scalar(GgufType::UINT64, int64_t(v));
  x.u = v;
  set_value(k, x);
}
void GgufWriter::set_f32(const std::string& k, float v) {
  GgufValue x;
  x.type = GgufType::FLOAT32;
  x.f = v;
  set_value(k, x);
}
void GgufWriter::set_f64(const std::string& k, double v) {
  GgufValue x;
  x.type = GgufType::FLOAT64;
  x.f = v;
  set_value(k, x);
}
void GgufWriter::set_string(const std::string& k, const std::string& v) {
  GgufValue x;
  x.type = GgufType::STRING;
  x.s = v;
  set_value(k, x);
}
void GgufWriter::set_string_array(const std::string& k, const std::vector<std::string>& v) {
  GgufValue x;
  x.type = GgufType::ARRAY;
  x.elem_type = GgufType::STRING;
  x.strs = v;
  set_value(k, x);
}
void GgufWriter::set_f32_array(const std::string& k, const std::vector<float>& v) {
  GgufValue x;
  x.type = GgufType::ARRAY;
  x.elem_type = GgufType::FLOAT32;
  x.nums.assign(v.begin(), v.end());
  set_value(k, x);
}
void GgufWriter::set_i32_array(const std::string& k, const std::vector<int32_t>& v) {
  GgufValue x;
  x.type = GgufType::ARRAY;
  x.elem_type = GgufType::INT32;
  x.ints.assign(v.begin(), v.end());
  set_value(k, x);
}

void GgufWriter::set_value(const std::string& key, const GgufValue& v) {
  auto it = kv_index_.find(key);
  if (it != kv_index_.end()) {
    kv_[it->second].value = v;
    return;
  }
  kv_index_.emplace(key, kv_.size());
  kv_.push_back({key, v});
}

void GgufWriter::set_alignment(uint64_t alignment) {
  SERVAL_CHECK(alignment > 0 && (alignment & (alignment - 1)) == 0 && alignment <= (1u << 20),
               "GGUF alignment must be a power of two, got ", alignment);
  alignment_ = alignment;
  set_u32("general.alignment", uint32_t(alignment));
}

void GgufWriter::add_tensor_impl(Tensor t) {
  SERVAL_CHECK(!t.shape.empty() && t.shape.size() <= 4, "GGUF writer: tensor \"", t.name,
               "\" must have 1 to 4 dimensions, has ", t.shape.size());
  for (int64_t d : t.shape)
    SERVAL_CHECK(d > 0, "GGUF writer: tensor \"", t.name, "\" has a non-positive dimension ", shape_string(t.shape));
  const GgmlTypeTraits* tr = ggml_type_traits(t.ggml_type);
  SERVAL_CHECK(tr, "GGUF writer: unknown ggml type id ", t.ggml_type);
  SERVAL_CHECK(t.shape.back() % tr->block_elems == 0, "GGUF writer: tensor \"", t.name, "\" of type ",
               tr->name, " needs rows of a multiple of ", tr->block_elems, " elements");
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < t.shape.size(); ++i) rows *= t.shape[i];
  const int64_t expected = rows * (t.shape.back() / tr->block_elems) * tr->block_bytes;
  if (!t.fill)
    SERVAL_CHECK(t.nbytes == expected, "GGUF writer: tensor \"", t.name, "\" ", tr->name, " ",
                 shape_string(t.shape), " needs ", expected, " bytes, got ", t.nbytes);
  t.nbytes = expected;
  SERVAL_CHECK(tensor_index_.emplace(t.name, tensors_.size()).second, "GGUF writer: duplicate tensor \"",
               t.name, "\"");
  tensors_.push_back(std::move(t));
}

void GgufWriter::add_tensor(const std::string& name, DType dtype, const std::vector<int64_t>& shape,
                            const void* data, int64_t nbytes) {
  add_tensor_impl({name, ggml_from_dtype(dtype), shape, data, nbytes, nullptr});
}

void GgufWriter::add_tensor_raw(const std::string& name, uint32_t ggml_type, const std::vector<int64_t>& shape,
                                const void* data, int64_t nbytes) {
  add_tensor_impl({name, ggml_type, shape, data, nbytes, nullptr});
}

void GgufWriter::add_tensor_generated(const std::string& name, DType dtype, const std::vector<int64_t>& shape,
                                      Generator fill) {
  SERVAL_CHECK(fill != nullptr, "GGUF writer: tensor \"", name, "\" has no generator");
  add_tensor_impl({name, ggml_from_dtype(dtype), shape, nullptr, 0, std::move(fill)});
}

std::vector<uint8_t> GgufWriter::header_bytes(std::vector<uint64_t>& offsets, uint64_t& data_size) const {
  Bytes b;
  b.buf = {'G', 'G', 'U', 'F'};  // assigned, not inserted: GCC 12 warns (-Wstringop-overflow) on that
  b.put<uint32_t>(version_);
  b.put<uint64_t>(tensors_.size());
  b.put<uint64_t>(kv_.size());
  for (const Entry& e : kv_) {
    b.put_string(e.key);
    b.put<uint32_t>(uint32_t(e.value.type));
    put_value(b, e.value);
  }
  offsets.clear();
  uint64_t off = 0;
  for (const Tensor& t : tensors_) {
    b.put_string(t.name);
    b.put<uint32_t>(uint32_t(t.shape.size()));
    for (auto it = t.shape.rbegin(); it != t.shape.rend(); ++it) b.put<uint64_t>(uint64_t(*it));
    b.put<uint32_t>(t.ggml_type);
    b.put<uint64_t>(off);
    offsets.push_back(off);
    off = align_up(off + uint64_t(t.nbytes), alignment_);
  }
  data_size = off;
  return std::move(b.buf);
}

void GgufWriter::write(const std::string& path) const {
  std::vector<uint64_t> offsets;
  uint64_t data_size = 0;
  const std::vector<uint8_t> header = header_bytes(offsets, data_size);
  const uint64_t data_start = tensors_.empty() ? header.size() : align_up(header.size(), alignment_);
  auto out = MappedFile::create(path, data_start + data_size);
  uint8_t* base = out->mutable_data();
  std::memcpy(base, header.data(), header.size());
  // The file was created empty and extended, so all padding is already zero.

  // Largest tensors first, so that threads finish together.
  std::vector<size_t> order(tensors_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return tensors_[a].nbytes > tensors_[b].nbytes; });
  std::exception_ptr first_error;
  std::mutex error_mutex;
#pragma omp parallel for schedule(dynamic, 1)
  for (size_t k = 0; k < order.size(); ++k) {
    const Tensor& t = tensors_[order[k]];
    uint8_t* dst = base + data_start + offsets[order[k]];
    try {
      if (t.fill) {
        t.fill(dst, t.nbytes);
      } else if (t.nbytes > 0) {
        SERVAL_CHECK(t.data, "GGUF writer: tensor \"", t.name, "\" has no data");
        std::memcpy(dst, t.data, size_t(t.nbytes));
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex);
      if (!first_error) first_error = std::current_exception();
    }
  }
  out->close();
  if (first_error) std::rethrow_exception(first_error);
}

}  // namespace serval
