#include "backend/cpu/cpu_backend.h"

#include <cblas.h>
#include <omp.h>

#include <cstdlib>
#include <cstring>

#include "core/error.h"

namespace serval {

CpuWeight::CpuWeight(std::string name, std::vector<int64_t> shape, std::vector<float> values)
    : values_(std::move(values)) {
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
  // OpenBLAS keeps its own thread pool; give it the same budget.
  openblas_set_num_threads(threads_);
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

void CpuBackend::tensor_to_host(const Tensor& t, float* dst) {
  copy_to_host(dst, t.data, t.numel() * int64_t(sizeof(float)));
}

std::unique_ptr<DeviceWeight> CpuBackend::upload_weight(const TensorView& view) {
  SERVAL_CHECK(view.shape.size() == 1 || view.shape.size() == 2, "tensor \"", view.name, "\" has ",
               view.shape.size(), " dimensions; the CPU backend takes vectors and matrices");
  int64_t n = 1;
  for (int64_t d : view.shape) n *= d;
  SERVAL_CHECK(view.data != nullptr || n == 0, "tensor \"", view.name, "\" has no data");
  std::vector<float> values(static_cast<size_t>(n));
  to_f32(view.dtype, view.data, values.data(), n);
  return std::make_unique<CpuWeight>(view.name, view.shape, std::move(values));
}

KvLayer CpuBackend::alloc_kv_layer(const KvGeometry& g) {
  const int64_t elems = g.num_blocks * g.block_size * g.num_kv_heads * g.head_dim;
  return KvLayer{alloc(elems * int64_t(sizeof(float))), alloc(elems * int64_t(sizeof(float)))};
}

void CpuBackend::matmul(const Tensor& x, const DeviceWeight& w, const DeviceWeight* bias, Tensor y) {
  const float* W = as_cpu(w).data();
  const int64_t T = x.rows, in = x.cols, out = w.rows();
  if (T == 0) return;
  if (T == 1) {
    // Decode: a matrix-vector product, bound by reading W once.
    cblas_sgemv(CblasRowMajor, CblasNoTrans, int(out), int(in), 1.0f, W, int(in), f32(x), 1, 0.0f, f32(y), 1);
  } else {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(T), int(out), int(in), 1.0f, f32(x), int(in), W,
                int(in), 0.0f, f32(y), int(out));
  }
  if (bias != nullptr) {
    const float* b = as_cpu(*bias).data();
    float* Y = f32(y);
#pragma omp parallel for num_threads(threads_) if (T * out > 65536)
    for (int64_t t = 0; t < T; ++t) {
      float* row = Y + t * out;
      for (int64_t o = 0; o < out; ++o) row[o] += b[o];
    }
  }
}

std::unique_ptr<Backend> make_cpu_backend(int threads) { return std::make_unique<CpuBackend>(threads); }

}  // namespace serval
