// `serval perplexity --model M --file TEXT [--ctx 512] [--chunks N] [--json]`:
// the model's perplexity on a text by llama.cpp's method (eval/perplexity.h),
// a running figure per chunk on stderr as llama.cpp prints it, the result on
// stdout. Quantized formats are shown with their cost in quality this way.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/commands.h"
#include "cli/engine_flags.h"
#include "core/error.h"
#include "eval/perplexity.h"

namespace serval::cli {
namespace {

struct PerplexityCliOptions {
  std::string model;
  std::string file;
  int64_t ctx = 512;
  int64_t chunks = 0;
  bool json = false;
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
  std::fprintf(stderr, "perplexity: %zu tokens, %lld chunks of %lld (the second half of each scored)\n",
               tokens.size(), (long long)(o.chunks > 0 ? std::min(whole, o.chunks) : whole), (long long)o.ctx);
  const PerplexityResult r = perplexity(*m.runner, tokens, po, [](const PerplexityResult& so_far) {
    std::fprintf(stderr, "[%lld]%.4f,", (long long)so_far.chunks, so_far.running.back());
    std::fflush(stderr);
  });
  std::fprintf(stderr, "\n");
  if (o.json) {
    nlohmann::json j = {{"model", o.model},         {"file", o.file},          {"ctx", o.ctx},
                        {"tokens", tokens.size()},  {"chunks", r.chunks},      {"scored", r.scored},
                        {"mean_nll", r.mean_nll()}, {"perplexity", r.perplexity()}, {"running", r.running}};
    std::cout << j.dump() << "\n";
  } else {
    std::printf("perplexity %.4f (mean NLL %.6f) over %lld chunks of %lld tokens, %lld tokens scored\n",
                r.perplexity(), r.mean_nll(), (long long)r.chunks, (long long)o.ctx, (long long)r.scored);
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
  add_engine_flags(*sub, o->engine);
  sub->callback([o, &action] { action = [o] { return run_perplexity(*o); }; });
}

}  // namespace serval::cli
