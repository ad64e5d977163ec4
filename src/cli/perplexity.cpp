// `serval perplexity --model M --file TEXT [--ctx 512] [--chunks N] [--json]
// [--kl-divergence-base OUT | --kl-divergence BASE]`: the model's perplexity
// on a text by llama.cpp's method (eval/perplexity.h), a running figure per
// chunk on stderr as llama.cpp prints it, the result on stdout; and the base
// model's log-probabilities saved, or this model compared with them token by
// token (eval/kl_divergence.h). Quantized formats are shown with their cost
// in quality this way.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <sstream>

#include "cli/commands.h"
#include "cli/engine_flags.h"
#include "core/error.h"
#include "eval/kl_divergence.h"
#include "eval/perplexity.h"

namespace serval::cli {
namespace {

struct PerplexityCliOptions {
  std::string model;
  std::string file;
  int64_t ctx = 512;
  int64_t chunks = 0;
  bool json = false;
  std::string kl_base_out;  // --kl-divergence-base: write the base's log-probabilities here
  std::string kl_base_in;   // --kl-divergence: compare with the base's from here
  EngineFlags engine;
};

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  SERVAL_CHECK(in, "cannot open --file \"", path, "\"");
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

int run_perplexity(PerplexityCliOptions o) {
  SERVAL_CHECK(o.ctx >= 4, "--ctx must be at least 4 tokens, got ", o.ctx);
  SERVAL_CHECK(o.chunks >= 0, "--chunks must not be negative, got ", o.chunks);
  SERVAL_CHECK(o.kl_base_out.empty() || o.kl_base_in.empty(),
               "--kl-divergence-base writes the base's file and --kl-divergence reads one: give one of them");
  const std::string text = read_text(o.file);
  // One sequence of ctx tokens per step, the pool holding exactly it.
  EngineFlags& f = o.engine;
  f.kv_cache_tokens = (o.ctx + f.block_size - 1) / f.block_size * f.block_size;
  f.scheduler.max_num_seqs = 1;
  f.scheduler.max_num_batched_tokens = o.ctx;
  f.scheduler.max_model_len = o.ctx;
  LoadedEngineModel m = load_engine_model(o.model, f);
  const Tokenizer& tok = *m.tokenizer;
  // As llama.cpp: BOS before the text, and each chunk starting with BOS, where the tokenizer adds one.
  const std::vector<int32_t> tokens = tok.encode(text, /*add_special=*/true);
  PerplexityOptions po;
  po.ctx = o.ctx;
  po.max_chunks = o.chunks;
  po.bos_id = tok.add_bos ? tok.bos_id : -1;
  const int64_t whole = int64_t(tokens.size()) / o.ctx;
  const int64_t chunks = o.chunks > 0 ? std::min(whole, o.chunks) : whole;
  std::fprintf(stderr, "perplexity: %zu tokens, %lld chunks of %lld (the second half of each scored)\n",
               tokens.size(), (long long)chunks, (long long)o.ctx);
  const LogprobFileHeader header{o.ctx, chunks, o.ctx - 1 - o.ctx / 2, m.model.config.vocab_size,
                                 chunks * o.ctx,
                                 token_hash(std::span(tokens).first(size_t(std::max<int64_t>(chunks, 0) * o.ctx)))};
  std::unique_ptr<LogprobWriter> base_out;
  std::unique_ptr<LogprobReader> base_in;
  KlStats kl;
  PerplexityObserver watch;
  if (!o.kl_base_out.empty() && chunks > 0) {
    base_out = std::make_unique<LogprobWriter>(o.kl_base_out, header);
    watch.on_row = [&](std::span<const float> logits, int32_t) { base_out->add(logits); };
  }
  if (!o.kl_base_in.empty()) {
    base_in = std::make_unique<LogprobReader>(o.kl_base_in);
    const LogprobFileHeader& h = base_in->header();
    SERVAL_CHECK(h.vocab == header.vocab, "\"", o.kl_base_in, "\" is of a vocabulary of ", h.vocab, "; this model's has ",
                 header.vocab);
    SERVAL_CHECK(h == header, "\"", o.kl_base_in, "\" holds ", h.chunks, " chunks of ", h.ctx, " tokens (", h.tokens,
                 " tokens, hash ", h.token_hash, "); this run scores ", header.chunks, " of ", header.ctx, " (",
                 header.tokens, " tokens, hash ", header.token_hash,
                 "): give the same text, tokenizer, --ctx and --chunks as the base run");
    watch.on_row = [&](std::span<const float> logits, int32_t) { kl.add(base_in->next(), logits); };
  }
  watch.on_chunk = [](const PerplexityResult& so_far) {
    std::fprintf(stderr, "[%lld]%.4f,", (long long)so_far.chunks, so_far.running.back());
    std::fflush(stderr);
  };
  const PerplexityResult r = perplexity(*m.runner, tokens, po, watch);
  std::fprintf(stderr, "\n");
  if (base_out) base_out->finish();
  if (o.json) {
    nlohmann::json j = {{"model", o.model},         {"file", o.file},          {"ctx", o.ctx},
                        {"tokens", tokens.size()},  {"chunks", r.chunks},      {"scored", r.scored},
                        {"mean_nll", r.mean_nll()}, {"perplexity", r.perplexity()}, {"running", r.running}};
    if (base_in)
      j["kl_divergence"] = {{"mean", kl.mean()},          {"stderr", kl.stderr_of_mean()},
                            {"median", kl.quantile(0.5)}, {"p99", kl.quantile(0.99)},
                            {"max", kl.quantile(1.0)},    {"same_top1", kl.same_top1()}};
    std::cout << j.dump() << "\n";
  } else {
    std::printf("perplexity %.4f (mean NLL %.6f) over %lld chunks of %lld tokens, %lld tokens scored\n",
                r.perplexity(), r.mean_nll(), (long long)r.chunks, (long long)o.ctx, (long long)r.scored);
    if (base_in)
      std::printf("KL divergence from the base: mean %.6f +/- %.6f, median %.6f, p99 %.6f, max %.6f; same top token "
                  "%.2f%%\n",
                  kl.mean(), kl.stderr_of_mean(), kl.quantile(0.5), kl.quantile(0.99), kl.quantile(1.0),
                  100.0 * kl.same_top1());
  }
  return 0;
}

}  // namespace

void register_perplexity(CLI::App& app, Action& action) {
  auto o = std::make_shared<PerplexityCliOptions>();
  CLI::App* sub = app.add_subcommand(
      "perplexity", "A model's perplexity on a text, by llama.cpp's method (chunks of --ctx, the second half of "
                    "each scored)");
  sub->add_option("--model", o->model, "GGUF file or Hugging Face folder")->required();
  sub->add_option("--file", o->file, "the text (UTF-8)")->required();
  sub->add_option("--ctx", o->ctx, "tokens per chunk (default 512)");
  sub->add_option("--chunks", o->chunks, "score at most this many chunks (default: all)");
  sub->add_flag("--json", o->json, "print the result as one JSON object");
  sub->add_option("--kl-divergence-base", o->kl_base_out,
                  "write this (base) model's log-probabilities of every scored token to this file");
  sub->add_option("--kl-divergence", o->kl_base_in,
                  "compare this model with the base's log-probabilities in this file (same text, --ctx, --chunks): "
                  "KL divergence per token and top-token agreement");
  add_engine_flags(*sub, o->engine);
  sub->callback([o, &action] { action = [o] { return run_perplexity(*o); }; });
}

}  // namespace serval::cli
