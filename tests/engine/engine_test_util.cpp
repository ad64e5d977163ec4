#include "engine_test_util.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <sstream>

#include "../runtime/stories_golden.h"
#include "core/error.h"
#include "kv/kv_calibration_text.h"

namespace serval::testing {

EngineRequest greedy_request(std::vector<int32_t> prompt, int64_t max_tokens, bool ignore_eos) {
  EngineRequest r;
  r.prompt_ids = std::move(prompt);
  r.params.temperature = 0.0f;
  r.stop.max_tokens = max_tokens;
  r.stop.ignore_eos = ignore_eos;
  return r;
}

const StoriesModel& stories_model() {
  static const StoriesModel* m = [] {
    const std::string path = models_dir() + "/stories260K/stories260K.gguf";
    if (!std::filesystem::exists(path)) throw Error(path + " not found (set SERVAL_MODELS)");
    return new StoriesModel{load_model(path), load_tokenizer(path)};
  }();
  return *m;
}

std::unique_ptr<ModelRunner> stories_runner(int64_t kv_cache_tokens, int64_t max_position,
                                            const std::string& kv_cache_dtype) {
  const StoriesModel& m = stories_model();
  ModelConfig config = m.model.config;
  if (max_position > 0) config.max_position = max_position;
  RunnerOptions opts;
  // One thread: the model is too small to gain from more, and OpenMP workers
  // spinning between a step's many small parallel regions slow the engine
  // down many times over when the machine is busy.
  opts.threads = 1;
  opts.kv_cache_tokens = kv_cache_tokens;
  opts.kv_cache_dtype = kv_cache_dtype;
  if (kv_cache_dtype != "auto") opts.kv_calibration_tokens = m.tok->encode(kKvCalibrationText, true);
  return ModelRunner::create(config, m.model.weights, opts);
}

std::vector<int32_t> story_tokens(size_t n) {
  const Tokenizer& tok = *stories_model().tok;
  const auto& golden = stories_reference_ids();
  std::vector<std::vector<int32_t>> parts = {std::vector<int32_t>(golden.begin() + 1, golden.end())};
  for (const char* text :
       {" Tom and his dog went to the park. They played with a red ball all day.",
        " The little bird sang a happy song in the tall tree.",
        " Mom made a big cake for Lily. Lily said thank you and gave her a hug.",
        " One day, a small cat found a box. The cat was very curious and jumped in."})
    parts.push_back(tok.encode(text, false));
  std::vector<int32_t> out;
  for (size_t i = 0; out.size() < n; ++i) {
    const auto& p = parts[i % parts.size()];
    out.insert(out.end(), p.begin(), p.end());
  }
  out.resize(n);
  return out;
}

Collected collect(RequestHandle& h) {
  Collected c;
  for (;;) {
    std::optional<RequestEvent> ev = h.next(std::chrono::milliseconds(60000));
    if (!ev) throw Error("no event within 60 s");
    ++c.events;
    EXPECT_EQ(ev->request_id, h.id());
    c.tokens.insert(c.tokens.end(), ev->token_ids.begin(), ev->token_ids.end());
    c.text += ev->text;
    if (ev->finished()) {
      c.final_event = *ev;
      EXPECT_FALSE(h.next(std::chrono::milliseconds(1)).has_value()) << "event after the final one";
      return c;
    }
  }
}

double metric_value(const std::string& exposition, const std::string& sample) {
  std::istringstream in(exposition);
  std::string line;
  const std::string prefix = sample + " ";
  while (std::getline(in, line))
    if (line.compare(0, prefix.size(), prefix) == 0) return std::stod(line.substr(prefix.size()));
  return -1;
}

void CountingRunner::forward(const Batch& batch, std::vector<float>& logits) {
  tokens_ += batch.num_tokens();
  ++forwards_;
  inner_.forward(batch, logits);
}

}  // namespace serval::testing
