#pragma once
// The CUDA backend's paged attention: fills AttnParams from a batch, plans a
// decode step (the split count, the stream kernel or not, their scratch) and
// launches the prefill and decode kernels (a mixed batch runs both; each
// kernel skips the sequences of the other kind). With f32 activations
// (--dtype float32) one CUDA-core kernel serves every sequence; in
// batch-invariant mode the prefill kernels serve every sequence.
#include "backend/cuda/cuda_attention.cuh"
#include "backend/cuda/cuda_config.h"

namespace serval::cuda {

using AttnParams = AttnParamsT<bf16>;

class CudaAttention {
 public:
  CudaAttention(CudaDevice& dev, const CudaConfig& cfg) : dev_(dev), cfg_(cfg) {}

  // Backend::paged_attention.
  void paged(const Tensor& q, const KvLayer& kv, const KvGeometry& geom, const BatchView& batch, int32_t num_heads,
             float scale, Tensor out);
  // The planned bf16 launch for a step (not batch-invariant), which the
  // caller may give a rope fold (AttnParams::fold) before launch().
  AttnParams plan(const Tensor& q, const KvLayer& kv, const KvGeometry& geom, const BatchView& batch,
                  int32_t num_heads, float scale, const Tensor& out);
  void launch(const AttnParams& p, const BatchView& batch);
  // Whether the split decode kernel can rotate q and k and write the new K/V
  // itself (AttnRopeFold) for this step: decodes only, bf16, a rope it has.
  bool rope_fold_fits(const Tensor& x, const Tensor& q, const RopeParams& rope, const KvGeometry& geom,
                      const BatchView& batch) const;

  // Decode launches that the stream kernel served, and that rotated q and
  // wrote the new K/V themselves.
  int64_t stream_calls() const { return stream_calls_; }
  int64_t rope_folded_calls() const { return rope_folded_calls_; }

 private:
  void plan_decode(AttnParams& p, const BatchView& b);

  CudaDevice& dev_;
  const CudaConfig& cfg_;
  DeviceBuffer partials_;     // split-KV decode: per-split outputs and (max, sum)
  DeviceBuffer piece_ready_;  // stream decode: per-warp flags, zero between launches
  DeviceBuffer merge_count_;  // split-KV decode: arrival counters, zero between launches
  int64_t stream_calls_ = 0;
  int64_t rope_folded_calls_ = 0;
};

}  // namespace serval::cuda
