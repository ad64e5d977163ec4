#pragma once
// Backend: the narrow device interface the model is written against. A backend
// owns device memory and supplies one kernel per op; ModelRunner strings the
// ops together and holds no device-specific code.
//
// Conventions (shared by every backend):
//  - Activations are Tensors: non-owning 2-D views [rows, cols], row-major and
//    contiguous, in the backend's activation dtype (`act_dtype()`: f32 on the
//    CPU, bf16 on CUDA unless created with dtype "float32"). Their memory
//    comes from `alloc()`. The residual stream (the hidden state the layers
//    add into) is f32 on every backend: ops that read or write it (embedding,
//    add_rmsnorm, add, rmsnorm's and gather_rows' input) take f32 tensors
//    there, and rmsnorm writes the activation dtype.
//  - Weights are uploaded once through `upload_weight()` into a backend-specific
//    format (the CPU keeps f32; a GPU may keep bf16/int8/int4 blocks). The model
//    only passes the resulting handles back to ops.
//  - Integer batch metadata (token ids, positions, slot mapping, block tables...)
//    is copied to device memory once per step (BatchView holds device pointers).
//  - Ops are asynchronous with respect to the host on devices that can be (CUDA
//    streams); `copy_to_host()` and `synchronize()` are the only waits. On the CPU
//    every op completes before it returns.
//  - Ops never validate indices: the runner validates the Batch on the host first.
#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "model/kv_spec.h"
#include "model/linear.h"
#include "model/model_config.h"
#include "model/weights.h"
#include "runtime/cuda_tuning.h"
#include "sampling/sampler.h"

namespace serval {

class ModelDef;

// Sees each matmul's input before the product: the calibration of
// `serval quantize --calibration` (runtime/activation_recorder.h). `x` is
// [rows, cols] f32 host memory, valid during the call.
class MatmulObserver {
 public:
  virtual ~MatmulObserver() = default;
  virtual void on_matmul_input(const std::string& weight, const float* x, int64_t rows, int64_t cols) = 0;
};

// Device memory owned by a backend; freed when the last copy goes away.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(std::shared_ptr<void> mem, int64_t bytes) : mem_(std::move(mem)), bytes_(bytes) {}
  void* data() const { return mem_.get(); }
  int64_t bytes() const { return bytes_; }
  // Bytes [offset, offset + bytes) of this buffer, keeping all of it alive.
  DeviceBuffer slice(int64_t offset, int64_t bytes) const;

 private:
  std::shared_ptr<void> mem_;
  int64_t bytes_ = 0;
};

// A non-owning view of a contiguous, row-major [rows, cols] tensor in device memory.
struct Tensor {
  void* data = nullptr;
  DType dtype = DType::F32;
  int64_t rows = 0;
  int64_t cols = 0;

  int64_t numel() const { return rows * cols; }
  // Rows [start, start + n) of this tensor.
  Tensor rows_view(int64_t start, int64_t n) const {
    return {static_cast<char*>(data) + dtype_bytes(dtype, start * cols), dtype, n, cols};
  }
  // The same memory seen as [numel / new_cols, new_cols] (e.g. [T, H * D] as [T * H, D]).
  Tensor reshaped(int64_t new_cols) const { return {data, dtype, numel() / new_cols, new_cols}; }
};

// The input of the matmuls after an RMSNorm whose weight those matmuls hold
// folded (Backend::fold_norm_weight): `rows` normalized, or, where
// matmul_add_rmsnorm left the norm to them (`deferred`), the rows before the
// norm (each to be scaled by its 1 / rms, eps as given). Only the ops that
// take a NormedRows read a deferred one; Backend::finish_norm normalizes it
// in place for any other reader. A Tensor converts to a normalized one.
struct NormedRows {
  NormedRows(const Tensor& t) : rows(t) {}  // NOLINT: implicit, the common case
  NormedRows(const Tensor& t, float eps_, bool deferred_) : rows(t), eps(eps_), deferred(deferred_) {}
  Tensor rows;
  float eps = 0;
  bool deferred = false;
};

// A weight prepared for one backend. Shape is outermost first: {out, in} for a
// linear layer, {n} for a norm or bias vector, {vocab, hidden} for embeddings.
// A matrix is a Linear on the device: it also says the format the backend
// holds it in and which part of the full matrix it is.
class DeviceWeight {
 public:
  virtual ~DeviceWeight() = default;
  const std::string& name() const { return name_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t rows() const { return shape_.size() == 2 ? shape_[0] : 1; }
  int64_t cols() const { return shape_.back(); }
  const LinearFormat& format() const { return format_; }
  const ShardSpec& shard() const { return shard_; }
  void set_linear_layout(const LinearFormat& format, const ShardSpec& shard) {
    format_ = format;
    shard_ = shard;
  }

 protected:
  std::string name_;
  std::vector<int64_t> shape_;
  LinearFormat format_;
  ShardSpec shard_;
};

// One layer's paged KV cache: K and V pools of [num_blocks, block_size,
// num_kv_heads, head_dim] in the backend's `kv_dtype()`. Quantized pools
// (kv/kv_quant.h) also hold their scales: f32 [2, num_kv_heads], K's then
// V's (value = code * scale), ones until the runner sets them.
struct KvLayer {
  DeviceBuffer k;
  DeviceBuffer v;
  DeviceBuffer scales;  // empty unless kv_dtype_quantized(geom.dtype)
};

// Where one layer's K/V live: the pool's size and its KvLayerSpec. Every op
// that writes or reads the cache takes the layout from here.
struct KvGeometry {
  int64_t num_blocks = 0;
  int32_t block_size = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  DType dtype = DType::F32;  // the pools' elements (Backend::kv_dtype())
  int64_t window = 0;        // sliding window (KvLayerSpec::window); 0: none

  static KvGeometry of(const KvLayerSpec& spec, int64_t num_blocks, int32_t block_size) {
    return {num_blocks, block_size, spec.num_kv_heads, spec.head_dim, spec.dtype, spec.window};
  }
};

// Token ids that a step takes from the sample of the step before it, on the
// device (ModelRunner::start_sample's chained steps): token t is
// sampled[source[t]] where source[t] >= 0. Both device arrays; source null:
// every id is the batch's own.
struct TokenFeed {
  const int32_t* source = nullptr;   // [T], -1: the batch's token_ids[t]
  const int32_t* sampled = nullptr;  // Backend::sampled_tokens()
};

// The integer arrays of a Batch in device memory (see runtime/batch.h for
// their meaning), plus host-side sizes for launching kernels.
struct BatchView {
  const int32_t* token_ids = nullptr;     // [T]
  const int32_t* positions = nullptr;     // [T]
  const int32_t* query_start = nullptr;   // [S + 1]
  const int32_t* context_len = nullptr;   // [S]
  const int32_t* block_table = nullptr;   // [S, max_blocks_per_seq]
  const int64_t* slot_mapping = nullptr;  // [T]
  const int32_t* logits_rows = nullptr;   // [R]
  TokenFeed feed;                         // token ids from the sample before (source null: none)
  int32_t num_tokens = 0;                 // T
  int32_t num_seqs = 0;                   // S
  int32_t num_logits_rows = 0;            // R
  // logits_rows is 0, 1, ..., T - 1 (a decode step): the final norm and the LM
  // head may read every row in place, without a gather.
  bool logits_rows_all = false;
  int32_t max_blocks_per_seq = 0;
  int32_t max_query_len = 0;    // longest run of new tokens of one sequence
  int32_t max_context_len = 0;  // longest context_len
  // Mean context_len, rounded down; under CUDA graphs only a hint: the graph's
  // class (kLongDecodeContext for steps at least that long on average, else 0).
  int32_t mean_context_len = 0;
};

// Decode steps whose sequences average at least this many tokens of context:
// StepGraphs records them apart from shorter ones, and a backend may attend to
// them with other kernels (the CUDA backend streams their K/V).
constexpr int32_t kLongDecodeContext = 2048;

// How to rotate q and k. `inv_freq` holds rope_dim / 2 f32 frequencies in
// device memory (scaling and per-dimension divisors already applied; see
// runtime/rope.h). The angle of pair i at position p is float(p) * inv_freq[i],
// in f32 as Hugging Face computes it. Dimensions from rope_dim up pass through.
struct RopeParams {
  RopeStyle style = RopeStyle::Neox;
  int32_t head_dim = 0;
  int32_t rope_dim = 0;
  const float* inv_freq = nullptr;
};

// One row of logits to sample, with what the sampler needs (the semantics are
// sampling/sampler.h's, on every backend).
struct SampleSpec {
  int32_t row = 0;                              // row of the logits tensor
  const SamplingParams* params = nullptr;
  std::span<const int32_t> prompt_ids, output_ids;  // for the penalties
  std::span<const int32_t> banned;              // logit -inf before anything else
  double uniform = 0.0;                         // the request's draw in [0, 1); unused when greedy
  // >= 0: the sequence has one output token more than output_ids, not on the
  // host yet: the one spec `fed_source` of the start before this one draws
  // (the row's input token, fed on the device: Batch::token_source). The
  // penalties count it. start_sample honours it; sample() takes none.
  int32_t fed_source = -1;
  // >= 0: no draw: the result is this token, with the logprobs
  // params->logprobs asks for (which must be >= 0): a prompt token scored
  // (SamplingParams::prompt_logprobs). Penalties, bans and filters do not
  // apply; the logits must still be valid (no NaN or +inf, not all -inf).
  int32_t forced_token = -1;
  // Empty: every token may be drawn. Else a bitmask over the vocabulary
  // (token i: bit i % 32 of word i / 32, (vocab + 31) / 32 words): tokens
  // whose bit is 0 get -inf, as banned ones (structured output).
  std::span<const uint32_t> allowed;
};

// Specs as a sampler on the host needs them: fed_source -1, and output_ids
// with the fed token (from `latest`, the tokens of the start before)
// appended where penalties read them. Throws when a fed_source names no token
// of `latest`. Without fed sources, specs() is the specs given.
class FedOutputs {
 public:
  FedOutputs(std::span<const SampleSpec> specs, std::span<const int32_t> latest);
  FedOutputs(const FedOutputs&) = delete;  // specs() may point into it
  FedOutputs& operator=(const FedOutputs&) = delete;
  std::span<const SampleSpec> specs() const { return specs_; }

 private:
  std::span<const SampleSpec> specs_;
  std::vector<SampleSpec> resolved_;
  std::vector<std::vector<int32_t>> outputs_;
};

// Samples drawn at once but started (start_sample) and not yet finished,
// oldest first, and the tokens of the latest start (what a chained step's
// Batch::token_source names): the default start_sample / finish_sample of
// Backend and ModelRunner, which compute before they return.
class StartedSamples {
 public:
  // Starts that may be unfinished at once (the step being finished, the next).
  static constexpr int kMax = 2;
  int size() const { return int(queue_.size()); }
  // Throws when kMax starts are unfinished already.
  void push(std::vector<SampleResult> results);
  // The oldest start's results; throws when none is unfinished.
  std::vector<SampleResult> pop();
  const std::vector<int32_t>& latest_tokens() const { return latest_tokens_; }

 private:
  std::deque<std::vector<SampleResult>> queue_;
  std::vector<int32_t> latest_tokens_;
};

// Ops recorded once and replayed (CUDA graphs). Replays read the same device
// memory the capture saw: callers update the contents, never the addresses.
class DeviceGraph {
 public:
  virtual ~DeviceGraph() = default;
  virtual void replay() = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual std::string name() const = 0;
  virtual DType act_dtype() const = 0;
  virtual DType kv_dtype() const = 0;
  // The KV pools' element type from now on (--kv-cache-dtype): act_dtype(),
  // or FP8_E4M3 / I8 (kv/kv_quant.h) where the backend's KV kernels read
  // them. Throws serval::Error for a type it has no kernels for.
  virtual void set_kv_dtype(DType t);
  virtual int threads() const { return 1; }
  // Batch-invariant mode: every op then computes a token's result the same
  // way, bit for bit, whatever else is in its batch (other sequences, how a
  // prompt is chunked, graph padding), so greedy output does not depend on
  // batching; slower. Off by default. Throws where a backend cannot.
  virtual void set_batch_invariant(bool on) = 0;
  // GEMM search: the first use of each small-batch matmul shape times many
  // more of its library's configurations than the default few (seconds per
  // shape, for a few percent of decode throughput); with a cache file, the
  // results are read from it and new ones added, so a later run does not
  // search again (a cache file implies the search). A hint: backends whose
  // matmuls are their own ignore it.
  virtual void set_gemm_search(bool on, const std::string& cache_file) {
    (void)on;
    (void)cache_file;
  }
  // Every matmul hands its input to `observer` (null: none) first. Default:
  // refused; the CPU backend, whose activations are f32 host memory, does it.
  virtual void set_matmul_observer(MatmulObserver* observer);

  // ---- memory ----
  virtual DeviceBuffer alloc(int64_t bytes) = 0;
  virtual void copy_to_device(void* dst, const void* src, int64_t bytes) = 0;
  virtual void copy_to_host(void* dst, const void* src, int64_t bytes) = 0;
  // Copies a tensor into host f32 (converting from the activation dtype).
  virtual void tensor_to_host(const Tensor& t, float* dst) = 0;
  virtual void synchronize() = 0;
  // Whether ops are queued on a device and run later (a GPU stream), rather
  // than computed before the call returns (the CPU).
  virtual bool queues_work_async() const { return false; }
  // copy_to_device in stream order, without waiting for the copy: the bytes are
  // taken from `src` before it returns, so `src` may be reused at once. Per-step
  // metadata goes this way, since each wait costs a round trip to the device
  // while the GPU idles. Default: copy_to_device.
  virtual void copy_to_device_async(void* dst, const void* src, int64_t bytes) { copy_to_device(dst, src, bytes); }
  // Free and total memory of the device in bytes (the CPU: available host memory).
  virtual void memory_info(int64_t& free_bytes, int64_t& total_bytes) = 0;

  // ---- graphs ----
  // Between begin_capture() and end_capture(), ops are recorded, not run; the
  // recorded ops must not allocate, synchronize or copy to the host.
  virtual bool supports_graphs() const { return false; }
  // Changes whenever the backend reallocates memory that recorded graphs may
  // read (its scratch buffers): graphs recorded before then must not replay.
  virtual int64_t graph_epoch() const { return 0; }
  virtual void begin_capture();
  virtual std::unique_ptr<DeviceGraph> end_capture();

  // Whether the backend's memory is a device's own (a GPU's), which the
  // memory plan must budget; false: host memory (the CPU).
  virtual bool has_device_memory() const { return false; }

  // ---- weights ----
  // Converts `view` (any DType of core/dtype.h) into the backend's format.
  virtual std::unique_ptr<DeviceWeight> upload_weight(const TensorView& view) = 0;
  // Whether the matmul ops run weights of `format` as they are stored. A
  // format they do not run goes through the reference composition: the
  // matrix is dequantized once at load (dequantize_linear) and multiplied as
  // a dense one (Backend::upload_linear). Default: dense f32/f16/bf16 and
  // GGUF blocks, which upload_weight converts to the backend's dtype.
  virtual bool runs_linear_format(const LinearFormat& format) const {
    return format.kind == LinearFormat::Kind::Dense || format.kind == LinearFormat::Kind::GgufBlock;
  }
  // Whether the backend holds weights of `format` as they are stored (at
  // their size, for kernels that read that format) rather than converted to
  // its dtype; such weights go up through upload_kept_linear. Default: none.
  virtual bool keeps_linear_format(const LinearFormat&) const { return false; }
  // Whether keeping is the runner's choice (the CPU's always, the GPU's under
  // CudaTuning::packed_blocks auto): it then calls keep_linear_formats(true)
  // where the weights converted to the backend's dtype would take more than
  // half the memory the weights may use. keep_linear_formats sets
  // keeps_linear_format's answer for the formats the backend can keep.
  // Defaults: no choice, nothing kept.
  virtual bool chooses_kept_formats() const { return false; }
  virtual void keep_linear_formats(bool) {}
  // `w` uploaded in its own format (keeps_linear_format). Default: throws.
  virtual std::unique_ptr<DeviceWeight> upload_kept_linear(const Linear& w);
  // Bytes `w` takes once uploaded. Default: dense in the activation dtype.
  virtual int64_t linear_device_bytes(const Linear& w) const { return dtype_bytes(act_dtype(), w.out * w.in); }
  // Weights that ops read together (q/k/v, gate/up): a backend may place them
  // back to back in one allocation, in order, so that one batched matrix
  // product reads several of them. Default: upload_weight for each.
  virtual std::vector<std::unique_ptr<DeviceWeight>> upload_weight_group(const std::vector<TensorView>& views);
  // The gate and up matrices of one gated MLP ([I, H] each), which only
  // gated_mlp_up reads (and fold_norm_weight may scale): a backend may lay
  // them out as its fused kernels read them best. Default: upload_weight_group.
  virtual std::vector<std::unique_ptr<DeviceWeight>> upload_gated_pair(const TensorView& gate, const TensorView& up) {
    return upload_weight_group({gate, up});
  }
  // Allocates one layer's K and V pools.
  virtual KvLayer alloc_kv_layer(const KvGeometry& geom) = 0;
  // Whether the runner should fold each RMSNorm's weight into the matrices
  // that read the norm's output (fold_norm_weight) and run those norms with a
  // weight of ones, which a backend may then fuse into the matmuls around
  // them. Default: no.
  virtual bool folds_norm_weights() const { return false; }
  // Whether a model whose RoPE rotates rows (i, i + r/2) (RopeStyle::Neox:
  // Hugging Face checkpoints, qwen GGUFs) should have its q/k rows permuted
  // to adjacent pairs (model/qk_permute.h) when loaded: a backend whose fused
  // rope kernels take only those. Default: no.
  virtual bool prefers_interleaved_rope() const { return false; }
  // W := W diag(norm) for each matrix W of `ws` (column c times norm[c]), so
  // that rmsnorm(x) @ W^T equals (rmsnorm(x) * norm) @ W'^T, up to rounding.
  // Default: throws (called only when folds_norm_weights()).
  virtual void fold_norm_weight(const DeviceWeight& norm, const std::vector<DeviceWeight*>& ws);

  // ---- ops ----
  // out[t, :] = table[id(t), :] for t < out.rows, where id(t) is ids[t], or,
  // when feed.source is set and feed.source[t] >= 0, feed.sampled[feed.source[t]]
  // (a token sampled on the device by the step before; one that failed to
  // sample reads row 0).
  virtual void embedding(const DeviceWeight& table, const int32_t* ids, const TokenFeed& feed, Tensor out) = 0;
  // y = x @ W^T (+ bias if non-null); x [T, in], W {out, in}, y [T, out]. y is in the
  // activation dtype, or f32 without a bias (the LM head writes f32 logits).
  virtual void matmul(const Tensor& x, const DeviceWeight& w, const DeviceWeight* bias, Tensor y) = 0;
  // ys[i] = x @ ws[i]^T, no bias: projections of the same input (q/k/v,
  // gate/up), which a backend may compute in one kernel. Default: one by one.
  virtual void matmul_multi(const Tensor& x, const std::vector<const DeviceWeight*>& ws,
                            const std::vector<Tensor>& ys) {
    for (size_t i = 0; i < ws.size(); ++i) matmul(x, *ws[i], nullptr, ys[i]);
  }
  // out = rmsnorm(x) * w, row by row; out may alias x. w has x.cols entries
  // (per-head norm: pass x.reshaped(head_dim)).
  virtual void rmsnorm(const Tensor& x, const DeviceWeight& w, float eps, Tensor out) = 0;
  // residual += delta; then out = rmsnorm(residual) * w.
  virtual void add_rmsnorm(Tensor residual, const Tensor& delta, const DeviceWeight& w, float eps,
                           Tensor out) = 0;
  // residual += x @ w^T (rounded to the activation dtype, as matmul's y);
  // then out = rmsnorm(residual) * norm: a projection back into the residual
  // stream and the norm after it, which a backend may fuse (e.g. split the
  // product's k and sum the parts in the norm). `proj` is scratch of
  // [x.rows, w.rows] in the activation dtype. Returns out, whose norm a
  // backend may leave to the matmuls that read it (NormedRows::deferred) where
  // `norm` is a weight of ones. Default: matmul, add_rmsnorm.
  [[nodiscard]] virtual NormedRows matmul_add_rmsnorm(const Tensor& x, const DeviceWeight& w, Tensor proj,
                                                      Tensor residual, const DeviceWeight& norm, float eps,
                                                      Tensor out) {
    matmul(x, w, nullptr, proj);
    add_rmsnorm(residual, proj, norm, eps, out);
    return out;
  }
  // x's rows normalized in place if their norm was deferred (x is then no
  // longer deferred); returns them.
  virtual Tensor finish_norm(NormedRows& x);
  // x += delta.
  virtual void add(Tensor x, const Tensor& delta) = 0;
  // Once per forward, before its first layer: the step's positions, the same
  // for every layer's rope. A backend may compute the cos/sin of each (token,
  // frequency) here once, for all layers; the positions must then stay as
  // they are until the forward's last rope. Default: nothing.
  virtual void prepare_rope_angles(const int32_t* positions, int64_t tokens, const RopeParams& rope) {
    (void)positions, (void)tokens, (void)rope;
  }
  // Rotates q [T, num_heads * head_dim] and k [T, num_kv_heads * head_dim] in place
  // at positions[t].
  virtual void rope(Tensor q, Tensor k, const int32_t* positions, const RopeParams& rope) = 0;
  // rope(q, k) then kv_write(k, v): one kernel on devices where that saves a
  // pass over k. Default: the two ops.
  virtual void rope_kv_write(Tensor q, Tensor k, const Tensor& v, const int32_t* positions, const RopeParams& rope,
                             const int64_t* slot_mapping, const KvLayer& kv, const KvGeometry& geom) {
    this->rope(q, k, positions, rope);
    kv_write(k, v, slot_mapping, kv, geom);
  }
  // q/k/v = x @ wq/wk/wv^T, then rope_kv_write: the attention's input
  // projections, which a backend may finish in the projection's epilogue
  // (rotating q and k, writing k and v to their slots). k and v need not hold
  // anything afterwards; q is rotated. Default: matmul_multi, rope_kv_write.
  virtual void qkv_rope_kv_write(const NormedRows& x, const DeviceWeight& wq, const DeviceWeight& wk,
                                 const DeviceWeight& wv, Tensor q, Tensor k, Tensor v, const int32_t* positions,
                                 const RopeParams& rope, const int64_t* slot_mapping, const KvLayer& kv,
                                 const KvGeometry& geom) {
    matmul_multi(normalized(x, "qkv_rope_kv_write"), {&wq, &wk, &wv}, {q, k, v});
    rope_kv_write(q, k, v, positions, rope, slot_mapping, kv, geom);
  }
  // qkv_rope_kv_write, then paged_attention of its q into out: the attention
  // up to its output projection, with the batch's positions and slots. A
  // backend may rotate and write the new K/V inside the attention kernel; q,
  // k and v need not hold anything afterwards. Default: the two ops.
  virtual void qkv_attention(const NormedRows& x, const DeviceWeight& wq, const DeviceWeight& wk, const DeviceWeight& wv,
                             Tensor q, Tensor k, Tensor v, const RopeParams& rope, const KvLayer& kv,
                             const KvGeometry& geom, const BatchView& batch, int32_t num_heads, float scale,
                             Tensor out) {
    qkv_rope_kv_write(x, wq, wk, wv, q, k, v, batch.positions, rope, batch.slot_mapping, kv, geom);
    paged_attention(q, kv, geom, batch, num_heads, scale, out);
  }
  // Copies block `src` of both pools to block `dst`.
  virtual void copy_kv_block(const KvLayer& kv, const KvGeometry& geom, int64_t src, int64_t dst) = 0;
  // Writes k, v [T, num_kv_heads * head_dim] to the pools at slot_mapping[t].
  virtual void kv_write(const Tensor& k, const Tensor& v, const int64_t* slot_mapping,
                        const KvLayer& kv, const KvGeometry& geom) = 0;
  // out [T, num_heads * head_dim] = softmax(q k^T * scale) v for each sequence of
  // the batch: the query at position p attends to positions 0..p of its sequence,
  // read from the pools through its block table. Query head h reads KV head
  // h / (num_heads / num_kv_heads).
  virtual void paged_attention(const Tensor& q, const KvLayer& kv, const KvGeometry& geom,
                               const BatchView& batch, int32_t num_heads, float scale,
                               Tensor out) = 0;
  // out = silu(gate) * up, elementwise.
  virtual void silu_mul(const Tensor& gate, const Tensor& up, Tensor out) = 0;
  // out = silu(x @ gate^T) * (x @ up^T): the MLP's first half. `gate_buf` and
  // `up_buf` are scratch of out's shape that a backend may use; out may be
  // gate_buf. Default: matmul_multi into them, then silu_mul (elementwise, so
  // in place is fine).
  virtual void gated_mlp_up(const NormedRows& x, const DeviceWeight& gate, const DeviceWeight& up, Tensor gate_buf,
                            Tensor up_buf, Tensor out) {
    matmul_multi(normalized(x, "gated_mlp_up"), {&gate, &up}, {gate_buf, up_buf});
    silu_mul(gate_buf, up_buf, out);
  }
  // out[r, :] = x[rows[r], :] for r < out.rows.
  virtual void gather_rows(const Tensor& x, const int32_t* rows, Tensor out) = 0;

  // ---- sampling ----
  // One token per spec from f32 `logits` [R, vocab] (the backend's memory),
  // with logprobs when the spec asks; out[i] belongs to specs[i]. Throws
  // serval::Error when a row cannot be sampled (NaN or +inf logits, all -inf,
  // a token id outside the vocabulary), as sampling/sampler.h does.
  virtual void sample(const Tensor& logits, std::span<const SampleSpec> specs, std::vector<SampleResult>& out) = 0;
  // sample() in two halves, so that the host can work while the device runs:
  // start_sample queues the sampling after the work before it (`specs` need
  // not outlive the call), finish_sample waits for the tokens of the oldest
  // unfinished start. Up to kMaxStartedSamples starts may be unfinished, so
  // the next step can be queued before the host has this one's tokens. Either
  // may throw what sample() throws; a start that throws leaves nothing to
  // finish. Default: start_sample samples at once.
  static constexpr int kMaxStartedSamples = StartedSamples::kMax;
  virtual void start_sample(const Tensor& logits, std::span<const SampleSpec> specs);
  virtual void finish_sample(std::vector<SampleResult>& out) { out = started_.pop(); }
  // The tokens the latest start_sample draws, in spec order, in device
  // memory (-1 for a row that fails): work queued after that start and before
  // the next may read them (TokenFeed). Its address changes only with
  // graph_epoch(), so graphs may record it.
  // Default: host memory, which is the device's for a backend that computes
  // before it returns (and has no graphs).
  virtual const int32_t* sampled_tokens() { return started_.latest_tokens().data(); }
  // Starts not yet finished.
  virtual int started_samples() const { return started_.size(); }
  // Whether finish_sample would return without waiting for the device: the
  // oldest unfinished start has finished there (or none is unfinished).
  virtual bool sample_ready() const { return true; }
  // Whether start_sample's penalties count a spec's fed_source token (else a
  // caller must not start penalized specs with one). Default: yes.
  virtual bool counts_fed_tokens() const { return true; }

 protected:
  // x's rows, which must not be deferred (a backend that never defers a norm
  // reads them as they are); `op` names the caller in the error.
  static const Tensor& normalized(const NormedRows& x, const char* op);

 private:
  StartedSamples started_;
};

// Whether `device` names a GPU: "cuda" (the first) or "cuda:N"; a malformed
// "cuda:..." throws serval::Error.
bool is_cuda_device(const std::string& device);

// "cuda" when `device` is "auto" and this build has CUDA and the machine a
// GPU, "cpu" for "auto" otherwise; any other name unchanged.
std::string resolve_device(const std::string& device);

// Why `device` ("cpu" or "cuda", resolved) cannot run `def`'s model ("" when
// it can): an attention kernel it lacks (a head_dim CUDA has not compiled).
// Checked when a runner is made, so a model a device cannot
// run fails at start-up, and by --device auto to fall back to the CPU.
std::string device_cannot_run(const std::string& device, const ModelDef& def);

// The activation (and KV cache) dtype that `dtype` gives on `device` (as
// create_backend takes them): "auto" is bf16 on a GPU and f32 on the CPU,
// "bfloat16" bf16 (GPU only: the CPU computes in f32), "float32" f32.
// Throws serval::Error for another dtype or bfloat16 on the CPU.
DType compute_dtype(const std::string& device, const std::string& dtype);

// Creates the backend for `device` ("cpu", "cuda", "cuda:N" or "auto") computing in
// `dtype` (see compute_dtype); `threads` 0 means all cores; `cuda_tuning`
// for the CUDA backend (the CPU's has no such knobs). Throws serval::Error
// for devices this build does not have and dtypes they refuse.
std::unique_ptr<Backend> create_backend(const std::string& device, int threads, const std::string& dtype = "auto",
                                        const CudaTuning& cuda_tuning = {});

}  // namespace serval
