// serval generate: one prompt, offline, through the Engine, streamed to stdout
// as it is produced; or, with --input/--output, a JSONL batch (batch.cpp).
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli/batch.h"
#include "cli/commands.h"
#include "cli/engine_flags.h"
#include "cli/generate_options.h"
#include "core/error.h"
#include "engine/batch_builder.h"
#include "engine/engine.h"
#include "kv/kv_cache_manager.h"

namespace serval::cli {
namespace {

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

// The raw logits of the prompt's last position (--dump-logits). The Engine
// only hands out sampled tokens, so this is one direct forward over the
// runner's KV pool, made before the engine starts (it then overwrites the
// blocks; its own KV manager never reads what it did not write).
std::vector<float> last_prompt_logits(ModelRunner& runner, const std::vector<int32_t>& prompt) {
  KvCacheManager kv(runner.num_blocks(), runner.block_size());
  Sequence seq(0, prompt, SamplingParams{}, StopCriteria{}, kv.new_table());
  SERVAL_CHECK(kv.allocate_slots(seq.block_table(), seq.num_tokens()).has_value(), "the prompt's ",
               prompt.size(), " tokens do not fit in the KV cache");
  Batch batch;
  const std::vector<ScheduledChunk> items = {{&seq, int32_t(seq.num_tokens())}};
  BatchBuilder(runner.block_size()).build(items, batch);
  std::vector<float> logits;
  runner.forward(batch, logits);
  return logits;
}

double seconds_between(EngineClock::time_point a, EngineClock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

int run_single(const GenerateOptions& o, const std::string& model_path) {
  const auto t_load = std::chrono::steady_clock::now();
  LoadedEngineModel m = load_engine_model(model_path, o.engine);
  const double load_s = seconds_between(t_load, std::chrono::steady_clock::now());

  EngineRequest req = o.request(*m.tokenizer);
  req.prompt_ids = m.tokenizer->encode(o.prompt, !o.no_special);
  std::vector<float> prompt_logits;
  Engine engine(*m.runner, *m.tokenizer, engine_options(o.engine));
  engine.check(req);
  if (o.dump_logits) prompt_logits = last_prompt_logits(*m.runner, req.prompt_ids);

  RequestHandle h = engine.submit(req);
  std::vector<int32_t> tokens;
  std::vector<Logprobs> logprobs;
  std::string text;
  RequestEvent last;
  for (;;) {
    std::optional<RequestEvent> ev = h.next();
    if (!ev) fail("the engine ended the request without a final event");
    tokens.insert(tokens.end(), ev->token_ids.begin(), ev->token_ids.end());
    logprobs.insert(logprobs.end(), ev->logprobs.begin(), ev->logprobs.end());
    text += ev->text;
    if (!o.json && !ev->text.empty()) {
      std::fwrite(ev->text.data(), 1, ev->text.size(), stdout);
      std::fflush(stdout);
    }
    if (ev->finished()) {
      last = std::move(*ev);
      break;
    }
  }
  if (last.finish == FinishReason::kError) fail("generation failed: ", last.error);

  const RequestTimings& t = last.timings;
  const EngineClock::time_point finish = t.finish.value_or(EngineClock::now());
  const double ttft = t.first_token ? seconds_between(t.arrival, *t.first_token) : 0.0;
  const double total = seconds_between(t.arrival, finish);
  const double decode_s = t.first_token ? seconds_between(*t.first_token, finish) : 0.0;
  const int64_t decode_tokens = tokens.empty() ? 0 : int64_t(tokens.size()) - 1;
  const double decode_tps = decode_s > 0 ? double(decode_tokens) / decode_s : 0.0;
  const double prefill_tps = ttft > 0 ? double(req.prompt_ids.size()) / ttft : 0.0;
  const char* finish_name = finish_reason_name(last.finish);

  if (o.json) {
    nlohmann::json j = {
        {"prompt_token_ids", req.prompt_ids},
        {"token_ids", tokens},
        {"text", text},
        {"finish_reason", finish_name},
        {"seed", *req.params.seed},
        {"timings",
         {{"load_s", load_s},
          {"time_to_first_token_s", ttft},
          {"prefill_tokens_per_s", prefill_tps},
          {"decode_tokens_per_s", decode_tps},
          {"total_s", total}}}};
    if (!logprobs.empty()) {
      nlohmann::json lps = nlohmann::json::array();
      for (const auto& lp : logprobs) lps.push_back(logprobs_json(lp));
      j["logprobs"] = lps;
    }
    if (o.dump_logits) j["prompt_logits"] = prompt_logits;
    std::cout << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  } else {
    std::fputc('\n', stdout);
  }
  std::fflush(stdout);  // the text ends before the stats line on a shared terminal
  std::fprintf(stderr,
               "prompt: %zu tokens | time to first token: %.1f ms | decode: %lld tokens at %.1f tokens/s"
               " | finish: %s\n",
               req.prompt_ids.size(), ttft * 1e3, (long long)decode_tokens, decode_tps, finish_name);
  return 0;
}

int run_generate(const GenerateOptions& o) {
  const bool batch = !o.input.empty() || !o.output.empty();
  if (batch) {
    SERVAL_CHECK(!o.input.empty() && !o.output.empty(),
                 "batch mode needs both --input FILE.jsonl and --output FILE.jsonl");
    SERVAL_CHECK(o.prompt.empty(), "give either --prompt or --input, not both");
  } else {
    SERVAL_CHECK(!o.prompt.empty(), "give --prompt TEXT (or --input FILE.jsonl --output FILE.jsonl)");
  }
  o.sampling.validate();
  const std::string model = o.model.empty() ? default_model() : o.model;
  return batch ? run_batch(o, model) : run_single(o, model);
}

}  // namespace

void register_generate(CLI::App& app, Action& action) {
  auto o = std::make_shared<GenerateOptions>();
  auto* sub = app.add_subcommand(
      "generate", "Generate a continuation of one prompt, or of every request of a JSONL file");
  sub->add_option("--model,-m", o->model, "GGUF file or Hugging Face folder (default: stories260K)");
  sub->add_option("--prompt,-p", o->prompt, "prompt text");
  sub->add_option("--input,-i", o->input,
                  "JSONL file, one OpenAI completions request per line (batch mode)");
  sub->add_option("--output,-o", o->output, "JSONL file for the results (batch mode)");
  sub->add_option("--max-tokens,-n", o->max_tokens, "tokens to generate at most");
  sub->add_option("--min-tokens", o->min_tokens, "tokens to generate at least (EOS is masked before)");
  sub->add_option("--temperature,-t", o->sampling.temperature, "0 for greedy");
  sub->add_option("--top-p", o->sampling.top_p, "nucleus sampling mass in [0, 1] (0: the most likely token alone)");
  sub->add_option("--top-k", o->sampling.top_k, "keep the k most likely tokens (0: all)");
  sub->add_option("--min-p", o->sampling.min_p, "drop tokens under min_p x the top probability");
  sub->add_option("--repetition-penalty", o->sampling.repetition_penalty, "HF-style, 1 disables");
  sub->add_option("--presence-penalty", o->sampling.presence_penalty, "OpenAI-style, in [-2, 2]");
  sub->add_option("--frequency-penalty", o->sampling.frequency_penalty, "OpenAI-style, in [-2, 2]");
  sub->add_option("--seed", o->sampling.seed, "seed for reproducible sampling");
  sub->add_option("--logprobs", o->sampling.logprobs, "report the chosen token's logprob and the top N (with --json)");
  sub->add_option("--stop", o->stop, "stop string (repeatable); the text ends before it");
  sub->add_flag("--ignore-eos", o->ignore_eos, "keep generating past end-of-sequence tokens");
  sub->add_flag("--no-special", o->no_special, "do not add BOS/EOS around the prompt");
  sub->add_flag("--json", o->json, "print one JSON object instead of streaming text");
  sub->add_flag("--dump-logits", o->dump_logits, "with --json: add the prompt's last-position logits");
  sub->add_flag("--no-progress", o->no_progress, "batch mode: no progress bar");
  add_engine_flags(*sub, o->engine);
  sub->callback([&action, o] { action = [o] { return run_generate(*o); }; });
}

}  // namespace serval::cli
