#pragma once
// One GPU as the CUDA backend uses it: its index, the one stream all of the
// backend's work runs on, device memory, copies to and from the host
// (through pinned staging), scratch buffers that graphs may record, and graph
// capture. Every call makes the device current on the calling thread first
// (bind), so backends on two GPUs can be driven from one process, and from
// any thread.
#include <cuda_runtime.h>

#include <memory>

#include "backend/cuda/cuda_common.cuh"
#include "runtime/backend.h"

namespace serval::cuda {

class CudaDevice {
 public:
  explicit CudaDevice(int index);
  ~CudaDevice();
  CudaDevice(const CudaDevice&) = delete;
  CudaDevice& operator=(const CudaDevice&) = delete;

  int index() const { return index_; }
  int num_sms() const { return num_sms_; }
  cudaStream_t stream() const { return stream_; }
  // Makes this device the calling thread's current one.
  void bind() const;

  // Zeroed device memory (at least 256 bytes are taken).
  DeviceBuffer alloc(int64_t bytes);
  // Waits for the copy: the caller may reuse `src` at once.
  void copy_to_device(void* dst, const void* src, int64_t bytes);
  // Queued on the stream from a pinned copy of `src` (the caller may reuse it at once).
  void copy_to_device_async(void* dst, const void* src, int64_t bytes);
  void copy_to_host(void* dst, const void* src, int64_t bytes);
  // A bf16 or f32 tensor into f32 host memory, through pinned staging.
  void tensor_to_host(const Tensor& t, float* dst);
  // Waits for the stream; every copy_to_device_async before it has landed.
  void synchronize();
  void memory_info(int64_t& free_bytes, int64_t& total_bytes) const;

  // Device scratch of at least `bytes` (grown, never shrunk; contents not
  // kept) for ops that graphs may record: growing it drops recorded graphs
  // (graph_epoch). host_op_scratch: the same for ops never recorded (sampling).
  void* scratch(DeviceBuffer& buf, int64_t bytes);
  void* host_op_scratch(DeviceBuffer& buf, int64_t bytes);
  int64_t graph_epoch() const { return scratch_epoch_; }

  // The stream's work between the two is recorded into a graph (cuda_graph.cu).
  void begin_capture();
  std::unique_ptr<DeviceGraph> end_capture();
  bool capturing() const { return capturing_; }

 private:
  int index_ = 0;
  int num_sms_ = 0;
  cudaStream_t stream_ = nullptr;
  bool capturing_ = false;       // inside begin_capture() .. end_capture()
  int64_t scratch_epoch_ = 0;    // scratch reallocations so far (graph_epoch)
  void* host_staging_ = nullptr;  // pinned, for tensor_to_host
  int64_t host_staging_bytes_ = 0;
  // copy_to_device_async's pinned arena: each copy takes the next piece, and a
  // wait for the stream (synchronize) frees them all.
  char* upload_arena_ = nullptr;
  int64_t upload_arena_bytes_ = 0, upload_arena_used_ = 0;
};

}  // namespace serval::cuda
