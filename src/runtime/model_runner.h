#pragma once
// ModelRunner: runs the Llama-family forward pass over a Batch on a backend and
// owns that backend's paged KV pool. The model is written once, against the
// Backend interface (runtime/backend.h); backends supply the kernels.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "model/model_config.h"
#include "model/model_def.h"
#include "model/weights.h"
#include "runtime/backend.h"
#include "runtime/batch.h"
#include "runtime/cuda_tuning.h"

namespace serval {

struct RunnerOptions {
  std::string device = "cpu";   // "cpu", "cuda", "cuda:N" or "auto" (cuda when there is a GPU)
  // Activations, weight matrices and KV cache: "auto" (bf16 on a GPU, f32 on
  // the CPU), "bfloat16" (GPU only) or "float32" (on a GPU: slower, follows
  // the CPU token for token).
  std::string dtype = "auto";
  // The KV pools' elements (--kv-cache-dtype): "auto" (the dtype above),
  // "fp8" (e4m3) or "int8", with per-(layer, KV head) scales (kv/kv_quant.h)
  // from the checkpoint, else calibrated at start-up by running
  // kv_calibration_tokens with a full-precision cache.
  std::string kv_cache_dtype = "auto";
  std::vector<int32_t> kv_calibration_tokens;
  int32_t block_size = 16;      // tokens per KV block
  int64_t kv_cache_tokens = 0;  // 0: size the pool from kv_memory_bytes, else gpu_memory_fraction
  int64_t kv_memory_bytes = 0;  // 0: see gpu_memory_fraction
  // On a GPU with neither of the above: weights + activations + KV pool take
  // this fraction of the device's memory. 0 (or a CPU): the pool holds 4
  // sequences of min(max_position, 4096) tokens.
  double gpu_memory_fraction = 0;
  // On the CPU (host memory), with neither kv_cache_tokens nor kv_memory_bytes:
  // the pool takes this fraction of the memory available once the weights
  // (as the backend will hold them) and an activation reserve are taken.
  double host_memory_fraction = 0;
  int threads = 0;              // CPU threads for kernels and BLAS; 0: all cores
  // The largest step the engine will run (activation buffers are planned for
  // it; a larger one grows them) and the most sequences in one step.
  int64_t max_num_batched_tokens = 512;
  int32_t max_num_seqs = 256;
  // Prompt tokens scored per step (prompt logprobs): logits rows planned
  // beside one per sequence.
  int32_t max_scored_rows = 256;
  int32_t max_model_len = 0;    // 0: the model's context
  bool enforce_eager = false;   // never replay decode steps from graphs
  // Backend::set_batch_invariant: a sequence's logits do not depend on what
  // else is in its steps (greedy output batched == alone, bit for bit); slower.
  bool batch_invariant = false;
  bool gemm_search = false;       // Backend::set_gemm_search
  std::string gemm_search_cache;  // its cache file ("": none)
  // The CUDA backend's kernel choices (--cuda-tuning); the CPU has none.
  CudaTuning cuda_tuning;
  // A Neox model's q/k rows in adjacent-pair order: where the backend's fused
  // rope kernels want it (Auto), always (On: to test that load on the CPU) or never.
  RopePermute rope_permute = RopePermute::Auto;
  // Sees every matmul's input (Backend::set_matmul_observer; the CPU only).
  MatmulObserver* matmul_observer = nullptr;
};

class ModelRunner {
 public:
  virtual ~ModelRunner() = default;
  // Prepares weights for `opts.device` in `opts.dtype` (for the CPU: converted
  // to f32) and allocates the KV pool. Throws serval::Error on unknown devices
  // or dtypes, or missing or mis-shaped tensors. `weights` may be released afterwards: the runner
  // keeps its own copy. An optional rope_freqs.weight tensor (GGUF Llama 3.1)
  // divides the RoPE frequencies and replaces llama3 rope_scaling.
  static std::unique_ptr<ModelRunner> create(const ModelConfig& config, const WeightStore& weights,
                                             const RunnerOptions& opts);

  // Runs one step. Writes K/V of the new tokens to batch.slot_mapping and
  // returns logits of batch.logits_rows, row-major [R, vocab_size], in `logits`
  // (empty when R == 0). The batch is validated first (Batch::validate, token
  // ids < vocab_size, context_len <= max_position): a bad batch throws
  // serval::Error and touches nothing. Not thread-safe: one caller at a time
  // (the engine loop).
  virtual void forward(const Batch& batch, std::vector<float>& logits) = 0;

  // Runs one step and samples one token for each spec (spec.row indexes the
  // step's logits rows), where the logits are: on a GPU they never reach the
  // host. Throws like forward() and Backend::sample(). Default: forward(), then
  // sampling/Sampler on the host.
  virtual void forward_sample(const Batch& batch, std::span<const SampleSpec> specs,
                              std::vector<SampleResult>& out);

  // forward_sample in two halves, so that the caller can work while the
  // device runs the step: start_sample queues it, finish_sample waits for the
  // tokens of the oldest unfinished start. Up to two starts may be
  // unfinished: a decode step can be queued, its tokens fed from the step
  // before on the device (Batch::token_source), before the host has that
  // step's tokens, so the device never waits for the host between steps.
  // Either may throw what forward_sample throws; after a throw from
  // start_sample there is nothing to finish, and no later step may feed from
  // it. `batch` and `specs` need not outlive start_sample. forward_sample
  // needs no start unfinished. Default: start_sample runs forward_sample at
  // once (a token_source resolved from the results on the host).
  static constexpr int kMaxStartedSteps = StartedSamples::kMax;
  virtual void start_sample(const Batch& batch, std::span<const SampleSpec> specs);
  virtual void finish_sample(std::vector<SampleResult>& out) { out = started_.pop(); }
  // Whether finish_sample would return without waiting for the device (the
  // oldest unfinished start has finished there, or none is unfinished).
  virtual bool sample_ready() const { return true; }
  // start_sample in two calls, for a caller that can make the specs only
  // later (a constrained row's allowed tokens depend on the token the step
  // before draws): start_forward queues the step's forward pass, and
  // start_sampling(specs) its sampling after it. The step counts as started
  // (finish_sample finishes it) only once start_sampling is called; the
  // caller may finish the step before in between. start_forward throws what
  // start_sample throws for a bad batch; a step forwarded but never sampled
  // is dropped by the next start_forward or start_sample, and no later step
  // may feed from it.
  virtual void start_forward(const Batch& batch);
  virtual void start_sampling(std::span<const SampleSpec> specs);

  // Copies whole KV blocks (every layer, K and V): for each pair, block
  // `first` to block `second`. For copy-on-write of a shared partial block
  // when a sequence forks. Throws if a block id is outside the pool.
  virtual void copy_blocks(const std::vector<std::pair<int32_t, int32_t>>& src_dst);

  virtual const ModelConfig& config() const = 0;
  virtual int32_t block_size() const = 0;
  virtual int64_t num_blocks() const = 0;
  // What the runner is running on, for start-up logs ("cuda", "cpu").
  virtual std::string device() const { return "cpu"; }
  // The RoPE order the runner computes in: config().rope_style, or
  // Interleaved where it loaded a Neox model's q/k rows permuted to adjacent
  // pairs (model/qk_permute.h), which changes no score.
  virtual RopeStyle rope_style() const { return config().rope_style; }
  // The widest sliding window of the model's layers (ModelDef::widest_window):
  // KV blocks behind it are read by no layer. 0: some layer reads everything.
  virtual int64_t attention_window() const { return 0; }
  // Device memory the runner holds (weights, activations, KV pool), 0 if unknown.
  virtual int64_t weight_bytes() const { return 0; }
  // Bytes of the weight matrices as held (their format's size), which every
  // decode step reads; 0 if unknown.
  virtual int64_t matrix_bytes() const { return 0; }
  // The formats the weight matrices are held in (DeviceModel::formats); "" if unknown.
  virtual std::string weight_formats() const { return ""; }
  virtual int64_t activation_bytes() const { return 0; }
  // Where a quantized KV cache's scales came from, for the start-up log; ""
  // for a cache of the activation dtype.
  virtual std::string kv_cache_note() const { return ""; }
  // Decode steps replayed from graphs so far, and graphs captured so far (one
  // dropped and captured again counts twice).
  virtual int64_t graph_replays() const { return 0; }
  virtual int64_t graphs_captured() const { return 0; }
  // Whether decode steps run from graphs (not eager only).
  virtual bool uses_graphs() const { return false; }
  // Whether start_sample only queues the step (a GPU), so that the caller's
  // work after it overlaps the step; false: it computes the step at once.
  virtual bool queues_steps_async() const { return false; }
  // Whether start_sample's penalties count a spec's fed_source token
  // (Backend::counts_fed_tokens); the default start_sample does.
  virtual bool counts_fed_tokens() const { return true; }
  // Prompt tokens a step may score (SchedulerConfig::max_scored_rows).
  virtual int64_t max_scored_rows() const { return 256; }

 private:
  Sampler host_sampler_;    // forward_sample's default
  StartedSamples started_;  // start_sample's default
  std::optional<Batch> forwarded_;  // start_forward's default: run at start_sampling
};

}  // namespace serval
