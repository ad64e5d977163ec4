// CudaBackend: device selection, memory, weight upload, KV pools.

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_gate_up_layout.cuh"

namespace serval::cuda {

CudaWeight::CudaWeight(std::string name, std::vector<int64_t> shape, DType dtype, DeviceBuffer buf,
                       const void* group)
    : dtype_(dtype), buf_(std::move(buf)), group_(group) {
  name_ = std::move(name);
  shape_ = std::move(shape);
}

const CudaWeight& as_cuda(const DeviceWeight& w) {
  auto* cw = dynamic_cast<const CudaWeight*>(&w);
  SERVAL_CHECK(cw != nullptr, "weight \"", w.name(), "\" was not uploaded to the CUDA backend");
  return *cw;
}

CudaBackend::CudaBackend(int device, DType act_dtype, const CudaTuning& tuning)
    : device_(device), act_dtype_(act_dtype), tuning_(tuning) {
  tuning_.cutlass_gemm = tuning.cutlass_gemm && cutlass_gemm_built();
  SERVAL_CHECK(act_dtype == DType::BF16 || act_dtype == DType::F32, "cuda backend: computes in bf16 or f32, not ",
               dtype_name(act_dtype));
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  SERVAL_CHECK(err == cudaSuccess && count > 0, "cuda backend: no CUDA device available (",
               err == cudaSuccess ? "0 devices" : cudaGetErrorString(err), ")");
  SERVAL_CHECK(device >= 0 && device < count, "cuda backend: device ", device, " does not exist (", count,
               " devices)");
  SERVAL_CUDA_CHECK(cudaSetDevice(device_));
  SERVAL_CUDA_CHECK(cudaDeviceGetAttribute(&num_sms_, cudaDevAttrMultiProcessorCount, device_));
  SERVAL_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  SERVAL_CHECK(cublasLtCreate(&lt_) == CUBLAS_STATUS_SUCCESS, "cuda backend: cublasLtCreate failed");
  lt_workspace_ = alloc(int64_t(32) << 20);
}

CudaBackend::~CudaBackend() {
  cudaStreamSynchronize(stream_);
  for (auto& [key, p] : plans_) {
    cublasLtMatrixLayoutDestroy(p.a);
    cublasLtMatrixLayoutDestroy(p.b);
    cublasLtMatrixLayoutDestroy(p.c);
    cublasLtMatmulDescDestroy(p.op);
  }
  if (lt_) cublasLtDestroy(lt_);
  if (host_staging_) cudaFreeHost(host_staging_);
  if (upload_arena_) cudaFreeHost(upload_arena_);
  if (stream_) cudaStreamDestroy(stream_);
}

DeviceBuffer CudaBackend::alloc(int64_t bytes) {
  SERVAL_CHECK(bytes >= 0, "cuda backend: cannot allocate ", bytes, " bytes");
  SERVAL_CHECK(!capturing_, "cuda backend: cannot allocate while a graph is being captured");
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, size_t(std::max<int64_t>(bytes, 256)));
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error so later calls work
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    fail("cuda backend: cannot allocate ", bytes, " bytes of GPU memory (", free_b, " of ", total_b,
         " bytes free): ", cudaGetErrorString(err));
  }
  // Zeroed like the CPU's calloc: KV slots never written are never read, but
  // zeros keep any stray read finite.
  SERVAL_CUDA_CHECK(cudaMemsetAsync(p, 0, size_t(std::max<int64_t>(bytes, 256)), stream_));
  const int64_t held = std::max<int64_t>(bytes, 256);
  return DeviceBuffer(std::shared_ptr<void>(p,
                                            [pending = pending_norm_, held](void* q) {
                                              if (pending->overlaps(q, held)) *pending = PendingNorm{};
                                              cudaFree(q);
                                            }),
                      bytes);
}

void CudaBackend::copy_to_device(void* dst, const void* src, int64_t bytes) {
  if (bytes <= 0) return;
  // The caller may reuse `src` as soon as we return: wait for the copy.
  SERVAL_CUDA_CHECK(cudaMemcpyAsync(dst, src, size_t(bytes), cudaMemcpyHostToDevice, stream_));
  sync_stream();
}

void CudaBackend::copy_to_device_async(void* dst, const void* src, int64_t bytes) {
  if (bytes <= 0) return;
  SERVAL_CHECK(!capturing_, "cuda backend: cannot copy to the device while a graph is being captured");
  const int64_t piece = (bytes + 255) / 256 * 256;
  if (upload_arena_used_ + piece > upload_arena_bytes_) {
    sync_stream();  // every piece handed out has been copied: the arena is free again
    if (piece > upload_arena_bytes_) {
      if (upload_arena_) SERVAL_CUDA_CHECK(cudaFreeHost(upload_arena_));
      upload_arena_ = nullptr;
      const int64_t grown = std::max({piece, upload_arena_bytes_ * 2, int64_t(1) << 20});
      upload_arena_bytes_ = 0;
      SERVAL_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&upload_arena_), size_t(grown)));
      upload_arena_bytes_ = grown;
    }
  }
  char* staged = upload_arena_ + upload_arena_used_;
  std::memcpy(staged, src, size_t(bytes));
  SERVAL_CUDA_CHECK(cudaMemcpyAsync(dst, staged, size_t(bytes), cudaMemcpyHostToDevice, stream_));
  upload_arena_used_ += piece;
}

void CudaBackend::copy_to_host(void* dst, const void* src, int64_t bytes) {
  if (bytes <= 0) return;
  settle(src, bytes);
  SERVAL_CUDA_CHECK(cudaMemcpyAsync(dst, src, size_t(bytes), cudaMemcpyDeviceToHost, stream_));
  sync_stream();
}

void CudaBackend::synchronize() { sync_stream(); }

void CudaBackend::sync_stream() {
  SERVAL_CUDA_CHECK(cudaStreamSynchronize(stream_));
  upload_arena_used_ = 0;
}

void CudaBackend::memory_info(int64_t& free_bytes, int64_t& total_bytes) {
  size_t f = 0, t = 0;
  SERVAL_CUDA_CHECK(cudaMemGetInfo(&f, &t));
  free_bytes = int64_t(f);
  total_bytes = int64_t(t);
}

void CudaBackend::tensor_to_host(const Tensor& t, float* dst) {
  SERVAL_CHECK(t.dtype == DType::BF16 || t.dtype == DType::F32, "cuda backend: tensor_to_host expects bf16 or f32, got ",
               dtype_name(t.dtype));
  const int64_t n = t.numel();
  if (n == 0) return;
  settle(t);
  // Through pinned memory (a pageable copy runs at a fraction of PCIe speed),
  // then widened or copied into `dst` on all cores: logits of a big batch are
  // tens of MB per step.
  const int64_t bytes = dtype_bytes(t.dtype, n);
  if (host_staging_bytes_ < bytes) {
    if (host_staging_) SERVAL_CUDA_CHECK(cudaFreeHost(host_staging_));
    host_staging_bytes_ = std::max<int64_t>(bytes, host_staging_bytes_ * 3 / 2);
    SERVAL_CUDA_CHECK(cudaMallocHost(&host_staging_, size_t(host_staging_bytes_)));
  }
  SERVAL_CUDA_CHECK(cudaMemcpyAsync(host_staging_, t.data, size_t(bytes), cudaMemcpyDeviceToHost, stream_));
  sync_stream();
  if (t.dtype == DType::F32) {
    const float* h = static_cast<const float*>(host_staging_);
#pragma omp parallel for schedule(static) if (n > (1 << 18))
    for (int64_t i = 0; i < n; ++i) dst[i] = h[i];
  } else {
    const uint16_t* h = static_cast<const uint16_t*>(host_staging_);
#pragma omp parallel for schedule(static) if (n > (1 << 18))
    for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(h[i]);
  }
}

// The backend's dtype of a weight (matrices in the activation dtype, vectors
// f32) and its element count, after checking the view.
DType CudaBackend::weight_target(const TensorView& view, int64_t& n) const {
  SERVAL_CHECK(view.shape.size() == 1 || view.shape.size() == 2, "tensor \"", view.name, "\" has ",
               view.shape.size(), " dimensions; the CUDA backend takes vectors and matrices");
  n = 1;
  for (int64_t d : view.shape) n *= d;
  SERVAL_CHECK(view.data != nullptr || n == 0, "tensor \"", view.name, "\" has no data");
  return view.shape.size() == 2 ? act_dtype_ : DType::F32;
}

// Writes `view`, converted to `target`, to device memory at dst.
void CudaBackend::upload_into(const TensorView& view, DType target, int64_t n, void* dst_mem) {
  if (view.dtype == target) {
    copy_to_device(dst_mem, view.data, dtype_bytes(target, n));
    return;
  }
  // Convert on the host in block-aligned chunks, through f32.
  const int64_t block = dtype_block_elems(view.dtype);
  const int64_t chunk = std::max<int64_t>(block, (int64_t(1) << 22) / block * block);
  std::vector<float> f(size_t(std::min(chunk, n)));
  std::vector<uint16_t> h(target == DType::BF16 ? f.size() : 0);
  const auto* src = static_cast<const uint8_t*>(view.data);
  char* dst = static_cast<char*>(dst_mem);
  for (int64_t start = 0; start < n; start += chunk) {
    const int64_t len = std::min(chunk, n - start);
    to_f32(view.dtype, src + dtype_bytes(view.dtype, start), f.data(), len);
    if (target == DType::BF16) {
#pragma omp parallel for schedule(static) if (len > (1 << 16))
      for (int64_t i = 0; i < len; ++i) h[size_t(i)] = f32_to_bf16(f[size_t(i)]);
      copy_to_device(dst + start * 2, h.data(), len * 2);
    } else {
      copy_to_device(dst + start * 4, f.data(), len * 4);
    }
  }
}

std::unique_ptr<DeviceWeight> CudaBackend::upload_weight(const TensorView& view) {
  int64_t n = 0;
  const DType target = weight_target(view, n);
  DeviceBuffer buf = alloc(dtype_bytes(target, n));
  upload_into(view, target, n, buf.data());
  auto w = std::make_unique<CudaWeight>(view.name, view.shape, target, std::move(buf));
  if (view.shape.size() == 1) {  // a norm of ones (the runner's, after folding) changes nothing
    std::vector<float> f(static_cast<size_t>(n));
    to_f32(view.dtype, view.data, f.data(), n);
    w->set_unit(n > 0 && std::all_of(f.begin(), f.end(), [](float v) { return v == 1.0f; }));
  }
  return w;
}

// One allocation, each weight at a 256-byte boundary after the one before:
// weights of one shape then lie at one stride, which matmul_multi reads as a
// strided batch.
std::vector<std::unique_ptr<DeviceWeight>> CudaBackend::upload_weight_group(const std::vector<TensorView>& views) {
  struct Part {
    DType target;
    int64_t n, offset;
  };
  std::vector<Part> parts;
  int64_t total = 0;
  for (const TensorView& v : views) {
    Part part{};
    part.target = weight_target(v, part.n);
    part.offset = total;
    total += (dtype_bytes(part.target, part.n) + 255) / 256 * 256;
    parts.push_back(part);
  }
  const DeviceBuffer whole = alloc(total);
  std::vector<std::unique_ptr<DeviceWeight>> out;
  for (size_t i = 0; i < views.size(); ++i) {
    const Part& part = parts[i];
    DeviceBuffer mem = whole.slice(part.offset, dtype_bytes(part.target, part.n));
    upload_into(views[i], part.target, part.n, mem.data());
    out.push_back(
        std::make_unique<CudaWeight>(views[i].name, views[i].shape, part.target, std::move(mem), whole.data()));
  }
  return out;
}

// Each matrix goes up as it is, into staging, then into its rows of the pair
// (one strided device copy: 8 rows at a stride of 16).
std::vector<std::unique_ptr<DeviceWeight>> CudaBackend::upload_gated_pair(const TensorView& gate,
                                                                          const TensorView& up) {
  int64_t n = 0, n_up = 0;
  const bool fits = tuning_.gate_up_interleaved && weight_target(gate, n) == DType::BF16 &&
                    weight_target(up, n_up) == DType::BF16 && gate.shape.size() == 2 && up.shape == gate.shape &&
                    gate.shape[0] % kGateUpGroupRows == 0;
  if (!fits) return upload_weight_group({gate, up});
  const int64_t rows = gate.shape[0], cols = gate.shape[1], bytes = n * 2;
  const size_t group = size_t(kGateUpGroupRows * cols * 2);
  const DeviceBuffer whole = alloc(2 * bytes);
  {
    DeviceBuffer staging = alloc(bytes);
    for (int i = 0; i < 2; ++i) {
      upload_into(i == 0 ? gate : up, DType::BF16, n, staging.data());
      SERVAL_CUDA_CHECK(cudaMemcpy2DAsync(static_cast<char*>(whole.data()) + i * group, 2 * group, staging.data(),
                                          group, group, size_t(rows / kGateUpGroupRows), cudaMemcpyDeviceToDevice,
                                          stream_));
      synchronize();  // before staging is written again (or freed)
    }
  }
  std::vector<std::unique_ptr<DeviceWeight>> out;
  for (int i = 0; i < 2; ++i) {
    const TensorView& v = i == 0 ? gate : up;
    auto w = std::make_unique<CudaWeight>(v.name, v.shape, DType::BF16,
                                          whole.slice(int64_t(i * group), 2 * bytes - int64_t(i * group)),
                                          whole.data());
    w->set_interleaved();
    out.push_back(std::move(w));
  }
  return out;
}

KvLayer CudaBackend::alloc_kv_layer(const KvGeometry& g) {
  const int64_t bytes = dtype_bytes(act_dtype_, g.num_blocks * g.block_size * g.num_kv_heads * g.head_dim);
  return KvLayer{alloc(bytes), alloc(bytes)};
}

void CudaBackend::copy_kv_block(const KvLayer& kv, const KvGeometry& g, int64_t src, int64_t dst) {
  const int64_t block = dtype_bytes(act_dtype_, int64_t(g.block_size) * g.num_kv_heads * g.head_dim);
  for (const DeviceBuffer* pool : {&kv.k, &kv.v}) {
    char* base = static_cast<char*>(pool->data());
    SERVAL_CUDA_CHECK(cudaMemcpyAsync(base + dst * block, base + src * block, size_t(block),
                                      cudaMemcpyDeviceToDevice, stream_));
  }
}

void* CudaBackend::host_op_scratch(DeviceBuffer& buf, int64_t bytes) {
  if (buf.bytes() < bytes) {
    synchronize();  // the old buffer may still be in use by queued kernels
    buf = alloc(std::max<int64_t>(bytes, buf.bytes() * 3 / 2));
  }
  return buf.data();
}

Launch CudaBackend::launch_on() const {
  return {stream_, tuning_.pdl, tuning_.gemv_sms > 0 ? std::min(tuning_.gemv_sms, num_sms_) : num_sms_};
}

CutlassLaunch CudaBackend::cutlass_on() const {
  return {.stream = stream_,
          .sms = num_sms_,
          .pdl = tuning_.pdl,
          .swap = tuning_.cutlass_swap,
          .swap_gated = tuning_.cutlass_swap_gated,
          .two_ctas = tuning_.cutlass_two_ctas,
          .w_prefetch_k_blocks = tuning_.cutlass_w_prefetch};
}

void* CudaBackend::scratch(DeviceBuffer& buf, int64_t bytes) {
  if (buf.bytes() < bytes) {
    SERVAL_CHECK(!capturing_, "cuda backend: a scratch buffer must grow (", bytes,
                 " bytes) while a graph is being captured; run the step eagerly first");
    ++scratch_epoch_;  // graphs recorded with the old buffer must not replay
  }
  return host_op_scratch(buf, bytes);
}

}  // namespace serval::cuda

namespace serval {

std::unique_ptr<Backend> make_cuda_backend(DType act_dtype, const CudaTuning& tuning) {
  return std::make_unique<cuda::CudaBackend>(0, act_dtype, tuning);
}

bool cuda_device_present() {
  int count = 0;
  const bool ok = cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
  cudaGetLastError();  // no device is not an error to keep
  return ok;
}

}  // namespace serval
