#pragma once
// The CUDA backend's matmuls: which kernel computes a product (our GEMV up
// to 16 rows, CUTLASS's decode GEMM at 17..64 where the build has it,
// cuBLASLt otherwise; in batch-invariant mode only our own kernels), and the
// matmul ops that finish their products in the kernel's epilogue: q/k/v with
// rope and the KV write, gate/up with silu * up, a projection into the
// residual with the norm after it (split-k, or the norm left to the GEMVs
// that read it: NormedRows::deferred). Where an op returns false it has
// launched nothing, and the backend composes the op from others.
#include <optional>
#include <span>
#include <vector>

#include "backend/cuda/cuda_config.h"
#include "backend/cuda/cuda_decode_matmul.h"
#include "backend/cuda/cuda_lt_matmul.h"
#include "backend/cuda/cuda_weight.h"

namespace serval::cuda {

class CudaMatmul {
 public:
  CudaMatmul(CudaDevice& dev, const CudaConfig& cfg) : dev_(dev), cfg_(cfg), lt_(dev, cfg) {}

  LtMatmul& lt() { return lt_; }
  const LtMatmul& lt() const { return lt_; }

  // Rows the GEMV takes: 1..16; in batch-invariant mode any number.
  bool own_kernel_fits(const Tensor& x) const;
  // Rows CUTLASS's decode GEMM takes (bf16, 17..kCutlassMaxRows, where built and tuned on).
  bool cutlass_rows(int64_t rows) const;
  // Whether the q/k/v product of `rows` rows takes rope and the KV write in
  // CUTLASS's epilogue.
  bool cutlass_rope_rows(int64_t rows) const {
    return cutlass_rows(rows) && rows <= cfg_.tuning.cutlass_rope_rows;
  }
  // One product: CUTLASS's decode GEMM where it takes it, else cuBLASLt.
  void gemm(const GemmShape& s, const void* w, const void* x, void* y);

  // Backend::matmul and matmul_multi. A packed weight (CudaWeight::packed)
  // goes through packed_matmul.
  void matmul(const Tensor& x, const CudaWeight& w, const CudaWeight* bias, Tensor y);
  void matmul_multi(const Tensor& x, const std::vector<const DeviceWeight*>& ws, const std::vector<Tensor>& ys);

  // Backend::qkv_rope_kv_write through the GEMV's rope epilogue (up to 16
  // rows), CUTLASS's (its rope rows) or one GEMM of the stacked weights and
  // the rope + KV write kernel (17..256 rows); false where none fits.
  bool qkv_rope_kv_write(const NormedRows& x, const CudaWeight& wq, const CudaWeight& wk, const CudaWeight& wv,
                         Tensor q, Tensor k, Tensor v, const int32_t* positions, const RopeParams& rope,
                         const int64_t* slot_mapping, const KvLayer& kv, const KvGeometry& geom);
  bool gemv_rope_fits(const Tensor& x, const CudaWeight& wq, const CudaWeight& wk, const CudaWeight& wv,
                      const Tensor& q, const Tensor& k, const Tensor& v, const RopeParams& rope,
                      const KvGeometry& geom) const;
  bool stacked_qkv_fits(const Tensor& x, const CudaWeight& wq, const CudaWeight& wk, const CudaWeight& wv,
                        const Tensor& q, const RopeParams& rope, const KvGeometry& geom) const;
  // The stacked product [T, q + 2 kv] (in scratch until the next call).
  const bf16* stacked_qkv(const Tensor& x, const CudaWeight& wq, const CudaWeight& wk, const CudaWeight& wv);
  // Backend::prepare_rope_angles: the table CUTLASS's rope epilogue reads.
  void prepare_rope_angles(const int32_t* positions, int64_t tokens, const RopeParams& rope);

  // Backend::gated_mlp_up for two bf16 matrices up to 16 rows (one GEMV) and
  // for an interleaved pair (any rows); false elsewhere.
  bool gated_mlp_up(const NormedRows& x, const CudaWeight& gate, const CudaWeight& up, Tensor up_buf, Tensor out);

  // Backend::matmul_add_rmsnorm where a fusion takes it: the norm left to
  // the GEMVs after it (a unit norm, up to 16 rows), or k split in two
  // halves summed by the norm kernel; nullopt elsewhere.
  std::optional<NormedRows> matmul_add_rmsnorm(const Tensor& x, const CudaWeight& w, Tensor residual,
                                               const CudaWeight& norm, float eps, Tensor out);
  // x normalized in place (no longer deferred); returns its rows.
  Tensor finish_norm(NormedRows& x);
  // x's rows normalized: the rows themselves, or, if x is deferred, a
  // normalized copy in scratch (valid until the next call), x left as it is.
  Tensor normalized(const NormedRows& x);

  int64_t cutlass_gemm_calls() const { return cutlass_gemm_calls_; }
  int64_t cutlass_epilogue_calls() const { return cutlass_epilogue_calls_; }
  int64_t stacked_qkv_calls() const { return stacked_qkv_calls_; }
  int64_t elided_norms() const { return elided_norms_; }
  int64_t packed_gemv_calls() const { return packed_gemv_calls_; }
  int64_t dequantized_gemm_calls() const { return dequantized_gemm_calls_; }

 private:
  // matmul_add_rmsnorm with its norm left to the GEMVs after it, where it
  // can be (cuda_norm_fold.cu).
  std::optional<NormedRows> defer_norm(const Tensor& x, const CudaWeight& w, Tensor residual, const CudaWeight& norm,
                                       float eps, Tensor out);
  // The GEMV's kConsume norm for x where x is deferred (GemvNorm::scales
  // written for over 4 rows), else none.
  GemvNorm consume_norm(const NormedRows& x);
  bool cutlass_qkv_rope_kv_write(const Tensor& x, const CudaWeight& wq, const CudaWeight& wk, Tensor q,
                                 const int32_t* positions, const RopeParams& rope, const int64_t* slot_mapping,
                                 const KvLayer& kv, const KvGeometry& geom);
  void interleaved_gated_mlp_up(const NormedRows& x, const CudaWeight& gate, const CudaWeight& up, Tensor up_buf,
                                Tensor out);
  // Products of packed weights (CudaWeight::packed; cuda_packed_matmul.cu):
  // the packed GEMV up to 16 rows (any number in batch-invariant mode, 16
  // at a time: packed_gemv_rows), else W dequantized into scratch for one
  // GEMM. The fused forms take q/k/v with rope and the KV write, or gate/up
  // with silu * up, in one launch per 16 rows; false where they do not fit
  // (then the backend composes the op).
  bool packed_gemv_rows(const Tensor& x) const;
  // The packed GEMV may quantize 1-2 rows of x to int8 (CudaTuning::packed_int8_x).
  bool int8_x() const;
  bool packed_together(const Tensor& x, std::span<const CudaWeight* const> ws) const;
  void packed_matmul(const Tensor& x, const CudaWeight& w, Tensor y);
  bool packed_multi(const Tensor& x, const std::vector<const DeviceWeight*>& ws, const std::vector<Tensor>& ys);
  bool packed_qkv_rope_kv_write(const NormedRows& x, const CudaWeight& wq, const CudaWeight& wk,
                                const CudaWeight& wv, Tensor q, Tensor k, Tensor v, const int32_t* positions,
                                const RopeParams& rope, const int64_t* slot_mapping, const KvLayer& kv,
                                const KvGeometry& geom);
  bool packed_gated_mlp_up(const NormedRows& x, const CudaWeight& gate, const CudaWeight& up, Tensor out);
  // Ones of `cols` f32, the weight of the norms the GEMVs stand in for.
  const float* unit_norm(int64_t cols);

  CudaDevice& dev_;
  const CudaConfig& cfg_;
  LtMatmul lt_;
  DeviceBuffer gated_product_;     // an interleaved pair's [T, 2I] product, up to 256 rows
  DeviceBuffer split_k_partials_;  // matmul_add_rmsnorm's two f32 halves
  DeviceBuffer stacked_qkv_;       // qkv_rope_kv_write's stacked q/k/v product
  DeviceBuffer norm_scales_;       // GemvNorm::scales for up to 16 rows
  DeviceBuffer unit_norm_;         // unit_norm's ones
  DeviceBuffer norm_copy_;         // normalized's copy
  DeviceBuffer dequantized_;       // packed_matmul's bf16 matrix
  // prepare_rope_angles' table [tokens, rope_dim / 2] of (cos, sin), and what it was made for.
  DeviceBuffer rope_angles_;
  struct RopeAnglesFor {
    const int32_t* positions = nullptr;
    const float* inv_freq = nullptr;
    int64_t tokens = 0;
    int rope_dim = 0;
    bool operator==(const RopeAnglesFor&) const = default;
  } rope_angles_for_;
  int64_t cutlass_gemm_calls_ = 0, cutlass_epilogue_calls_ = 0, stacked_qkv_calls_ = 0, elided_norms_ = 0;
  int64_t packed_gemv_calls_ = 0, dequantized_gemm_calls_ = 0;
};

}  // namespace serval::cuda
