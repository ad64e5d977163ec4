#pragma once
// Constraints: the grammar state of each constrained sample (structured
// output, tool calls): one GrammarMatcher per (request, sample), caught up
// with the sample's committed output tokens when its next mask is needed.
// Near max_tokens a sample is steered to its grammar's nearest end
// (grammar/closing_mask.h), so that its text parses whenever it can fit.
// The masks are of the model's vocabulary (tokens past the tokenizer's, as
// in a padded embedding, are never allowed). A row whose previous token is
// still in flight cannot be masked yet: the engine queues such a
// continuation's forward pass and makes its masks once the step before is
// committed (Engine::start_deferred_sampling). Loop thread only.
#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "grammar/grammar_matcher.h"
#include "grammar/token_mask.h"
#include "sched/sequence.h"

namespace serval {

class Constraints {
 public:
  explicit Constraints(int64_t vocab_size) : vocab_size_(vocab_size) {}

  void add(int64_t id, std::shared_ptr<const grammar::TokenMasker> masker);
  bool has(int64_t id) const { return requests_.count(id) > 0; }
  void remove(int64_t id) { requests_.erase(id); }
  // Words of a mask: (vocab_size + 31) / 32.
  size_t mask_words() const { return size_t((vocab_size_ + 31) / 32); }
  // A sample of a constrained request, and where its mask goes (mask_words() words).
  struct Job {
    const Sequence* seq = nullptr;
    std::span<uint32_t> mask;
  };
  // The tokens each job's sample may draw next, after its output so far, in
  // parallel (a step's masks take milliseconds on one thread at 64
  // constrained rows of a 128k vocabulary). Each sample at most once. Throws
  // serval::Error naming the request when an output token was not one the
  // grammar allowed (the first failing job's error).
  void fill_all(std::span<const Job> jobs);

 private:
  struct Sample {
    explicit Sample(std::shared_ptr<const grammar::CompiledGrammar> g) : matcher(std::move(g)) {}
    grammar::GrammarMatcher matcher;
    size_t consumed = 0;  // output tokens the matcher has taken
  };
  struct Request {
    std::shared_ptr<const grammar::TokenMasker> masker;
    std::map<int32_t, std::unique_ptr<Sample>> samples;  // by sample index
  };
  // The sample's matcher, made on first use (not thread-safe: fill_all makes
  // them before it fills in parallel).
  Sample& sample_of(const Sequence& seq);
  // Catches the matcher up with the output and writes the mask (thread-safe
  // for different samples: the masker's cache is locked).
  void fill_from(const Sequence& seq, Sample& s, std::span<uint32_t> mask) const;

  int64_t vocab_size_;
  // fill_all's scratch, kept across steps.
  std::vector<Sample*> job_samples_;
  std::vector<std::exception_ptr> job_errors_;
  std::unordered_map<int64_t, Request> requests_;
};

}  // namespace serval
