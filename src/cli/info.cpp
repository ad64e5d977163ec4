// serval info: a model's shape, its memory plan and its decode roofline.
#include <cmath>
#include <cstdio>
#include <iostream>
#include <map>

#include "cli/commands.h"
#include "core/dtype.h"
#include "kv/kv_quant.h"
#include "model/model_def.h"
#include "model/model_loader.h"

namespace serval::cli {
namespace {

struct InfoOptions {
  std::string model;
  double memory_gb = 141.0;       // H200
  double bandwidth_gbs = 4261.0;  // H200 copy bandwidth measured on this project's card
  double tflops = 736.0;          // H200 bf16 dense matmul measured likewise
  std::string kv_dtype = "bf16";
  int64_t context = 1024;         // tokens per sequence for the roofline and capacity
};

std::string human_bytes(double b) {
  char buf[32];
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) { b /= 1024; ++u; }
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", b, units[u]);
  return buf;
}

int run_info(const InfoOptions& o) {
  const LoadedModel m = load_model(o.model);
  const ModelConfig& c = m.config;

  std::map<std::string, std::pair<int64_t, int64_t>> by_dtype;  // dtype -> (params, bytes)
  int64_t params = 0, weight_bytes = 0;
  for (const auto& [name, t] : m.weights.all()) {
    auto& e = by_dtype[std::string(dtype_name(t.dtype))];
    e.first += t.numel();
    e.second += t.nbytes;
    params += t.numel();
    weight_bytes += t.nbytes;
  }
  // A tied model reads the embedding table twice per token (gather + LM head), but
  // the gather touches one row only: count the LM head once.
  const DType kv = o.kv_dtype == "fp8" || o.kv_dtype == "int8" ? parse_kv_cache_dtype(o.kv_dtype, DType::F32)
                                                                : parse_dtype(o.kv_dtype);
  const int64_t kv_per_token = 2 * c.num_layers * c.num_kv_heads * c.head_dim * dtype_bytes(kv, 1);
  const int64_t ctx = o.context > 0 ? o.context : c.max_position;

  std::printf("model          %s (%s)\n", m.path.c_str(), m.format.c_str());
  std::printf("architecture   %s%s\n", c.architecture.c_str(), c.name.empty() ? "" : (" \"" + c.name + "\"").c_str());
  std::printf("shape          %lld layers, hidden %lld, ffn %lld, heads %lld (kv %lld), head_dim %lld, vocab %lld\n",
              (long long)c.num_layers, (long long)c.hidden_size, (long long)c.intermediate_size,
              (long long)c.num_heads, (long long)c.num_kv_heads, (long long)c.head_dim,
              (long long)c.vocab_size);
  std::printf("context        %lld tokens, rope theta %g%s, rms eps %g%s%s%s\n", (long long)c.max_position,
              c.rope_theta, c.rope_scaling.type == RopeScaling::Type::Llama3 ? " (llama3 scaling)" :
              c.rope_scaling.type == RopeScaling::Type::Linear ? " (linear scaling)" : "",
              c.rms_eps, c.tie_word_embeddings ? ", tied embeddings" : "",
              c.attention_bias ? ", qkv bias" : "", c.qk_norm ? ", q/k norm" : "");
  std::printf("parameters     %.3f B (%lld)\n", params / 1e9, (long long)params);
  std::printf("weights        %s\n", human_bytes(double(weight_bytes)).c_str());
  for (const auto& [d, e] : by_dtype)
    std::printf("  %-12s %lld params, %s\n", d.c_str(), (long long)e.first, human_bytes(double(e.second)).c_str());
  std::printf("matrices       %s\n", ModelDef::of(c).stored_formats(m.weights).c_str());
  std::printf("KV per token   %s in %s (2 x %lld layers x %lld kv heads x %lld dims x %lld B)\n",
              human_bytes(double(kv_per_token)).c_str(), o.kv_dtype.c_str(), (long long)c.num_layers,
              (long long)c.num_kv_heads, (long long)c.head_dim, (long long)dtype_bytes(kv, 1));

  // Memory plan: weights, a small activation reserve, the rest for the KV pool.
  const double mem = o.memory_gb * 1e9;
  const double reserve = std::max(0.5e9, 0.02 * mem);
  const double kv_bytes = mem - double(weight_bytes) - reserve;
  std::printf("memory         %.1f GB: weights %s, activations reserve %s, KV pool %s\n", o.memory_gb,
              human_bytes(double(weight_bytes)).c_str(), human_bytes(reserve).c_str(),
              kv_bytes > 0 ? human_bytes(kv_bytes).c_str() : "none (the weights do not fit)");
  if (kv_bytes > 0) {
    const double tokens = std::floor(kv_bytes / double(kv_per_token));
    std::printf("KV capacity    %.0f tokens = %.1f sequences of %lld tokens\n", tokens, tokens / double(ctx),
                (long long)ctx);
  }

  // Decode roofline: each step reads every weight once, plus each sequence's KV.
  const double bw = o.bandwidth_gbs * 1e9;
  const double flops_per_token = 2.0 * double(params);
  std::printf("decode roofline at %.0f GB/s, %.0f TFLOP/s (context %lld per sequence):\n", o.bandwidth_gbs,
              o.tflops, (long long)ctx);
  std::printf("  %6s %14s %14s %10s\n", "batch", "step bytes", "tokens/s", "bound");
  for (int64_t b = 1; b <= 1024; b *= 2) {
    const double bytes = double(weight_bytes) + double(b) * double(ctx) * double(kv_per_token);
    const double t_mem = bytes / bw;
    const double t_flop = double(b) * flops_per_token / (o.tflops * 1e12);
    const double t = std::max(t_mem, t_flop);
    std::printf("  %6lld %14s %14.1f %10s\n", (long long)b, human_bytes(bytes).c_str(), double(b) / t,
                t_flop > t_mem ? "compute" : "memory");
  }
  const double ridge = o.tflops * 1e12 / bw;  // FLOP per byte
  std::printf("batch-1 decode roofline: %.1f tokens/s (%s per token, context 0: %.1f tokens/s)\n",
              bw / (double(weight_bytes) + double(ctx) * double(kv_per_token)),
              human_bytes(double(weight_bytes) + double(ctx) * double(kv_per_token)).c_str(),
              bw / double(weight_bytes));
  std::printf("ridge point    %.0f FLOP/byte; with weights alone decode turns compute-bound near batch %.0f\n",
              ridge, std::ceil(ridge * double(weight_bytes) / flops_per_token));
  return 0;
}

}  // namespace

void register_info(CLI::App& app, Action& action) {
  auto o = std::make_shared<InfoOptions>();
  auto* sub = app.add_subcommand("info", "Show a model's shape, memory plan and decode roofline");
  sub->add_option("--model,-m", o->model, "GGUF file or Hugging Face folder")->required();
  sub->add_option("--memory-gb", o->memory_gb, "device memory in GB (default: H200, 141)");
  sub->add_option("--bandwidth-gbs", o->bandwidth_gbs, "memory bandwidth in GB/s (default: H200 measured, 4261)");
  sub->add_option("--tflops", o->tflops, "dense matmul throughput in TFLOP/s (default: H200 bf16 measured, 736)");
  sub->add_option("--kv-dtype,--kv-cache-dtype", o->kv_dtype,
                  "KV cache element type (f32, f16, bf16, or fp8 / int8 as --kv-cache-dtype quantizes it)");
  sub->add_option("--context", o->context, "tokens of context per sequence for the plan (default 1024)");
  sub->callback([&action, o] { action = [o] { return run_info(*o); }; });
}

}  // namespace serval::cli
