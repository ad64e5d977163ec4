// serval generate: one prompt, offline, streamed to stdout as it is produced.
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/error.h"
#include "engine/generator.h"
#include "model/model_loader.h"
#include "runtime/model_runner.h"
#include "tokenizer/tokenizer.h"

namespace serval::cli {
namespace {

struct GenerateOptions {
  std::string model;
  std::string prompt;
  int32_t max_tokens = 256;
  SamplingParams sampling;
  bool ignore_eos = false;
  bool no_special = false;
  bool json = false;
  bool dump_logits = false;
  RunnerOptions runner;
};

// The model to use when none is given, with a message that says how to get one.
std::string default_model() {
  const std::string path = models_dir() + "/stories260K/stories260K.gguf";
  if (!std::filesystem::exists(path))
    fail("no --model given and the default model ", path,
         " does not exist: pass --model PATH (a .gguf file or a Hugging Face folder), or set "
         "SERVAL_MODELS to the folder that holds stories260K/stories260K.gguf");
  return path;
}

nlohmann::json logprobs_json(const Logprobs& lp) {
  nlohmann::json top = nlohmann::json::array();
  for (const auto& t : lp.top) top.push_back({{"token", t.token}, {"logprob", t.logprob}});
  return {{"logprob", lp.chosen}, {"rank", lp.chosen_rank}, {"top", top}};
}

int run_generate(GenerateOptions o) {
  if (o.model.empty()) o.model = default_model();
  o.sampling.validate();
  const auto t_load = std::chrono::steady_clock::now();
  LoadedModel model = load_model(o.model);
  std::unique_ptr<Tokenizer> tok = load_tokenizer(o.model);
  std::unique_ptr<ModelRunner> runner = ModelRunner::create(model.config, model.weights, o.runner);
  const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_load).count();

  GenerationRequest req;
  req.prompt_ids = tok->encode(o.prompt, !o.no_special);
  req.params = o.sampling;
  req.stop.max_tokens = o.max_tokens;
  req.stop.eos_token_ids = tok->eos_ids;
  if (req.stop.eos_token_ids.empty() && tok->eos_id >= 0) req.stop.eos_token_ids = {tok->eos_id};
  req.stop.ignore_eos = o.ignore_eos;

  IncrementalDetokenizer detok(*tok, /*skip_special=*/true, /*first_in_text=*/req.prompt_ids.empty());
  std::string text;
  std::vector<float> prompt_logits;
  Generator generator(*runner);
  GenerationResult result = generator.generate({req}, [&](const TokenEvent& ev) {
    if (o.dump_logits && prompt_logits.empty()) prompt_logits.assign(ev.logits.begin(), ev.logits.end());
    std::string piece = detok.push(ev.token);
    if (ev.finish != FinishReason::kNone) piece += detok.flush();
    text += piece;
    if (!o.json && !piece.empty()) {
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
    }
  });
  const SequenceOutput& out = result.sequences.at(0);
  const GenerationStats& st = result.stats;

  if (o.json) {
    nlohmann::json j = {
        {"prompt_token_ids", out.prompt_ids},
        {"token_ids", out.token_ids},
        {"text", text},
        {"finish_reason", finish_reason_name(out.finish_reason)},
        {"seed", out.seed},
        {"timings",
         {{"load_s", load_s},
          {"time_to_first_token_s", out.time_to_first_token_s},
          {"prefill_tokens_per_s", st.prefill_tokens_per_s()},
          {"decode_tokens_per_s", st.decode_tokens_per_s()},
          {"total_s", st.total_s}}}};
    if (!out.logprobs.empty()) {
      nlohmann::json lps = nlohmann::json::array();
      for (const auto& lp : out.logprobs) lps.push_back(logprobs_json(lp));
      j["logprobs"] = lps;
    }
    if (o.dump_logits) j["prompt_logits"] = prompt_logits;
    std::cout << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  } else {
    std::fputc('\n', stdout);
  }
  std::fflush(stdout);  // the text ends before the stats line on a shared terminal
  std::fprintf(stderr,
               "prompt: %lld tokens | time to first token: %.1f ms | decode: %lld tokens at %.1f tokens/s"
               " | finish: %s\n",
               (long long)st.prompt_tokens, out.time_to_first_token_s * 1e3, (long long)st.decode_tokens,
               st.decode_tokens_per_s(), finish_reason_name(out.finish_reason));
  return 0;
}

}  // namespace

void register_generate(CLI::App& app, Action& action) {
  auto o = std::make_shared<GenerateOptions>();
  auto* sub = app.add_subcommand("generate", "Generate a continuation of one prompt");
  sub->add_option("--model,-m", o->model, "GGUF file or Hugging Face folder (default: stories260K)");
  sub->add_option("--prompt,-p", o->prompt, "prompt text")->required();
  sub->add_option("--max-tokens,-n", o->max_tokens, "tokens to generate at most");
  sub->add_option("--temperature,-t", o->sampling.temperature, "0 for greedy");
  sub->add_option("--top-p", o->sampling.top_p, "nucleus sampling mass in (0, 1]");
  sub->add_option("--top-k", o->sampling.top_k, "keep the k most likely tokens (0: all)");
  sub->add_option("--min-p", o->sampling.min_p, "drop tokens under min_p x the top probability");
  sub->add_option("--repetition-penalty", o->sampling.repetition_penalty, "HF-style, 1 disables");
  sub->add_option("--presence-penalty", o->sampling.presence_penalty, "OpenAI-style, in [-2, 2]");
  sub->add_option("--frequency-penalty", o->sampling.frequency_penalty, "OpenAI-style, in [-2, 2]");
  sub->add_option("--seed", o->sampling.seed, "seed for reproducible sampling");
  sub->add_option("--logprobs", o->sampling.logprobs, "report the chosen token's logprob and the top N (with --json)");
  sub->add_flag("--ignore-eos", o->ignore_eos, "keep generating past end-of-sequence tokens");
  sub->add_flag("--no-special", o->no_special, "do not add BOS/EOS around the prompt");
  sub->add_flag("--json", o->json, "print one JSON object instead of streaming text");
  sub->add_flag("--dump-logits", o->dump_logits, "with --json: add the prompt's last-position logits");
  sub->add_option("--kv-cache-tokens", o->runner.kv_cache_tokens, "KV pool size in tokens (default: automatic)");
  sub->add_option("--threads", o->runner.threads, "CPU threads (default: all cores)");
  sub->add_option("--device", o->runner.device, "cpu or cuda (default: cpu)");
  sub->callback([&action, o] { action = [o] { return run_generate(*o); }; });
}

}  // namespace serval::cli
