#pragma once
// Oracle proposer, for benchmarks only (--speculative oracle, serval bench
// --mode engine): it knows each request's greedy continuation (recorded by a
// run without speculation) and drafts its next tokens, each one right with
// probability `acceptance` and independently of the others (a wrong one is
// the right one + 1), so that the machinery's overhead can be measured
// against the ideal speedup (1 - A^(k+1)) / (1 - A) on any model, random
// weights included. A sequence it does not know gets no draft.
#include <random>

#include "spec/proposer.h"

namespace serval {

class OracleProposer : public Proposer {
 public:
  // `sequences`: each request's prompt followed by its greedy continuation.
  // Throws serval::Error unless 0 <= acceptance <= 1 and vocab_size >= 2.
  OracleProposer(std::vector<std::vector<int32_t>> sequences, double acceptance, int64_t vocab_size,
                 uint64_t seed = 1);
  void propose(std::span<const int32_t> tokens, int32_t max_tokens, std::vector<int32_t>& draft) override;

 private:
  std::vector<std::vector<int32_t>> sequences_;
  double acceptance_;
  int64_t vocab_size_;
  std::mt19937_64 rng_;
};

}  // namespace serval
