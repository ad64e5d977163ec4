#pragma once
// The CUDA backend: activations, weight matrices and KV cache in one dtype,
// bf16 (the default) or f32 (--dtype float32: slower, for results that follow
// the CPU backend token for token), f32 accumulation everywhere (never TF32);
// 1-D weights (norms, biases) stay f32. GEMMs go through cuBLASLt (bf16 decode
// shapes through our GEMV up to 16 rows, and CUTLASS's Hopper GEMM at 17..64,
// cuda_cutlass_*.cu), everything else is our own kernels. All work runs
// on one stream; copy_to_host(), tensor_to_host() and synchronize() wait for it.
// In batch-invariant mode only our own kernels run (set_batch_invariant).
// Which kernels and fusions the ops choose follows the CudaTuning it is made
// with (runtime/cuda_tuning.h).
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <map>
#include <memory>
#include <tuple>
#include <type_traits>
#include <vector>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_cutlass_gemm.h"
#include "backend/cuda/cuda_decode_matmul.h"
#include "backend/cuda/cuda_gemm_shape.h"
#include "backend/cuda/cuda_gemm_search_cache.h"
#include "backend/cuda/cuda_stats.h"
#include "runtime/backend.h"
#include "runtime/cuda_tuning.h"

namespace serval::cuda {

template <typename Elem>
struct AttnParamsT;  // cuda_attention.cuh
using AttnParams = AttnParamsT<bf16>;

// A weight on the GPU: matrices in the backend's activation dtype, vectors f32.
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

 private:
  DType dtype_;
  DeviceBuffer buf_;
  const void* group_;
  bool unit_ = false;
  bool interleaved_ = false;
};

const CudaWeight& as_cuda(const DeviceWeight& w);

class CudaBackend : public Backend {
 public:
  // `act_dtype`: BF16 or F32, for activations, weight matrices and the KV
  // cache. cutlass_gemm is on only where the build has CUTLASS.
  explicit CudaBackend(int device, DType act_dtype = DType::BF16, const CudaTuning& tuning = {});
  ~CudaBackend() override;

  std::string name() const override { return "cuda"; }
  DType act_dtype() const override { return act_dtype_; }
  DType kv_dtype() const override { return act_dtype_; }
  // Batch-invariant mode (bf16 only): every matmul through the GEMV, in
  // groups of 16 rows beyond 16 (gemv_any_rows_fits), or rowwise_matmul for
  // rows the GEMV cannot read; every attention row,
  // decode rows too, through the prefill kernels, whose keys run in fixed
  // tiles from position 0 (no split-KV, no stream kernel).
  void set_batch_invariant(bool on) override;
  void set_gemm_search(bool on, const std::string& cache_file) override;
  // Shapes the wide search has tuned, and shapes whose configuration came
  // from its cache file instead (set_gemm_search).
  int64_t gemm_searches() const { return gemm_searches_; }
  int64_t gemm_search_cache_hits() const { return gemm_search_cache_hits_; }

  DeviceBuffer alloc(int64_t bytes) override;
  void copy_to_device(void* dst, const void* src, int64_t bytes) override;
  void copy_to_host(void* dst, const void* src, int64_t bytes) override;
  void tensor_to_host(const Tensor& t, float* dst) override;
  void synchronize() override;
  void copy_to_device_async(void* dst, const void* src, int64_t bytes) override;
  void memory_info(int64_t& free_bytes, int64_t& total_bytes) override;
  bool has_device_memory() const override { return true; }

  bool supports_graphs() const override { return true; }
  int64_t graph_epoch() const override { return scratch_epoch_; }
  void begin_capture() override;
  std::unique_ptr<DeviceGraph> end_capture() override;

  std::unique_ptr<DeviceWeight> upload_weight(const TensorView& view) override;
  std::vector<std::unique_ptr<DeviceWeight>> upload_weight_group(const std::vector<TensorView>& views) override;
  // Interleaved (cuda_gate_up_layout.cuh) where CudaTuning::gate_up_interleaved
  // is on, bf16 and the rows a multiple of 8, so that CUTLASS's epilogue
  // computes silu(gate) * up; else upload_weight_group.
  std::vector<std::unique_ptr<DeviceWeight>> upload_gated_pair(const TensorView& gate, const TensorView& up) override;
  // bf16: the GEMV's and CUTLASS's rope epilogues rotate adjacent pairs only.
  bool prefers_interleaved_rope() const override { return act_dtype_ == DType::BF16; }
  KvLayer alloc_kv_layer(const KvGeometry& geom) override;
  // bf16 only (cuda_norm_fold.cu).
  bool folds_norm_weights() const override;
  void fold_norm_weight(const DeviceWeight& norm, const std::vector<DeviceWeight*>& ws) override;

  void embedding(const DeviceWeight& table, const int32_t* ids, const TokenFeed& feed, Tensor out) override;
  void matmul(const Tensor& x, const DeviceWeight& w, const DeviceWeight* bias, Tensor y) override;
  void qkv_rope_kv_write(const Tensor& x, const DeviceWeight& wq, const DeviceWeight& wk, const DeviceWeight& wv,
                         Tensor q, Tensor k, Tensor v, const int32_t* positions, const RopeParams& rope,
                         const int64_t* slot_mapping, const KvLayer& kv, const KvGeometry& geom) override;
  void matmul_multi(const Tensor& x, const std::vector<const DeviceWeight*>& ws,
                    const std::vector<Tensor>& ys) override;
  void rmsnorm(const Tensor& x, const DeviceWeight& w, float eps, Tensor out) override;
  void add_rmsnorm(Tensor residual, const Tensor& delta, const DeviceWeight& w, float eps, Tensor out) override;
  void matmul_add_rmsnorm(const Tensor& x, const DeviceWeight& w, Tensor proj, Tensor residual,
                          const DeviceWeight& norm, float eps, Tensor out) override;
  void add(Tensor x, const Tensor& delta) override;
  void rope(Tensor q, Tensor k, const int32_t* positions, const RopeParams& rope) override;
  // Where the step's q/k/v product will rotate in CUTLASS's epilogue
  // (cutlass_qkv_rope_kv_write): the (cos, sin) table it reads, for all layers.
  void prepare_rope_angles(const int32_t* positions, int64_t tokens, const RopeParams& rope) override;
  void rope_kv_write(Tensor q, Tensor k, const Tensor& v, const int32_t* positions, const RopeParams& rope,
                     const int64_t* slot_mapping, const KvLayer& kv, const KvGeometry& geom) override;
  void copy_kv_block(const KvLayer& kv, const KvGeometry& geom, int64_t src, int64_t dst) override;
  void kv_write(const Tensor& k, const Tensor& v, const int64_t* slot_mapping, const KvLayer& kv,
                const KvGeometry& geom) override;
  void paged_attention(const Tensor& q, const KvLayer& kv, const KvGeometry& geom, const BatchView& batch,
                       int32_t num_heads, float scale, Tensor out) override;
  // In a step of decodes only whose projection leaves the rope to a kernel
  // after it (17 rows and up, or NeoX rope): the projection, then the split
  // decode kernel rotates q and k and writes the new K/V itself
  // (AttnRopeFold), one kernel fewer per layer, the same bits. Where:
  // CudaTuning::rope_in_attn (by default at CUTLASS's rows that its rope
  // epilogue does not take, 33-64: elsewhere the epilogue, or the rope
  // kernel at 256 rows, measured faster).
  void qkv_attention(const Tensor& x, const DeviceWeight& wq, const DeviceWeight& wk, const DeviceWeight& wv,
                     Tensor q, Tensor k, Tensor v, const RopeParams& rope, const KvLayer& kv, const KvGeometry& geom,
                     const BatchView& batch, int32_t num_heads, float scale, Tensor out) override;
  void silu_mul(const Tensor& gate, const Tensor& up, Tensor out) override;
  void gated_mlp_up(const Tensor& x, const DeviceWeight& gate, const DeviceWeight& up, Tensor gate_buf,
                    Tensor up_buf, Tensor out) override;
  void gather_rows(const Tensor& x, const int32_t* rows, Tensor out) override;
  void sample(const Tensor& logits, std::span<const SampleSpec> specs, std::vector<SampleResult>& out) override;
  void start_sample(const Tensor& logits, std::span<const SampleSpec> specs) override;
  void finish_sample(std::vector<SampleResult>& out) override;
  const int32_t* sampled_tokens() override;
  bool queues_work_async() const override { return true; }
  int started_samples() const override;
  bool sample_ready() const override;
  // The sampler counts fed tokens (Task::fed_source), so async scheduling
  // continues penalized rows. CudaTuning::fed_penalties off leaves them to
  // Scheduler::schedule() instead (for A/B runs and that path's tests).
  bool counts_fed_tokens() const override { return tuning_.fed_penalties; }

  const CudaTuning& tuning() const { return tuning_; }

  cudaStream_t stream() const { return stream_; }
  // cuBLASLt launches that computed several weights as one strided batch.
  int64_t batched_gemm_calls() const { return batched_gemm_calls_; }
  // q/k/v projections computed as one GEMM of their stacked weights (qkv_rope_kv_write).
  int64_t stacked_qkv_calls() const { return stacked_qkv_calls_; }
  int64_t elided_norms() const { return elided_norms_; }
  void set_cutlass_gemm(bool on) { tuning_.cutlass_gemm = on && cutlass_gemm_built(); }
  // Products that CUTLASS's decode GEMM computed (cuda_cutlass_gemm.cu).
  int64_t cutlass_gemm_calls() const { return cutlass_gemm_calls_; }
  void set_cutlass_rope_epilogue(bool on) { tuning_.cutlass_rope_rows = on ? int(kCutlassMaxRows) : 0; }
  void set_interleaved_gate_up(bool on) { tuning_.gate_up_interleaved = on; }
  // CUTLASS products that finished their outputs in the epilogue (cuda_cutlass_qkv_rope.cu).
  int64_t cutlass_epilogue_calls() const { return cutlass_epilogue_calls_; }
  void set_attention_stream(AttentionStream mode) { tuning_.attn_stream = mode; }
  void set_rope_in_attention(bool on) {
    tuning_.rope_in_attn = on ? CudaTuning::RopeInAttn::kOn : CudaTuning::RopeInAttn::kOff;
  }
  // Decode attention launches that rotated q and wrote the new K/V themselves.
  int64_t rope_folded_attention_calls() const { return rope_folded_attention_calls_; }
  // Decode attention launches that the stream kernel served.
  int64_t stream_attention_calls() const { return stream_attention_calls_; }
  int num_sms() const { return num_sms_; }

 private:
  struct MatmulPlan {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
    bool tuned = false;  // algo chosen by timing (cuda_lt_matmul.cu), not just the heuristic's first
  };
  DType weight_target(const TensorView& view, int64_t& n) const;
  void upload_into(const TensorView& view, DType target, int64_t n, void* dst);
  MatmulPlan& matmul_plan(const GemmShape& s);
  void tune_matmul(MatmulPlan& p, const GemmShape& s, const void* w, const void* x, void* y);
  // One product through cuBLASLt (cuda_lt_matmul.cu).
  void lt_matmul(const GemmShape& s, const void* w, const void* x, void* y);
  // One product: CUTLASS's decode GEMM where it takes it (bf16, cutlass_rows),
  // else cuBLASLt (cuda_matmul.cu).
  void gemm(const GemmShape& s, const void* w, const void* x, void* y);
  bool cutlass_rows(int64_t rows) const;
  // Whether the q/k/v product of `rows` rows takes rope and the KV write in
  // CUTLASS's epilogue (cuda_matmul.cu).
  bool cutlass_rope_rows(int64_t rows) const { return cutlass_rows(rows) && rows <= tuning_.cutlass_rope_rows; }
  void flush_l2();  // tune_matmul times candidates with a cold L2
  class LtRunTimer;  // runs and times one plan's candidates (cuda_lt_matmul.cu)
  bool searched_before(const MatmulPlan& p, bool y_f32, const GemmSearchCache::Key& key,
                       cublasLtMatmulAlgo_t& algo) const;
  bool own_kernel_fits(const Tensor& x) const;
  // The GEMV for x @ W^T (own_kernel_fits).
  void own_matmul(const Tensor& x, const bf16* const* ws, const Tensor* ys, int n);
  void own_matmul_gated(const Tensor& x, const bf16* gate, const bf16* up, Tensor out);
  // gated_mlp_up of an interleaved pair (cuda_matmul.cu).
  void interleaved_gated_mlp_up(const Tensor& x, const CudaWeight& gate, const CudaWeight& up, Tensor up_buf,
                                Tensor out);
  // out [T, I] = silu(gate) * up of an interleaved pair's product [T, 2I] (cuda_elementwise.cu).
  void silu_mul_interleaved(const void* product, Tensor out);
  // Whether qkv_rope_kv_write's GEMV rotates and writes K/V in its epilogue.
  bool gemv_rope_fits(const Tensor& x, const CudaWeight& cq, const CudaWeight& ck, const CudaWeight& cv,
                      const Tensor& q, const Tensor& k, const Tensor& v, const RopeParams& rope,
                      const KvGeometry& geom) const;
  // qkv_rope_kv_write as one GEMM of the stacked q/k/v weights (cuda_matmul.cu).
  bool stacked_qkv_fits(const Tensor& x, const CudaWeight& wq, const CudaWeight& wk, const CudaWeight& wv,
                        const Tensor& q, const RopeParams& rope, const KvGeometry& geom) const;
  // The stacked product [T, q + 2 kv] (in scratch until the next call).
  const bf16* stacked_qkv(const Tensor& x, const CudaWeight& wq, const CudaWeight& wk, const CudaWeight& wv);
  // The stacked product with rope and the KV write in CUTLASS's epilogue
  // (cuda_cutlass_qkv_rope.cu); false, having launched nothing, where it does not take them.
  bool cutlass_qkv_rope_kv_write(const Tensor& x, const CudaWeight& wq, const CudaWeight& wk, Tensor q,
                                 const int32_t* positions, const RopeParams& rope, const int64_t* slot_mapping,
                                 const KvLayer& kv, const KvGeometry& geom);
  void stacked_qkv_rope_kv_write(const Tensor& x, const CudaWeight& wq, const CudaWeight& wk, const CudaWeight& wv,
                                 Tensor q, const int32_t* positions, const RopeParams& rope,
                                 const int64_t* slot_mapping, const KvLayer& kv, const KvGeometry& geom);
  // rope_kv_write whose q, k and v rows come from one stacked [T, row] product
  // (q at column 0, k at k_col, v at v_col; bf16); rotated q goes to q.
  void rope_kv_write_from_stacked(const void* qkv, int64_t row, int64_t k_col, int64_t v_col, Tensor q,
                                  int64_t kv_cols, const int32_t* positions, const RopeParams& rope,
                                  const int64_t* slot_mapping, const KvLayer& kv, const KvGeometry& geom);
  // Device scratch of at least `bytes` (grown, never shrunk; contents not
  // kept) for ops that graphs may record: growing it drops recorded graphs
  // (graph_epoch). host_op_scratch: the same for ops never recorded (sample()).
  void* scratch(DeviceBuffer& buf, int64_t bytes);
  // Waits for the stream; every copy_to_device_async before it has landed.
  void sync_stream();
  // The device array sampled_tokens() returns, holding at least n tokens.
  int32_t* sampled_token_buffer(int64_t n);
  // The norm matmul_add_rmsnorm leaves to the GEMV after it (cuda_norm_fold.cu):
  // `data` holds the residual in bf16, unnormalized, and the GEMVs that read
  // it scale their products by its rows' 1 / rms. Shared with the deleters of
  // alloc()'s buffers: freeing the memory under it forgets it, so that it
  // never refers to memory that is gone (or has been handed out again).
  struct PendingNorm {
    const void* data = nullptr;
    int64_t bytes = 0;
    int cols = 0;
    float eps = 0;
    bool scales_written = false;  // norm_scales_ holds its rows' scales (over 4 rows)
    bool overlaps(const void* p, int64_t n) const {
      const char *a = static_cast<const char*>(data), *b = static_cast<const char*>(p);
      return a != nullptr && b != nullptr && a < b + n && b < a + bytes;
    }
  };
  bool elide_norm(const Tensor& x, const CudaWeight& w, const Tensor& residual, const CudaWeight& norm,
                  const Tensor& out) const;
  void produce_norm(const Tensor& x, const CudaWeight& w, Tensor residual, float eps, Tensor out);
  // The GemvNorm for a GEMV reading x: kConsume when x holds a pending norm
  // that the GEMV takes (up to 16 rows, not batch-invariant), else kNone after settle(x).
  GemvNorm consume_norm(const Tensor& x);
  // Before an op that reads t: a pending norm in it is applied in place.
  void settle(const void* data, int64_t bytes);
  void settle(const Tensor& t) { settle(t.data, dtype_bytes(t.dtype, t.numel())); }
  // After an op that writes t: a pending norm there is gone.
  void overwritten(const Tensor& t);
  void* host_op_scratch(DeviceBuffer& buf, int64_t bytes);
  // paged_attention's bf16 decode plan (split count, stream kernel or not,
  // scratch), and the launch of the planned kernels (cuda_attention.cu).
  void plan_attention(AttnParams& p, const BatchView& b);
  void launch_attention(const AttnParams& p, const BatchView& b);
  bool rope_in_attention_fits(const Tensor& x, const Tensor& q, const RopeParams& rope, const KvGeometry& geom,
                              const BatchView& b) const;

  // How our kernels and CUTLASS's launch on stream_ (tuning_'s pdl, gemv_sms and cutlass_*).
  Launch launch_on() const;
  CutlassLaunch cutlass_on() const;

  int device_ = 0;
  DType act_dtype_ = DType::BF16;
  CudaTuning tuning_;
  int num_sms_ = 0;
  cudaStream_t stream_ = nullptr;
  cublasLtHandle_t lt_ = nullptr;
  DeviceBuffer lt_workspace_;
  DeviceBuffer l2_flush_;  // flush_l2's, allocated at the first tuning
  std::map<GemmShape::Key, MatmulPlan> plans_;  // by shape
  // Timed algorithms by the shape with the token count's bucket for n.
  std::map<GemmShape::Key, cublasLtMatmulAlgo_t> tuned_algos_;
  int64_t batched_gemm_calls_ = 0;
  int64_t cutlass_gemm_calls_ = 0;
  DeviceBuffer gated_product_;  // gated_mlp_up's [T, 2I] product of an interleaved pair, up to 256 rows
  int64_t cutlass_epilogue_calls_ = 0;
  bool gemm_search_ = false;  // set_gemm_search: tune_matmul's wide search (cuda_matmul_search.cu)
  std::unique_ptr<GemmSearchCache> gemm_search_cache_;  // its results across runs, if a file was given
  int64_t gemm_searches_ = 0, gemm_search_cache_hits_ = 0;
  bool batch_invariant_ = false;
  DeviceBuffer split_k_partials_;  // matmul_add_rmsnorm's two f32 halves
  std::shared_ptr<PendingNorm> pending_norm_ = std::make_shared<PendingNorm>();
  DeviceBuffer norm_scales_;  // GemvNorm::scales for up to 16 rows
  std::unique_ptr<DeviceWeight> unit_norm_;  // ones, for settle
  int64_t elided_norms_ = 0;
  DeviceBuffer stacked_qkv_;       // qkv_rope_kv_write's stacked q/k/v product
  // prepare_rope_angles' table [tokens, rope_dim / 2] of (cos, sin), and what it was made for.
  DeviceBuffer rope_angles_;
  struct RopeAnglesFor {
    const int32_t* positions = nullptr;
    const float* inv_freq = nullptr;
    int64_t tokens = 0;
    int rope_dim = 0;
    bool operator==(const RopeAnglesFor&) const = default;
  } rope_angles_for_;
  int64_t stacked_qkv_calls_ = 0;
  DeviceBuffer attn_partials_;  // split-KV decode: per-split outputs and (max, sum)
  DeviceBuffer attn_piece_ready_;  // stream decode: per-warp flags, zero between launches
  DeviceBuffer attn_merge_count_;  // split-KV decode: arrival counters, zero between launches
  int64_t stream_attention_calls_ = 0;
  int64_t rope_folded_attention_calls_ = 0;
  bool capturing_ = false;      // inside begin_capture() .. end_capture()
  int64_t scratch_epoch_ = 0;   // scratch reallocations so far (graph_epoch)
  void* host_staging_ = nullptr;  // pinned, for tensor_to_host
  int64_t host_staging_bytes_ = 0;
  // copy_to_device_async's pinned arena: each copy takes the next piece, and a
  // wait for the stream (sync_stream) frees them all.
  char* upload_arena_ = nullptr;
  int64_t upload_arena_bytes_ = 0, upload_arena_used_ = 0;
  std::shared_ptr<void> sampler_state_;  // the GPU sampler's buffers (cuda_sampling.cu)
};

inline bf16* bf(const Tensor& t) { return static_cast<bf16*>(t.data); }

// The backend of cuda_stats.h's functions, which must be the CUDA one.
template <typename B>
auto& cuda_backend_of(B& be, const char* caller) {
  using Cuda = std::conditional_t<std::is_const_v<B>, const CudaBackend, CudaBackend>;
  auto* cuda = dynamic_cast<Cuda*>(&be);
  SERVAL_CHECK(cuda != nullptr, caller, ": the ", be.name(), " backend is not the CUDA backend");
  return *cuda;
}

}  // namespace serval::cuda
