#pragma once
// The CUDA backend: activations, weight matrices and KV cache in one dtype,
// bf16 (the default) or f32 (--dtype float32: slower, for results that follow
// the CPU backend token for token), f32 accumulation everywhere (never TF32);
// 1-D weights (norms, biases) stay f32. All work runs on one device's one
// stream; copy_to_host(), tensor_to_host() and synchronize() wait for it.
//
// It answers the Backend interface from parts with one job each:
//  - CudaDevice: the GPU (an option: cuda:N), memory, copies, scratch, graphs;
//  - CudaMatmul: which kernel computes a product (GEMV, CUTLASS, cuBLASLt:
//    LtMatmul) and the matmul ops with fused epilogues;
//  - CudaAttention: paged attention's plan and launches;
//  - CudaSampler: sampling on the device.
// What is left here: weight upload, the KV pools, the elementwise, norm and
// rope ops (cuda_elementwise.cu, cuda_rope.cu, cuda_kv_write.cu) and
// qkv_attention, which composes a product with attention.
// Which kernels and fusions the parts choose follows the CudaTuning it is
// made with (runtime/cuda_tuning.h); in batch-invariant mode only our own
// kernels run (set_batch_invariant).
#include <memory>
#include <type_traits>
#include <vector>

#include "backend/cuda/cuda_attention.h"
#include "backend/cuda/cuda_attention_codes.h"
#include "backend/cuda/cuda_config.h"
#include "backend/cuda/cuda_device.h"
#include "backend/cuda/cuda_matmul.h"
#include "backend/cuda/cuda_sampler.h"
#include "backend/cuda/cuda_tensor.h"
#include "backend/cuda/cuda_weight.h"
#include "kv/kv_quant.h"
#include "runtime/backend.h"

namespace serval::cuda {

class CudaBackend : public Backend {
 public:
  // `device`: the GPU's index. `act_dtype`: BF16 or F32, for activations,
  // weight matrices and the KV cache.
  CudaBackend(int device, DType act_dtype = DType::BF16, const CudaTuning& tuning = {});
  ~CudaBackend() override;

  std::string name() const override { return "cuda"; }
  DType act_dtype() const override { return cfg_.act_dtype; }
  DType kv_dtype() const override { return kv_dtype_; }
  // The activation dtype, or fp8 / int8 codes with per-head scales: written
  // by kv_write (the fused rope + KV-write epilogues step aside) and read by
  // attention_over_codes (cuda_attention_codes.h), not the tensor-core kernels.
  void set_kv_dtype(DType t) override;
  // Batch-invariant mode (bf16 only): every matmul through the GEMV, in
  // groups of 16 rows beyond 16 (gemv_any_rows_fits), or rowwise_matmul for
  // rows the GEMV cannot read; every attention row, decode rows too, through
  // the prefill kernels, whose keys run in fixed tiles from position 0 (no
  // split-KV, no stream kernel).
  void set_batch_invariant(bool on) override;
  void set_gemm_search(bool on, const std::string& cache_file) override {
    dev_.bind();
    matmul_.lt().set_search(on, cache_file);
  }

  DeviceBuffer alloc(int64_t bytes) override { return dev_.alloc(bytes); }
  void copy_to_device(void* dst, const void* src, int64_t bytes) override { dev_.copy_to_device(dst, src, bytes); }
  void copy_to_host(void* dst, const void* src, int64_t bytes) override { dev_.copy_to_host(dst, src, bytes); }
  void tensor_to_host(const Tensor& t, float* dst) override { dev_.tensor_to_host(t, dst); }
  void synchronize() override { dev_.synchronize(); }
  void copy_to_device_async(void* dst, const void* src, int64_t bytes) override {
    dev_.copy_to_device_async(dst, src, bytes);
  }
  void memory_info(int64_t& free_bytes, int64_t& total_bytes) override { dev_.memory_info(free_bytes, total_bytes); }
  bool has_device_memory() const override { return true; }

  bool supports_graphs() const override { return true; }
  int64_t graph_epoch() const override { return dev_.graph_epoch(); }
  void begin_capture() override { dev_.begin_capture(); }
  std::unique_ptr<DeviceGraph> end_capture() override { return dev_.end_capture(); }

  std::unique_ptr<DeviceWeight> upload_weight(const TensorView& view) override;
  // GGUF Q4_0, Q8_0, Q4_1, Q4_K, Q5_K, int4 g32/64/128 and int8 per channel
  // matrices with bf16 activations: packed at their size
  // (backend/gpu_block_pack.h) for the quantized GEMV where
  // CudaTuning::packed_blocks is on, or auto and the runner asks for it.
  bool keeps_linear_format(const LinearFormat& format) const override;
  bool chooses_kept_formats() const override {
    return cfg_.tuning.packed_blocks == CudaTuning::PackedBlocks::kAuto;
  }
  void keep_linear_formats(bool on) override { keep_blocks_ = on; }
  std::unique_ptr<DeviceWeight> upload_kept_linear(const Linear& w) override;
  int64_t linear_device_bytes(const Linear& w) const override;
  std::vector<std::unique_ptr<DeviceWeight>> upload_weight_group(const std::vector<TensorView>& views) override;
  // Interleaved (cuda_gate_up_layout.cuh) where CudaTuning::gate_up_interleaved
  // is on, bf16 and the rows a multiple of 8, so that CUTLASS's epilogue
  // computes silu(gate) * up; else upload_weight_group.
  std::vector<std::unique_ptr<DeviceWeight>> upload_gated_pair(const TensorView& gate, const TensorView& up) override;
  // bf16: the GEMV's and CUTLASS's rope epilogues rotate adjacent pairs only.
  bool prefers_interleaved_rope() const override { return cfg_.act_dtype == DType::BF16; }
  KvLayer alloc_kv_layer(const KvGeometry& geom) override;
  // bf16 only (cuda_norm_fold.cu).
  bool folds_norm_weights() const override;
  void fold_norm_weight(const DeviceWeight& norm, const std::vector<DeviceWeight*>& ws) override;

  void embedding(const DeviceWeight& table, const int32_t* ids, const TokenFeed& feed, Tensor out) override;
  void matmul(const Tensor& x, const DeviceWeight& w, const DeviceWeight* bias, Tensor y) override;
  void matmul_multi(const Tensor& x, const std::vector<const DeviceWeight*>& ws,
                    const std::vector<Tensor>& ys) override;
  void rmsnorm(const Tensor& x, const DeviceWeight& w, float eps, Tensor out) override;
  void add_rmsnorm(Tensor residual, const Tensor& delta, const DeviceWeight& w, float eps, Tensor out) override;
  NormedRows matmul_add_rmsnorm(const Tensor& x, const DeviceWeight& w, Tensor proj, Tensor residual,
                                const DeviceWeight& norm, float eps, Tensor out) override;
  Tensor finish_norm(NormedRows& x) override;
  void add(Tensor x, const Tensor& delta) override;
  void rope(Tensor q, Tensor k, const int32_t* positions, const RopeParams& rope) override;
  // Where the step's q/k/v product will rotate in CUTLASS's epilogue: the
  // (cos, sin) table it reads, for all layers.
  void prepare_rope_angles(const int32_t* positions, int64_t tokens, const RopeParams& rope) override;
  void rope_kv_write(Tensor q, Tensor k, const Tensor& v, const int32_t* positions, const RopeParams& rope,
                     const int64_t* slot_mapping, const KvLayer& kv, const KvGeometry& geom) override;
  void qkv_rope_kv_write(const NormedRows& x, const DeviceWeight& wq, const DeviceWeight& wk, const DeviceWeight& wv,
                         Tensor q, Tensor k, Tensor v, const int32_t* positions, const RopeParams& rope,
                         const int64_t* slot_mapping, const KvLayer& kv, const KvGeometry& geom) override;
  void copy_kv_block(const KvLayer& kv, const KvGeometry& geom, int64_t src, int64_t dst) override;
  void kv_write(const Tensor& k, const Tensor& v, const int64_t* slot_mapping, const KvLayer& kv,
                const KvGeometry& geom) override;
  void paged_attention(const Tensor& q, const KvLayer& kv, const KvGeometry& geom, const BatchView& batch,
                       int32_t num_heads, float scale, Tensor out) override {
    dev_.bind();
    if (kv_dtype_quantized(geom.dtype)) return attention_over_codes(q, kv, geom, batch, num_heads, scale, out,
                                                                    dev_.stream());
    attention_.paged(q, kv, geom, batch, num_heads, scale, out);
  }
  // In a step of decodes only whose projection leaves the rope to a kernel
  // after it (17 rows and up, or NeoX rope): the projection, then the split
  // decode kernel rotates q and k and writes the new K/V itself
  // (AttnRopeFold), one kernel fewer per layer, the same bits. Where:
  // CudaTuning::rope_in_attn (by default at CUTLASS's rows that its rope
  // epilogue does not take, 33-64: elsewhere the epilogue, or the rope
  // kernel at 256 rows, measured faster).
  void qkv_attention(const NormedRows& x, const DeviceWeight& wq, const DeviceWeight& wk, const DeviceWeight& wv,
                     Tensor q, Tensor k, Tensor v, const RopeParams& rope, const KvLayer& kv, const KvGeometry& geom,
                     const BatchView& batch, int32_t num_heads, float scale, Tensor out) override;
  void silu_mul(const Tensor& gate, const Tensor& up, Tensor out) override;
  void gated_mlp_up(const NormedRows& x, const DeviceWeight& gate, const DeviceWeight& up, Tensor gate_buf,
                    Tensor up_buf, Tensor out) override;
  void gather_rows(const Tensor& x, const int32_t* rows, Tensor out) override;

  void sample(const Tensor& logits, std::span<const SampleSpec> specs, std::vector<SampleResult>& out) override {
    sampler_.sample(logits, specs, out);
  }
  void start_sample(const Tensor& logits, std::span<const SampleSpec> specs) override { sampler_.start(logits, specs); }
  void finish_sample(std::vector<SampleResult>& out) override { sampler_.finish(out); }
  const int32_t* sampled_tokens() override { return sampler_.sampled_tokens(); }
  bool queues_work_async() const override { return true; }
  int started_samples() const override { return sampler_.started(); }
  bool sample_ready() const override { return sampler_.ready(); }
  // The sampler counts fed tokens (Task::fed_source), so async scheduling
  // continues penalized rows. CudaTuning::fed_penalties off leaves them to
  // Scheduler::schedule() instead (for A/B runs and that path's tests).
  bool counts_fed_tokens() const override { return cfg_.tuning.fed_penalties; }

  // The parts, for the counters and tuning setters of cuda_stats.h.
  const CudaConfig& config() const { return cfg_; }
  CudaTuning& tuning() { return cfg_.tuning; }
  const CudaDevice& device() const { return dev_; }
  const CudaMatmul& matmuls() const { return matmul_; }
  const CudaAttention& attention() const { return attention_; }

 private:
  DType weight_target(const TensorView& view, int64_t& n) const;
  void upload_into(const TensorView& view, DType target, int64_t n, void* dst);

  CudaConfig cfg_;
  DType kv_dtype_ = cfg_.act_dtype;  // set_kv_dtype
  bool keep_blocks_;  // keeps_linear_format's answer for the packed formats
  CudaDevice dev_;
  CudaMatmul matmul_;
  CudaAttention attention_;
  CudaSampler sampler_;
};

// The backend of cuda_stats.h's functions, which must be the CUDA one.
template <typename B>
auto& cuda_backend_of(B& be, const char* caller) {
  using Cuda = std::conditional_t<std::is_const_v<B>, const CudaBackend, CudaBackend>;
  auto* cuda = dynamic_cast<Cuda*>(&be);
  SERVAL_CHECK(cuda != nullptr, caller, ": the ", be.name(), " backend is not the CUDA backend");
  return *cuda;
}

}  // namespace serval::cuda
