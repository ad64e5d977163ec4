#pragma once
// Helpers for the Engine acceptance tests: the stories260K model (loaded once)
// with runners of any KV pool size, reading a request's events to its end,
// and reading a metric from the registry's exposition text.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "engine/engine.h"
#include "model/model_loader.h"
#include "runtime/model_runner.h"
#include "tokenizer/tokenizer.h"

namespace serval::testing {

struct StoriesModel {
  LoadedModel model;
  std::unique_ptr<Tokenizer> tok;
};

// stories260K from SERVAL_MODELS, loaded once; throws if it is missing.
const StoriesModel& stories_model();

// A CPU runner of stories260K with a pool of `kv_cache_tokens` (0: the runner's
// default) and, when max_position > 0, that context length instead of the
// model's 512 (RoPE extends to any position; the weights were trained on 512);
// KV pools of `kv_cache_dtype` (RunnerOptions), calibrated on the built-in
// text where quantized.
std::unique_ptr<ModelRunner> stories_runner(int64_t kv_cache_tokens = 0, int64_t max_position = 0,
                                            const std::string& kv_cache_dtype = "auto");

// A text of about `n` stories260K tokens: the golden story and a few other
// sentences, repeated; every id is a real token of natural text.
std::vector<int32_t> story_tokens(size_t n);

// A greedy request for up to max_tokens tokens (ignore_eos: exactly that many).
EngineRequest greedy_request(std::vector<int32_t> prompt, int64_t max_tokens, bool ignore_eos = false);

// Every event of one request, up to and including its final one.
struct Collected {
  std::vector<int32_t> tokens;
  std::string text;
  RequestEvent final_event;
  int events = 0;
};
// Reads `h` to its final event (failing the test after 60 s without one) and
// checks that nothing follows it.
Collected collect(RequestHandle& h);

// The value of the sample `name{labels}` (labels as written in the
// exposition, e.g. model_name="serval"), or -1 if absent.
double metric_value(const std::string& exposition, const std::string& sample);

// A ModelRunner that passes every call to `inner`; test runners override
// forward() to count, slow down or fail steps.
class WrappedRunner : public ModelRunner {
 public:
  explicit WrappedRunner(ModelRunner& inner) : inner_(inner) {}
  void forward(const Batch& batch, std::vector<float>& logits) override {
    inner_.forward(batch, logits);
  }
  void copy_blocks(const std::vector<std::pair<int32_t, int32_t>>& src_dst) override {
    inner_.copy_blocks(src_dst);
  }
  const ModelConfig& config() const override { return inner_.config(); }
  int32_t block_size() const override { return inner_.block_size(); }
  int64_t num_blocks() const override { return inner_.num_blocks(); }

 protected:
  ModelRunner& inner_;
};

// Counts the tokens and sequences it computes.
class CountingRunner : public WrappedRunner {
 public:
  using WrappedRunner::WrappedRunner;
  void forward(const Batch& batch, std::vector<float>& logits) override;
  // Tokens computed so far (all forwards); read after the requests finished.
  int64_t tokens() const { return tokens_.load(); }
  int64_t forwards() const { return forwards_.load(); }

 private:
  std::atomic<int64_t> tokens_{0}, forwards_{0};
};

// The real runner, 2 ms slower per step: 500 tokens then take over a second, so
// an abort sent after the first event lands mid-generation even on a loaded machine.
class SlowRunner : public WrappedRunner {
 public:
  using WrappedRunner::WrappedRunner;
  void forward(const Batch& batch, std::vector<float>& logits) override {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    inner_.forward(batch, logits);
  }
};

}  // namespace serval::testing
