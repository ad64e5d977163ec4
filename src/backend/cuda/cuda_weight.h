#pragma once
// A weight on the GPU: matrices in the backend's activation dtype, or
// quantized matrices packed for the quantized GEMV (packed(); dtype() the
// GGUF block type, I8 for int4 and int8); vectors f32.
#include <optional>
#include <string>
#include <vector>

#include "backend/gpu_block_pack.h"
#include "runtime/backend.h"

namespace serval::cuda {

class CudaWeight : public DeviceWeight {
 public:
  CudaWeight(std::string name, std::vector<int64_t> shape, DType dtype, DeviceBuffer buf, const void* group = nullptr);
  DType dtype() const { return dtype_; }
  const void* data() const { return buf_.data(); }
  // The allocation upload_weight_group laid this weight out in (null: its own).
  const void* group() const { return group_; }
  // A vector of ones (a norm weight that changes nothing: folded ones).
  bool unit() const { return unit_; }
  void set_unit(bool on) { unit_ = on; }
  // Gate or up of a pair that upload_gated_pair interleaved
  // (cuda_gate_up_layout.cuh): row r lies at data() + gate_up_row(r) * cols()
  // (up's data() is kGateUpGroupRows rows past gate's). Only gated_mlp_up
  // and fold_norm_weight read such weights.
  bool interleaved() const { return interleaved_; }
  void set_interleaved() { interleaved_ = true; }
  // Quantized weights (gpu_block_pack.h) in this layout at data(); null for
  // a dense matrix.
  const GpuBlockPack* packed() const { return pack_ ? &*pack_ : nullptr; }
  void set_packed(const GpuBlockPack& pack) { pack_ = pack; }

 private:
  DType dtype_;
  DeviceBuffer buf_;
  const void* group_;
  bool unit_ = false;
  bool interleaved_ = false;
  std::optional<GpuBlockPack> pack_;
};

const CudaWeight& as_cuda(const DeviceWeight& w);

}  // namespace serval::cuda
