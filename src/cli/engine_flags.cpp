#include "cli/engine_flags.h"

#include <cstdio>

#include "core/dtype.h"
#include "kv/kv_calibration_text.h"
#include "kv/kv_quant.h"
#include "model/model_def.h"

namespace serval::cli {

void add_engine_flags(CLI::App& sub, EngineFlags& f) {
  sub.add_option("--max-num-seqs", f.scheduler.max_num_seqs, "sequences running at once");
  sub.add_option("--max-num-batched-tokens", f.scheduler.max_num_batched_tokens,
                 "tokens per step (the chunked-prefill budget)");
  sub.add_option("--max-queued-requests", f.scheduler.max_queued_requests,
                 "waiting requests before new ones are refused");
  sub.add_option("--kv-cache-tokens", f.kv_cache_tokens, "KV pool size in tokens");
  sub.add_option("--kv-cache-memory-fraction", f.kv_cache_memory_fraction,
                 "KV pool: this fraction of the memory left after the weights (default: "
                 "4 sequences of the context, at most 4096 tokens each)");
  sub.add_option("--max-model-len", f.scheduler.max_model_len,
                 "context length in tokens, prompt + output (default: the model's)");
  sub.add_flag("--no-prefix-cache", f.no_prefix_cache, "turn the radix prefix cache off");
  sub.add_option("--async-scheduling", f.async_scheduling,
                 "plan and queue each step while the step before runs, its decodes' tokens fed on the device: "
                 "auto (default: on a GPU), on (also on a CPU, where the steps still run one after the other: "
                 "for tests) or off")
      ->check(CLI::IsMember({"auto", "on", "off"}));
  sub.add_flag("--no-async-scheduling", f.no_async_scheduling, "--async-scheduling off");
  sub.add_flag("--no-late-continuations", f.no_late_continuations,
               "with async scheduling: plan each step as soon as the step before is queued, not shortly before "
               "it is expected to end (requests that arrive while a step runs then start a step later)");
  sub.add_option("--speculative", f.speculative.method,
                 "speculative decoding: none (default), ngram (draft tokens looked up in the prompt and output "
                 "so far) or oracle (bench --mode engine only: greedy continuations recorded first; "
                 "docs/SPECULATIVE.md)");
  sub.add_option("--num-speculative-tokens", f.speculative.num_tokens,
                 "with --speculative: draft tokens per sequence and step, 1..8 (default 3)");
  sub.add_option("--ngram-max", f.speculative.ngram_max,
                 "with --speculative ngram: the longest suffix looked up (default 4)");
  sub.add_option("--ngram-min", f.speculative.ngram_min,
                 "with --speculative ngram: the shortest suffix looked up (default 1)");
  sub.add_option("--oracle-acceptance", f.speculative.oracle_acceptance,
                 "bench --mode engine --speculative oracle: the chance each draft token is the target's own "
                 "(default 0.8)");
  sub.add_option("--block-size", f.block_size, "tokens per KV block");
  sub.add_option("--gpu-memory-fraction", f.gpu_memory_fraction,
                 "on a GPU: the fraction of its memory for weights, activations and the KV pool (default 0.9)");
  sub.add_flag("--enforce-eager", f.enforce_eager, "on a GPU: run every step op by op, without CUDA graphs");
  sub.add_flag("--batch-invariant", f.batch_invariant,
               "kernels whose result for a sequence does not depend on the rest of its batch: greedy output "
               "batched equals each request alone, bit for bit (slower; on a GPU, bfloat16 only)");
  sub.add_flag("--gemm-search", f.gemm_search,
               "on a GPU: time many more cuBLASLt configurations for each decode-sized matmul on cuBLASLt at its first use "
               "(0.4-3 s per shape; +1-2% decode throughput at 32-256 sequences on an H200)");
  sub.add_option("--gemm-search-cache", f.gemm_search_cache,
                 "on a GPU: --gemm-search, reading its results from this file and adding new ones, so that a later "
                 "run on the same GPU and cuBLASLt does not search again");
  sub.add_option("--cuda-tuning", f.cuda_tuning,
                 "on a GPU: the CUDA backend's kernel choices as key=value,... for A/B benchmarks "
                 "(docs/CUDA_TUNING.md; keys: " + cuda_tuning_keys() + ")");
  sub.add_option("--threads", f.threads, "CPU threads (default: all cores)");
  sub.add_option("--device", f.device, "cpu, cuda (the first GPU), cuda:N (GPU N) or auto (default: auto, cuda when there is a GPU)");
  sub.add_option("--dtype", f.dtype,
                 "activations, weight matrices and KV cache: auto (bf16 on a GPU), bfloat16 or float32 "
                 "(default: auto; the CPU computes in float32)");
  sub.add_option("--kv-cache-dtype", f.kv_cache_dtype,
                 "KV cache elements: auto (the --dtype), fp8 (e4m3) or int8, the last two with a scale per layer and "
                 "KV head, from the checkpoint's k_scale/v_scale or calibrated at start-up (docs/QUANTIZATION_QUALITY.md)");
}

EngineOptions engine_options(const EngineFlags& f) {
  EngineOptions o;
  o.scheduler = f.scheduler;
  o.scheduler.validate();
  o.enable_prefix_cache = !f.no_prefix_cache;
  SERVAL_CHECK(!f.no_async_scheduling || f.async_scheduling != "on",
               "--no-async-scheduling contradicts --async-scheduling on");
  using A = EngineOptions::AsyncScheduling;
  o.async_scheduling = f.no_async_scheduling || f.async_scheduling == "off" ? A::kOff
                       : f.async_scheduling == "on"                         ? A::kOn
                                                                            : A::kAuto;
  o.late_continuations = !f.no_late_continuations;
  f.speculative.validate();
  o.speculative = f.speculative;
  return o;
}

CudaTuning cuda_tuning(const EngineFlags& f, const std::string& device) {
  const CudaTuning t = parse_cuda_tuning(f.cuda_tuning);
  SERVAL_CHECK(f.cuda_tuning.empty() || device != "cpu",
               "--cuda-tuning tunes the CUDA backend; this run is on the CPU (--device cuda to use it)");
  return t;
}

LoadedEngineModel load_engine_model(const std::string& path, const EngineFlags& f) {
  SERVAL_CHECK(f.block_size >= 1 && f.block_size <= 1024, "--block-size must be in [1, 1024], got ",
               f.block_size);
  SERVAL_CHECK(f.kv_cache_tokens >= 0, "--kv-cache-tokens must not be negative, got ",
               f.kv_cache_tokens);
  std::string device = resolve_device(f.device);
  // K/V are kept in the compute dtype (f32 on the CPU, bf16 or f32 on a GPU)
  // or as --kv-cache-dtype says. Checked before the model loads, so a bad
  // --dtype or --kv-cache-dtype fails at once.
  DType kv_dtype = parse_kv_cache_dtype(f.kv_cache_dtype, compute_dtype(device, f.dtype));
  cuda_tuning(f, device);  // a bad key fails before the model loads
  LoadedEngineModel m{load_model(path), load_tokenizer(path), nullptr, {}};
  const ModelConfig& c = m.model.config;
  const ModelDef def = ModelDef::of(c);
  if (const std::string why = device_cannot_run(device, def); f.device == "auto" && !why.empty()) {
    std::fprintf(stderr, "--device auto: the %s backend cannot run this model (%s); running on the CPU\n",
                 device.c_str(), why.c_str());
    device = "cpu";
    kv_dtype = parse_kv_cache_dtype(f.kv_cache_dtype, compute_dtype(device, f.dtype));
  }
  SERVAL_CHECK(f.scheduler.max_model_len >= 0 && f.scheduler.max_model_len <= c.max_position,
               "--max-model-len must be in [1, ", c.max_position, "] (the model's context), got ",
               f.scheduler.max_model_len);
  const int64_t bytes_per_token = def.kv_bytes_per_token(kv_dtype);
  SERVAL_CHECK(f.gpu_memory_fraction > 0 && f.gpu_memory_fraction <= 1,
               "--gpu-memory-fraction must be in (0, 1], got ", f.gpu_memory_fraction);
  RunnerOptions ro;
  ro.block_size = f.block_size;
  ro.threads = f.threads;
  ro.device = device;
  ro.dtype = f.dtype;
  ro.kv_cache_dtype = f.kv_cache_dtype;
  if (kv_dtype_quantized(kv_dtype)) ro.kv_calibration_tokens = m.tokenizer->encode(kKvCalibrationText, true);
  ro.kv_cache_tokens = f.kv_cache_tokens;
  ro.gpu_memory_fraction = device == "cpu" ? 0 : f.gpu_memory_fraction;
  ro.enforce_eager = f.enforce_eager;
  ro.batch_invariant = f.batch_invariant;
  ro.gemm_search = f.gemm_search;
  ro.gemm_search_cache = f.gemm_search_cache;
  ro.cuda_tuning = cuda_tuning(f, device);
  ro.max_num_batched_tokens = f.scheduler.max_num_batched_tokens;
  ro.max_num_seqs = int32_t(f.scheduler.max_num_seqs);
  ro.max_model_len = int32_t(f.scheduler.max_model_len);
  SERVAL_CHECK(device == "cpu" || f.kv_cache_memory_fraction == 0,
               "--kv-cache-memory-fraction plans host memory; on a GPU use --gpu-memory-fraction or --kv-cache-tokens");
  ro.host_memory_fraction = f.kv_cache_memory_fraction;
  m.runner = ModelRunner::create(c, m.model.weights, ro);
  m.plan.num_blocks = m.runner->num_blocks();
  m.plan.block_size = m.runner->block_size();
  m.plan.bytes_per_token = bytes_per_token;
  m.plan.context_len = c.max_position;
  m.plan.dtype = kv_dtype;
  if (m.runner->device() != "cpu") {
    const double gib = double(int64_t(1) << 30);
    std::fprintf(stderr,
                 "%s memory (%s): weights %.2f GiB, activations %.2f GiB (steps of up to %lld tokens), KV %.2f GiB%s\n",
                 m.runner->device().c_str(), std::string(dtype_name(kv_dtype)).c_str(),
                 double(m.runner->weight_bytes()) / gib,
                 double(m.runner->activation_bytes()) / gib, (long long)ro.max_num_batched_tokens,
                 double(m.plan.bytes()) / gib, f.enforce_eager ? "; CUDA graphs off (--enforce-eager)" : "");
    if (kv_dtype == DType::FP8_E4M3 || kv_dtype == DType::I8)
      std::fprintf(stderr, "warning: --kv-cache-dtype %s on the GPU runs a plain attention kernel that has not yet "
                           "been checked on a GPU against the CPU backend (docs/QUANTIZATION_QUALITY.md)\n",
                   f.kv_cache_dtype.c_str());
  }
  if (!c.quant_method.empty())
    std::fprintf(stderr,
                 "checkpoint quantization (%s); weights dequantized where the backend has no kernel for their "
                 "format, quantized activations not emulated (docs/QUANTIZED_CHECKPOINTS.md)\n",
                 c.quant_summary.c_str());
  if (!c.linear_formats.empty())
    std::fprintf(stderr, "weight matrices stored as: %s (Serval's quantized GGUF)\n",
                 ModelDef::of(c).stored_formats(m.model.weights).c_str());
  if (const std::string formats = m.runner->weight_formats(); !formats.empty())
    std::fprintf(stderr, "weight matrices held as: %s (%.2f GiB a step)\n", formats.c_str(),
                 double(m.runner->matrix_bytes()) / double(int64_t(1) << 30));
  if (f.batch_invariant) {
    std::fprintf(stderr, "batch-invariant kernels (--batch-invariant): a sequence's output does not depend on its "
                         "batch; slower\n");
  }
  std::fprintf(stderr, "%s\n", m.plan.describe().c_str());
  if (const std::string note = m.runner->kv_cache_note(); !note.empty()) std::fprintf(stderr, "%s\n", note.c_str());
  if (const int64_t window = m.runner->attention_window(); window > 0) {
    std::fprintf(stderr, "sliding-window attention (%lld positions): KV blocks behind the window are released as "
                         "sequences grow; prefix caching is off for this model\n", (long long)window);
  }
  return m;
}

}  // namespace serval::cli
