// CudaDevice: device selection, memory, copies, scratch.
#include "backend/cuda/cuda_device.h"

#include <algorithm>
#include <cstring>

namespace serval::cuda {

CudaDevice::CudaDevice(int index) : index_(index) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  SERVAL_CHECK(err == cudaSuccess && count > 0, "cuda backend: no CUDA device available (",
               err == cudaSuccess ? "0 devices" : cudaGetErrorString(err), ")");
  SERVAL_CHECK(index >= 0 && index < count, "cuda backend: device ", index, " does not exist (", count,
               " devices: cuda:0 .. cuda:", count - 1, ")");
  bind();
  SERVAL_CUDA_CHECK(cudaDeviceGetAttribute(&num_sms_, cudaDevAttrMultiProcessorCount, index_));
  SERVAL_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
}

CudaDevice::~CudaDevice() {
  cudaSetDevice(index_);
  cudaStreamSynchronize(stream_);
  if (host_staging_) cudaFreeHost(host_staging_);
  if (upload_arena_) cudaFreeHost(upload_arena_);
  if (stream_) cudaStreamDestroy(stream_);
}

void CudaDevice::bind() const { SERVAL_CUDA_CHECK(cudaSetDevice(index_)); }

DeviceBuffer CudaDevice::alloc(int64_t bytes) {
  SERVAL_CHECK(bytes >= 0, "cuda backend: cannot allocate ", bytes, " bytes");
  SERVAL_CHECK(!capturing_, "cuda backend: cannot allocate while a graph is being captured");
  bind();
  void* p = nullptr;
  const int64_t held = std::max<int64_t>(bytes, 256);
  const cudaError_t err = cudaMalloc(&p, size_t(held));
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear the error so later calls work
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    fail("cuda backend: cannot allocate ", bytes, " bytes of GPU memory on cuda:", index_, " (", free_b, " of ",
         total_b, " bytes free): ", cudaGetErrorString(err));
  }
  // Zeroed like the CPU's calloc: KV slots never written are never read, but
  // zeros keep any stray read finite.
  SERVAL_CUDA_CHECK(cudaMemsetAsync(p, 0, size_t(held), stream_));
  const int device = index_;
  return DeviceBuffer(std::shared_ptr<void>(p,
                                            [device](void* q) {
                                              cudaSetDevice(device);
                                              cudaFree(q);
                                            }),
                      bytes);
}

void CudaDevice::copy_to_device(void* dst, const void* src, int64_t bytes) {
  if (bytes <= 0) return;
  bind();
  SERVAL_CUDA_CHECK(cudaMemcpyAsync(dst, src, size_t(bytes), cudaMemcpyHostToDevice, stream_));
  synchronize();
}

void CudaDevice::copy_to_device_async(void* dst, const void* src, int64_t bytes) {
  if (bytes <= 0) return;
  SERVAL_CHECK(!capturing_, "cuda backend: cannot copy to the device while a graph is being captured");
  bind();
  const int64_t piece = (bytes + 255) / 256 * 256;
  if (upload_arena_used_ + piece > upload_arena_bytes_) {
    synchronize();  // every piece handed out has been copied: the arena is free again
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

void CudaDevice::copy_to_host(void* dst, const void* src, int64_t bytes) {
  if (bytes <= 0) return;
  bind();
  SERVAL_CUDA_CHECK(cudaMemcpyAsync(dst, src, size_t(bytes), cudaMemcpyDeviceToHost, stream_));
  synchronize();
}

void CudaDevice::synchronize() {
  bind();
  SERVAL_CUDA_CHECK(cudaStreamSynchronize(stream_));
  upload_arena_used_ = 0;
}

void CudaDevice::memory_info(int64_t& free_bytes, int64_t& total_bytes) const {
  bind();
  size_t f = 0, t = 0;
  SERVAL_CUDA_CHECK(cudaMemGetInfo(&f, &t));
  free_bytes = int64_t(f);
  total_bytes = int64_t(t);
}

void CudaDevice::tensor_to_host(const Tensor& t, float* dst) {
  SERVAL_CHECK(t.dtype == DType::BF16 || t.dtype == DType::F32, "cuda backend: tensor_to_host expects bf16 or f32, got ",
               dtype_name(t.dtype));
  const int64_t n = t.numel();
  if (n == 0) return;
  bind();
  // Through pinned memory (a pageable copy runs at a fraction of PCIe speed),
  // then widened or copied into `dst` on all cores: logits of a big batch are
  // tens of MB per step.
  const int64_t bytes = dtype_bytes(t.dtype, n);
  if (host_staging_bytes_ < bytes) {
    if (host_staging_) SERVAL_CUDA_CHECK(cudaFreeHost(host_staging_));
    host_staging_ = nullptr;
    host_staging_bytes_ = std::max<int64_t>(bytes, host_staging_bytes_ * 3 / 2);
    SERVAL_CUDA_CHECK(cudaMallocHost(&host_staging_, size_t(host_staging_bytes_)));
  }
  SERVAL_CUDA_CHECK(cudaMemcpyAsync(host_staging_, t.data, size_t(bytes), cudaMemcpyDeviceToHost, stream_));
  synchronize();
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

void* CudaDevice::host_op_scratch(DeviceBuffer& buf, int64_t bytes) {
  if (buf.bytes() < bytes) {
    synchronize();  // the old buffer may still be in use by queued kernels
    buf = alloc(std::max<int64_t>(bytes, buf.bytes() * 3 / 2));
  }
  return buf.data();
}

void* CudaDevice::scratch(DeviceBuffer& buf, int64_t bytes) {
  if (buf.bytes() < bytes) {
    SERVAL_CHECK(!capturing_, "cuda backend: a scratch buffer must grow (", bytes,
                 " bytes) while a graph is being captured; run the step eagerly first");
    ++scratch_epoch_;  // graphs recorded with the old buffer must not replay
  }
  return host_op_scratch(buf, bytes);
}

}  // namespace serval::cuda
