#pragma once
// The engine's requests as their clients see them: for each request in the
// scheduler, its channel and, per sample, the text state (the incremental
// detokenizer, stop strings) and how many tokens were sent. It turns the
// scheduler's sequences into events (a stop string ends a sample), makes
// each sample's final event with its metrics, and hands the events out with
// the channels they go to. Loop thread only.
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "engine/engine_metrics.h"
#include "engine/request_output.h"
#include "sampling/sampler.h"
#include "sched/sequence.h"
#include "sched/stop_strings.h"
#include "tokenizer/tokenizer.h"

namespace serval {

class OutputProcessor {
 public:
  using SampleKey = std::pair<int64_t, int32_t>;  // (request id, sample index)
  using EventMap = std::map<SampleKey, RequestEvent>;
  struct Outgoing {
    std::shared_ptr<RequestChannel> channel;
    RequestEvent event;
    bool ends_request = false;  // the request's last final event
  };
  // What a request brings when the scheduler takes it.
  struct NewRequest {
    int64_t id = -1;
    std::shared_ptr<RequestChannel> channel;
    int32_t n = 1;
    bool skip_special_tokens = true;
    bool want_logprobs = false;
    int32_t prompt_logprobs = -1;  // SamplingParams::prompt_logprobs
    int64_t num_prompt_tokens = 0;
    int64_t max_tokens = 0;
    EngineClock::time_point arrival;
    const std::optional<StopStringMatcher>* stops = nullptr;  // copied into each sample
  };

  OutputProcessor(const Tokenizer& tokenizer, EngineMetrics& metrics);
  ~OutputProcessor();
  OutputProcessor(const OutputProcessor&) = delete;
  OutputProcessor& operator=(const OutputProcessor&) = delete;

  void add(const NewRequest& r);
  bool has(int64_t id) const { return active_.count(id) > 0; }
  std::vector<int64_t> ids() const;
  // The request's first chunk starts at `when`, with `cached` prompt tokens from the prefix cache.
  void scheduled(int64_t id, EngineClock::time_point when, int64_t cached);
  // The scores of the request's prompt tokens first_position + 1, ...
  // (one result each; see StepRows), kept until its samples' first events.
  void prompt_scored(int64_t id, int64_t first_position, std::span<SampleResult> results);
  // Adds the tokens of `seq` not yet sent to its event; true when a stop
  // string ended the sample (the scheduler is to abort it).
  bool emit_tokens(const Sequence& seq, EventMap& events, IterationStats& it, EngineClock::time_point now);
  // The final events of a finished sequence, and of the samples it would
  // have forked had its prompt completed.
  void finish(const Sequence& seq, EventMap& events, IterationStats& it, const std::string& error,
              EngineClock::time_point now);
  // The events worth sending, each with its channel, appended to `out`; a
  // request whose last final event goes is forgotten.
  void collect(EventMap& events, std::vector<Outgoing>& out);

 private:
  struct Sample;
  struct Active;
  void append_text(Sample& sample, const std::string& piece, RequestEvent& event);
  void emit_tokens(Active& a, const Sequence& seq, RequestEvent& ev, IterationStats& it, EngineClock::time_point now);
  // Final event of one sample that ended with `seq` (or, for samples never
  // forked, with their parent's reason).
  void finish_sample(Active& a, int64_t id, int32_t index, const Sequence* seq, FinishReason reason, EventMap& events,
                     IterationStats& it, const std::string& error, EngineClock::time_point now);

  const Tokenizer& tokenizer_;
  EngineMetrics& metrics_;
  std::unordered_map<int64_t, std::unique_ptr<Active>> active_;
};

}  // namespace serval
