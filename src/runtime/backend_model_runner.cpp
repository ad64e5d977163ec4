// The runner of every backend: it holds what is per device — the uploaded
// model, the workspace, the KV pool, batch upload and the CUDA graphs — and
// runs the forward pass (runtime/forward_pass.h) over each step's Batch.
#include "runtime/backend_model_runner.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "runtime/backend.h"
#include "runtime/device_model.h"
#include "runtime/forward_pass.h"
#include "kv/kv_memory_plan.h"
#include "kv/kv_quant.h"
#include "model/kv_checkpoint_scales.h"
#include "runtime/kv_scales.h"
#include "runtime/memory_plan.h"
#include "runtime/step_graphs.h"
#include "runtime/workspace.h"

namespace serval {

namespace {

class BackendModelRunner : public ModelRunner {
 public:
  BackendModelRunner(const ModelConfig& config, const WeightStore& weights, const RunnerOptions& opts);

  void forward(const Batch& batch, std::vector<float>& logits) override;
  void forward_sample(const Batch& batch, std::span<const SampleSpec> specs, std::vector<SampleResult>& out) override;
  void start_sample(const Batch& batch, std::span<const SampleSpec> specs) override;
  void start_forward(const Batch& batch) override;
  void start_sampling(std::span<const SampleSpec> specs) override;
  // start_sampling after the specs were checked.
  void sample_forwarded(std::span<const SampleSpec> specs);
  void finish_sample(std::vector<SampleResult>& out) override { backend_->finish_sample(out); }
  bool sample_ready() const override { return backend_->sample_ready(); }
  void copy_blocks(const std::vector<std::pair<int32_t, int32_t>>& src_dst) override;
  const ModelConfig& config() const override { return cfg_; }
  int32_t block_size() const override { return block_size_; }
  int64_t num_blocks() const override { return num_blocks_; }
  std::string device() const override { return backend_->name(); }
  RopeStyle rope_style() const override { return model_->rope().style; }
  int64_t attention_window() const override { return window_; }
  int64_t weight_bytes() const override { return model_->bytes(); }
  int64_t matrix_bytes() const override { return model_->matrix_bytes(); }
  std::string weight_formats() const override { return model_->formats(); }
  int64_t activation_bytes() const override { return ws_.bytes; }
  std::string kv_cache_note() const override { return kv_note_; }
  int64_t graph_replays() const override { return graph_replays_; }
  int64_t graphs_captured() const override { return graphs_captured_; }
  bool uses_graphs() const override { return graphs_ != nullptr; }
  bool queues_steps_async() const override { return backend_->queues_work_async(); }
  bool counts_fed_tokens() const override { return backend_->counts_fed_tokens(); }
  int64_t max_scored_rows() const override { return max_scored_rows_; }

 private:
  void allocate_kv_pool(const ModelDef& def, const RunnerOptions& opts);
  KvScales calibrate_kv_scales(const ModelDef& def, const std::vector<int32_t>& tokens, int64_t step_tokens);
  void choose_kept_formats(const ModelDef& def, const WeightStore& weights, double fraction);

  void ensure_workspace(int64_t tokens, int64_t rows);
  BatchView upload_batch(const Batch& batch);
  void validate(const Batch& batch) const;
  // Runs the step (from a graph when it can); returns the f32 logits [R, vocab]
  // in device memory.
  Tensor run(const Batch& batch);
  void enqueue(const BatchView& bv) { enqueue_forward(*backend_, *model_, ws_, kv_, bv); }

  ModelConfig cfg_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<DeviceModel> model_;
  KvPool kv_;
  KvScales kv_scales_;  // a quantized pool's scales; empty otherwise
  std::string kv_note_;
  int32_t block_size_ = 0;
  int64_t window_ = 0;  // ModelDef::widest_window, read by every step's validation
  int64_t max_scored_rows_ = 0;
  int64_t num_blocks_ = 0;  // blocks the engine may use; the pool may hold one spare (graph padding)
  Workspace ws_;
  std::unique_ptr<StepGraphs> graphs_;  // null: eager only
  int64_t graphs_epoch_ = 0;            // backend graph_epoch() the graphs were recorded at
  int64_t graph_replays_ = 0, graphs_captured_ = 0;
  // Batch metadata: packed on the host, copied to the device in one transfer.
  std::vector<int64_t> meta_host_;
  DeviceBuffer meta_dev_;
  // Specs of the latest start_sample that did not throw: what a chained
  // step's token_source may name.
  int64_t sampled_specs_ = 0;
  // The step start_forward queued and start_sampling has not sampled: its
  // logits rows, and the specs of the sample it feeds from (what its specs'
  // fed_source may name). rows < 0: none.
  Tensor forwarded_logits_;
  int64_t forwarded_rows_ = -1;
  int64_t forwarded_fed_specs_ = 0;
};

BackendModelRunner::BackendModelRunner(const ModelConfig& config, const WeightStore& weights,
                                       const RunnerOptions& opts)
    : cfg_(config) {
  cfg_.validate();
  SERVAL_CHECK(opts.block_size > 0, "runner: block_size must be positive, got ", opts.block_size);
  SERVAL_CHECK(opts.gpu_memory_fraction >= 0 && opts.gpu_memory_fraction <= 1,
               "--gpu-memory-fraction must be in (0, 1], got ", opts.gpu_memory_fraction);
  SERVAL_CHECK(opts.max_num_batched_tokens > 0 && opts.max_num_seqs > 0 && opts.max_scored_rows > 0,
               "runner: max_num_batched_tokens, max_num_seqs and max_scored_rows must be positive");
  const ModelDef def = ModelDef::of(cfg_);
  backend_ = create_backend(opts.device, opts.threads, opts.dtype, opts.cuda_tuning);
  const std::string refusal = device_cannot_run(backend_->name(), def);
  SERVAL_CHECK(refusal.empty(), "the ", backend_->name(), " backend cannot run this model: ", refusal,
               "; run it with --device cpu");
  backend_->set_kv_dtype(parse_kv_cache_dtype(opts.kv_cache_dtype, backend_->act_dtype()));
  backend_->set_batch_invariant(opts.batch_invariant);
  backend_->set_gemm_search(opts.gemm_search, opts.gemm_search_cache);
  if (opts.matmul_observer != nullptr) backend_->set_matmul_observer(opts.matmul_observer);
  if (backend_->chooses_kept_formats()) choose_kept_formats(def, weights, opts.gpu_memory_fraction);
  const int64_t weight_bytes = planned_weight_bytes(def, weights, *backend_);
  check_weights_fit(weight_bytes, *backend_, opts.gpu_memory_fraction > 0 ? opts.gpu_memory_fraction : 1.0);
  // A host-memory pool is planned from the memory available before the weights load.
  RunnerOptions planned = opts;
  planned.kv_cache_tokens = opts.kv_cache_tokens > 0 ? opts.kv_cache_tokens
                                                      : plan_host_kv_tokens(opts, *backend_, KvPoolBudget{
                                                            def.kv_bytes_per_token(backend_->kv_dtype()), weight_bytes, 0, 0, 0},
                                                            available_memory_bytes());
  model_ = std::make_unique<DeviceModel>(def, weights, *backend_, opts.rope_permute);
  window_ = def.widest_window();
  // Activations for the largest step first: the KV pool gets what is left.
  // Logits rows: one per sequence, and the prompt tokens a step may score.
  max_scored_rows_ = opts.max_scored_rows;
  ensure_workspace(std::max<int64_t>(opts.max_num_batched_tokens, opts.max_num_seqs),
                   int64_t(opts.max_num_seqs) + opts.max_scored_rows);
  block_size_ = opts.block_size;
  if (kv_dtype_quantized(backend_->kv_dtype())) {
    kv_scales_.layers = kv_checkpoint_scales(cfg_, weights, backend_->kv_dtype());
    kv_scales_.source = "from the checkpoint's k_scale / v_scale";
    if (kv_scales_.layers.empty())
      kv_scales_ = calibrate_kv_scales(def, opts.kv_calibration_tokens, opts.max_num_batched_tokens);
    kv_note_ = str_cat("KV cache in ", dtype_name(backend_->kv_dtype()), ", ", describe_kv_scales(kv_scales_), " ",
                       kv_scales_.source);
  }
  allocate_kv_pool(def, planned);
  if (!kv_scales_.layers.empty()) upload_kv_scales(*backend_, kv_scales_, kv_.layers);
  if (backend_->supports_graphs() && !opts.enforce_eager) {
    const int32_t max_len = opts.max_model_len > 0 ? opts.max_model_len : int32_t(cfg_.max_position);
    graphs_ = std::make_unique<StepGraphs>(*backend_, std::min<int32_t>(opts.max_num_seqs, 512), max_len,
                                           block_size_, int32_t(num_blocks_));
  }
}

// Formats kept at their size (GGUF blocks) take a fraction of the memory
// but compute slower than the dense matrices they decode to at some shapes
// (on the GPU past 16 rows: docs/CUDA_TUNING.md, packed_blocks; on the CPU
// at every shape: each product decodes its matrix): they are kept where the
// dense weights would take more than half of the memory the weights may
// use, leaving too little for the KV cache, or not fit at all.
void BackendModelRunner::choose_kept_formats(const ModelDef& def, const WeightStore& weights, double fraction) {
  backend_->keep_linear_formats(false);
  const int64_t dense = planned_weight_bytes(def, weights, *backend_);
  int64_t free_b = 0, total_b = 0;
  backend_->memory_info(free_b, total_b);
  const double budget = std::min(double(free_b), (fraction > 0 ? fraction : 1.0) * double(total_b));
  backend_->keep_linear_formats(double(dense) > 0.5 * budget);
}

// One pool per layer, each as its KvLayerSpec says, all of the same number of
// blocks (a sequence has one block table for every layer).
void BackendModelRunner::allocate_kv_pool(const ModelDef& def, const RunnerOptions& opts) {
  block_size_ = opts.block_size;
  KvPoolBudget budget;
  budget.bytes_per_token = def.kv_bytes_per_token(backend_->kv_dtype());
  budget.weight_bytes = model_->bytes();
  budget.activation_bytes = ws_.bytes;
  budget.activation_tokens = ws_.capacity;
  budget.max_position = cfg_.max_position;
  const int64_t tokens = plan_kv_tokens(opts, *backend_, budget);
  num_blocks_ = (tokens + opts.block_size - 1) / opts.block_size;
  SERVAL_CHECK(num_blocks_ < (int64_t(1) << 31) - 1, "runner: ", num_blocks_, " KV blocks are more than a block id holds");
  // One spare block that no request owns: graph-padding rows write there.
  const int64_t pool_blocks = num_blocks_ + (backend_->supports_graphs() ? 1 : 0);
  kv_ = KvPool{};
  for (int64_t l = 0; l < def.num_layers(); ++l) {
    kv_.geoms.push_back(KvGeometry::of(def.kv_spec(l, backend_->kv_dtype()), pool_blocks, block_size_));
    kv_.layers.push_back(backend_->alloc_kv_layer(kv_.geoms.back()));
  }
}

// Runs `tokens` as one sequence, in steps of at most `step_tokens`, with a
// pool of the activation dtype, and takes each head's amax: the scales of
// the quantized pool (kv_scale_for_amax). The pool is dropped afterwards.
KvScales BackendModelRunner::calibrate_kv_scales(const ModelDef& def, const std::vector<int32_t>& tokens,
                                                 int64_t step_tokens) {
  // The first 512 tokens at most: a short prefill even for a large model on a CPU.
  const int64_t n = std::min<int64_t>({int64_t(tokens.size()), cfg_.max_position, 512});
  SERVAL_CHECK(n > 0, "--kv-cache-dtype ", dtype_name(backend_->kv_dtype()),
               ": the checkpoint has no KV scales and no calibration text was given");
  num_blocks_ = (n + block_size_ - 1) / block_size_;
  kv_ = KvPool{};
  for (int64_t l = 0; l < def.num_layers(); ++l) {
    kv_.geoms.push_back(KvGeometry::of(def.kv_spec(l, backend_->act_dtype()), num_blocks_, block_size_));
    kv_.layers.push_back(backend_->alloc_kv_layer(kv_.geoms.back()));
  }
  Batch b;
  b.max_blocks_per_seq = int32_t(num_blocks_);
  for (int32_t i = 0; i < int32_t(num_blocks_); ++i) b.block_table.push_back(i);  // slot = position
  std::vector<float> logits;
  for (int64_t start = 0; start < n; start += step_tokens) {
    const int64_t end = std::min(n, start + step_tokens);
    b.token_ids.assign(tokens.begin() + start, tokens.begin() + end);
    b.positions.clear();
    b.slot_mapping.clear();
    for (int64_t p = start; p < end; ++p) {
      b.positions.push_back(int32_t(p));
      b.slot_mapping.push_back(p);
    }
    b.query_start = {0, int32_t(end - start)};
    b.context_len = {int32_t(end)};
    b.logits_rows = {int32_t(end - start - 1)};
    forward(b, logits);
  }
  KvScales scales;
  for (int64_t l = 0; l < def.num_layers(); ++l) {
    scales.layers.push_back(kv_scales_for_amax(backend_->kv_dtype(),
                                               kv_pool_amax(*backend_, kv_.layers[l], kv_.geoms[l], n)));
  }
  scales.source = str_cat("calibrated at start-up on ", n, " tokens of built-in text (amax x ",
                          kv_scale_margin(backend_->kv_dtype()), " / ", kv_code_max(backend_->kv_dtype()), ")");
  kv_ = KvPool{};
  return scales;
}

void BackendModelRunner::ensure_workspace(int64_t tokens, int64_t rows) {
  if (ws_.fits(tokens, rows)) return;
  ws_.grow(cfg_, *backend_, tokens, rows);
  if (graphs_) graphs_->clear();  // they hold the old addresses
}

BatchView BackendModelRunner::upload_batch(const Batch& b) {
  // Layout: each array starts on a 64-byte boundary of one buffer.
  struct Part { const void* src; int64_t bytes; int64_t offset; };
  Part parts[] = {
      {b.token_ids.data(), int64_t(b.token_ids.size() * 4), 0},
      {b.token_source.data(), int64_t(b.token_source.size() * 4), 0},
      {b.positions.data(), int64_t(b.positions.size() * 4), 0},
      {b.query_start.data(), int64_t(b.query_start.size() * 4), 0},
      {b.context_len.data(), int64_t(b.context_len.size() * 4), 0},
      {b.block_table.data(), int64_t(b.block_table.size() * 4), 0},
      {b.slot_mapping.data(), int64_t(b.slot_mapping.size() * 8), 0},
      {b.logits_rows.data(), int64_t(b.logits_rows.size() * 4), 0},
  };
  int64_t total = 0;
  for (Part& p : parts) {
    p.offset = total;
    total += (p.bytes + 63) / 64 * 64;
  }
  if (int64_t(meta_host_.size()) * 8 < total) meta_host_.resize(size_t(total / 8));
  if (meta_dev_.bytes() < total) meta_dev_ = backend_->alloc(total * 2);
  char* host = reinterpret_cast<char*>(meta_host_.data());
  for (const Part& p : parts)
    if (p.bytes > 0) std::memcpy(host + p.offset, p.src, size_t(p.bytes));
  backend_->copy_to_device_async(meta_dev_.data(), host, total);

  const char* dev = static_cast<const char*>(meta_dev_.data());
  BatchView v;
  v.token_ids = reinterpret_cast<const int32_t*>(dev + parts[0].offset);
  if (!b.token_source.empty())
    v.feed = TokenFeed{reinterpret_cast<const int32_t*>(dev + parts[1].offset), backend_->sampled_tokens()};
  v.positions = reinterpret_cast<const int32_t*>(dev + parts[2].offset);
  v.query_start = reinterpret_cast<const int32_t*>(dev + parts[3].offset);
  v.context_len = reinterpret_cast<const int32_t*>(dev + parts[4].offset);
  v.block_table = reinterpret_cast<const int32_t*>(dev + parts[5].offset);
  v.slot_mapping = reinterpret_cast<const int64_t*>(dev + parts[6].offset);
  v.logits_rows = reinterpret_cast<const int32_t*>(dev + parts[7].offset);
  v.num_tokens = b.num_tokens();
  v.num_seqs = b.num_seqs();
  v.num_logits_rows = int32_t(b.logits_rows.size());
  v.logits_rows_all = v.num_logits_rows == v.num_tokens;
  for (int32_t i = 0; v.logits_rows_all && i < v.num_logits_rows; ++i) v.logits_rows_all = b.logits_rows[i] == i;
  v.max_blocks_per_seq = b.max_blocks_per_seq;
  int64_t context_sum = 0;
  for (int32_t s = 0; s < v.num_seqs; ++s) {
    v.max_query_len = std::max(v.max_query_len, b.query_start[s + 1] - b.query_start[s]);
    v.max_context_len = std::max(v.max_context_len, b.context_len[s]);
    context_sum += b.context_len[s];
  }
  if (v.num_seqs > 0) v.mean_context_len = int32_t(context_sum / v.num_seqs);
  return v;
}

void BackendModelRunner::validate(const Batch& batch) const {
  batch.validate(block_size_, num_blocks_, window_);
  for (int32_t t = 0; t < batch.num_tokens(); ++t) {
    const int32_t source = batch.token_source.empty() ? -1 : batch.token_source[t];
    SERVAL_CHECK(source < sampled_specs_, "batch: token_source[", t, "] = ", source, " names no spec of the sample ",
                 "before, which had ", sampled_specs_);
    SERVAL_CHECK(source >= 0 || (batch.token_ids[t] >= 0 && batch.token_ids[t] < cfg_.vocab_size), "batch: token_ids[",
                 t, "] = ", batch.token_ids[t], " is outside the vocabulary of ", cfg_.vocab_size);
  }
  for (int32_t s = 0; s < batch.num_seqs(); ++s) {
    SERVAL_CHECK(batch.context_len[s] <= cfg_.max_position, "batch: sequence ", s, " has context_len ",
                 batch.context_len[s], ", beyond the model's context length ", cfg_.max_position);
  }
}

Tensor BackendModelRunner::run(const Batch& batch) {
  validate(batch);
  const int64_t R = int64_t(batch.logits_rows.size());
  if (graphs_ && graphs_->eligible(batch)) {
    const int32_t B = graphs_->padded_size(batch.num_seqs());
    ensure_workspace(B, B);  // may drop the graphs, so before find()
    const int32_t* sampled = backend_->sampled_tokens();  // may move (a new epoch), so before the check
    // A scratch buffer reallocated since the graphs were recorded (by an eager
    // step of another shape) would leave them reading freed memory.
    if (backend_->graph_epoch() != graphs_epoch_) graphs_->clear();
    const BatchView bv = graphs_->upload(batch, B, sampled);
    if (DeviceGraph* g = graphs_->find(bv)) {
      g->replay();
      ++graph_replays_;
      return Tensor{ws_.logits.data(), DType::F32, R, cfg_.vocab_size};
    }
    // First step of this size: run it eagerly (which also sizes every scratch
    // buffer and matmul plan the graph will use), then record it.
    enqueue(bv);
    if (backend_->graph_epoch() != graphs_epoch_) graphs_->clear();  // the warm-up grew a scratch buffer
    graphs_epoch_ = backend_->graph_epoch();
    backend_->begin_capture();
    try {
      enqueue(bv);
    } catch (...) {
      try { backend_->end_capture(); } catch (...) {}
      throw;
    }
    graphs_->store(bv, backend_->end_capture());
    ++graphs_captured_;
    return Tensor{ws_.logits.data(), DType::F32, R, cfg_.vocab_size};
  }
  ensure_workspace(batch.num_tokens(), R);
  enqueue(upload_batch(batch));
  return Tensor{ws_.logits.data(), DType::F32, R, cfg_.vocab_size};
}

void BackendModelRunner::forward(const Batch& batch, std::vector<float>& logits) {
  const Tensor out = run(batch);
  logits.resize(size_t(out.numel()));
  if (out.rows > 0) backend_->tensor_to_host(out, logits.data());
}

void BackendModelRunner::forward_sample(const Batch& batch, std::span<const SampleSpec> specs,
                                        std::vector<SampleResult>& out) {
  SERVAL_CHECK(backend_->started_samples() == 0, "forward_sample while a started step is unfinished");
  start_sample(batch, specs);
  finish_sample(out);
}

// The specs of a step with `rows` logits rows, chained to a sample of `fed` specs.
void check_specs(std::span<const SampleSpec> specs, int64_t rows, int64_t fed) {
  for (const SampleSpec& s : specs) {
    SERVAL_CHECK(s.params != nullptr && s.row >= 0 && s.row < rows, "forward_sample: spec row ", s.row,
                 " is outside the step's ", rows, " logits rows");
    SERVAL_CHECK(s.fed_source < fed, "sample spec: fed_source ", s.fed_source,
                 " names no spec of the sample before, which had ", fed);
  }
}

void BackendModelRunner::start_sample(const Batch& batch, std::span<const SampleSpec> specs) {
  // Before anything is queued: a bad spec touches nothing.
  check_specs(specs, int64_t(batch.logits_rows.size()), sampled_specs_);
  start_forward(batch);
  sample_forwarded(specs);
}

void BackendModelRunner::start_forward(const Batch& batch) {
  SERVAL_CHECK(backend_->started_samples() < Backend::kMaxStartedSamples, "start_sample: ",
               Backend::kMaxStartedSamples, " steps are already started and unfinished");
  forwarded_rows_ = -1;
  forwarded_logits_ = run(batch);
  forwarded_rows_ = int64_t(batch.logits_rows.size());
  forwarded_fed_specs_ = sampled_specs_;
  sampled_specs_ = 0;  // a chained step after a failed start would read stale tokens
}

void BackendModelRunner::start_sampling(std::span<const SampleSpec> specs) {
  SERVAL_CHECK(forwarded_rows_ >= 0, "start_sampling without a step forwarded (start_forward)");
  check_specs(specs, forwarded_rows_, forwarded_fed_specs_);
  sample_forwarded(specs);
}

void BackendModelRunner::sample_forwarded(std::span<const SampleSpec> specs) {
  forwarded_rows_ = -1;
  backend_->start_sample(forwarded_logits_, specs);
  sampled_specs_ = int64_t(specs.size());
}

void BackendModelRunner::copy_blocks(const std::vector<std::pair<int32_t, int32_t>>& src_dst) {
  for (const auto& [src, dst] : src_dst) {
    SERVAL_CHECK(src >= 0 && src < num_blocks_ && dst >= 0 && dst < num_blocks_, "copy_blocks: ", src, " -> ", dst,
                 " is outside the pool of ", num_blocks_, " blocks");
  }
  for (size_t l = 0; l < kv_.layers.size(); ++l)
    for (const auto& [src, dst] : src_dst)
      if (src != dst) backend_->copy_kv_block(kv_.layers[l], kv_.geoms[l], src, dst);
}

}  // namespace

std::unique_ptr<ModelRunner> make_backend_model_runner(const ModelConfig& config, const WeightStore& weights,
                                                       const RunnerOptions& opts) {
  return std::make_unique<BackendModelRunner>(config, weights, opts);
}

}  // namespace serval
