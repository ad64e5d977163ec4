#pragma once
// Helpers for the Engine acceptance tests: the stories260K model (loaded once)
// with runners of any KV pool size, reading a request's events to its end,
// and reading a metric from the registry's exposition text.
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
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
// model's 512 (RoPE extends to any position; the weights were trained on 512).
std::unique_ptr<ModelRunner> stories_runner(int64_t kv_cache_tokens = 0, int64_t max_position = 0);

// A text of about `n` stories260K tokens: the golden story and a few other
// sentences, repeated; every id is a real token of natural text.
std::vector<int32_t> story_tokens(size_t n);

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

// A ModelRunner wrapper counting the tokens and sequences it computes.
class CountingRunner : public ModelRunner {
 public:
  explicit CountingRunner(ModelRunner& inner) : inner_(inner) {}
  void forward(const Batch& batch, std::vector<float>& logits) override;
  void copy_blocks(const std::vector<std::pair<int32_t, int32_t>>& src_dst) override {
    inner_.copy_blocks(src_dst);
  }
  const ModelConfig& config() const override { return inner_.config(); }
  int32_t block_size() const override { return inner_.block_size(); }
  int64_t num_blocks() const override { return inner_.num_blocks(); }
  // Tokens computed so far (all forwards); read after the requests finished.
  int64_t tokens() const { return tokens_.load(); }
  int64_t forwards() const { return forwards_.load(); }

 private:
  ModelRunner& inner_;
  std::atomic<int64_t> tokens_{0}, forwards_{0};
};

}  // namespace serval::testing
