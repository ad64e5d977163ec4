#include "backend/cpu/cpu_backend.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "kv/kv_memory_plan.h"
#include "kv/kv_quant.h"

namespace serval {

CpuWeight::CpuWeight(std::string name, std::vector<int64_t> shape, std::vector<float> values)
    : values_(std::move(values)) {
  name_ = std::move(name);
  shape_ = std::move(shape);
}

CpuWeight::CpuWeight(std::string name, std::vector<int64_t> shape, DType dtype, std::vector<uint8_t> blocks)
    : block_dtype_(dtype), blocks_(std::move(blocks)) {
  name_ = std::move(name);
  shape_ = std::move(shape);
}

const CpuWeight& as_cpu(const DeviceWeight& w) {
  auto* cw = dynamic_cast<const CpuWeight*>(&w);
  SERVAL_CHECK(cw != nullptr, "weight \"", w.name(), "\" was not uploaded to the CPU backend");
  return *cw;
}

CpuBackend::CpuBackend(int threads) {
  SERVAL_CHECK(threads >= 0, "cpu backend: threads must be >= 0, got ", threads);
  threads_ = threads > 0 ? threads : omp_get_num_procs();
  // OpenBLAS runs single-threaded inside our OpenMP threads (see cpu_matmul.cpp).
  openblas_set_num_threads(1);
  scores_.resize(threads_);
}

DeviceBuffer CpuBackend::alloc(int64_t bytes) {
  SERVAL_CHECK(bytes >= 0, "cpu backend: cannot allocate ", bytes, " bytes");
  // calloc: large requests come as untouched zero pages, so a big KV pool costs
  // memory only where it is written.
  void* p = std::calloc(size_t(bytes > 0 ? bytes : 1), 1);
  SERVAL_CHECK(p != nullptr, "cpu backend: out of memory allocating ", bytes, " bytes");
  return DeviceBuffer(std::shared_ptr<void>(p, std::free), bytes);
}

void CpuBackend::copy_to_device(void* dst, const void* src, int64_t bytes) {
  if (bytes > 0) std::memcpy(dst, src, size_t(bytes));
}

void CpuBackend::copy_to_host(void* dst, const void* src, int64_t bytes) {
  if (bytes > 0) std::memcpy(dst, src, size_t(bytes));
}

void CpuBackend::memory_info(int64_t& free_bytes, int64_t& total_bytes) {
  free_bytes = total_bytes = available_memory_bytes();
}

void CpuBackend::sample(const Tensor& logits, std::span<const SampleSpec> specs, std::vector<SampleResult>& out) {
  SERVAL_CHECK(logits.dtype == DType::F32, "cpu backend: sample expects f32 logits");
  out.resize(specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    const SampleSpec& s = specs[i];
    SERVAL_CHECK(s.row >= 0 && s.row < logits.rows, "sample: row ", s.row, " is outside the ", logits.rows,
                 " rows of logits");
    SERVAL_CHECK(s.fed_source < 0, "sample: spec ", i, " has a fed token; start_sample resolves those");
    const std::span<const float> row(f32(logits) + int64_t(s.row) * logits.cols, size_t(logits.cols));
    out[i] = s.forced_token >= 0 ? sampler_.score(row, s.forced_token, s.params->logprobs)
                                 : sampler_.sample(row, *s.params, s.prompt_ids, s.output_ids, s.uniform, s.banned,
                                                   s.allowed);
  }
}

void CpuBackend::tensor_to_host(const Tensor& t, float* dst) {
  copy_to_host(dst, t.data, t.numel() * int64_t(sizeof(float)));
}

namespace {

// n values of `dtype` at src into f32 at dst, in block-aligned chunks on all threads.
void decode_parallel(DType dtype, const void* src, float* dst, int64_t n, int threads) {
  const int64_t block = dtype_block_elems(dtype);
  const int64_t chunk = std::max<int64_t>(1 << 16, (n / threads + block - 1) / block * block);
  const auto* bytes = static_cast<const uint8_t*>(src);
#pragma omp parallel for num_threads(threads) schedule(static) if (n > (1 << 20))
  for (int64_t start = 0; start < n; start += chunk) {
    const int64_t len = std::min(chunk, n - start);
    to_f32(dtype, bytes + dtype_bytes(dtype, start), dst + start, len);
  }
}

}  // namespace

std::unique_ptr<DeviceWeight> CpuBackend::upload_kept_linear(const Linear& w) {
  SERVAL_CHECK(keeps_linear_format(w.format) && w.shard.is_whole(), "cpu backend: \"", w.name, "\" (",
               w.format.describe(), ") is not a format it keeps");
  w.validate();
  const auto* src = static_cast<const uint8_t*>(w.weight.data);
  return std::make_unique<CpuWeight>(w.name, std::vector<int64_t>{w.out, w.in}, w.format.dtype,
                                     std::vector<uint8_t>(src, src + w.weight.nbytes));
}

const float* CpuBackend::matrix_values(const CpuWeight& w) {
  if (!w.kept()) return w.data();
  const int64_t n = w.rows() * w.cols();
  if (int64_t(scratch_.size()) < n) scratch_.resize(size_t(n));
  decode_parallel(w.block_dtype(), w.blocks(), scratch_.data(), n, threads_);
  return scratch_.data();
}

std::unique_ptr<DeviceWeight> CpuBackend::upload_weight(const TensorView& view) {
  SERVAL_CHECK(view.shape.size() == 1 || view.shape.size() == 2, "tensor \"", view.name, "\" has ",
               view.shape.size(), " dimensions; the CPU backend takes vectors and matrices");
  int64_t n = 1;
  for (int64_t d : view.shape) n *= d;
  SERVAL_CHECK(view.data != nullptr || n == 0, "tensor \"", view.name, "\" has no data");
  std::vector<float> values(static_cast<size_t>(n));
  // Convert on all threads: a 1B model is ~1.2G values.
  decode_parallel(view.dtype, view.data, values.data(), n, threads_);
  return std::make_unique<CpuWeight>(view.name, view.shape, std::move(values));
}

void CpuBackend::set_kv_dtype(DType t) {
  SERVAL_CHECK(t == DType::F32 || kv_dtype_quantized(t), "the cpu backend keeps its KV cache in f32, fp8_e4m3 or i8, "
               "not ", dtype_name(t));
  kv_dtype_ = t;
}

KvLayer CpuBackend::alloc_kv_layer(const KvGeometry& g) {
  SERVAL_CHECK(g.dtype == DType::F32 || kv_dtype_quantized(g.dtype), "cpu backend: a KV pool of ",
               dtype_name(g.dtype));
  const int64_t bytes = dtype_bytes(g.dtype, g.num_blocks * g.block_size * g.num_kv_heads * g.head_dim);
  KvLayer kv{alloc(bytes), alloc(bytes), {}};
  if (kv_dtype_quantized(g.dtype)) {
    kv.scales = alloc(2 * int64_t(g.num_kv_heads) * int64_t(sizeof(float)));
    std::fill_n(static_cast<float*>(kv.scales.data()), 2 * g.num_kv_heads, 1.0f);
  }
  return kv;
}

std::unique_ptr<Backend> make_cpu_backend(int threads) { return std::make_unique<CpuBackend>(threads); }

}  // namespace serval
