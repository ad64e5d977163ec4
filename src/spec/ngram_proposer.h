#pragma once
// N-gram (prompt lookup) proposer: the last n tokens of the sequence, for n
// from ngram_max down to ngram_min, are looked up in the tokens before them
// (prompt and output so far); at the most recent earlier occurrence of the
// longest suffix that occurs, the tokens that followed it are the draft.
// Text that repeats what came before (copying, editing, code) is drafted
// well; otherwise nothing is proposed.
#include "spec/proposer.h"

namespace serval {

class NgramProposer : public Proposer {
 public:
  // Throws serval::Error unless 1 <= ngram_min <= ngram_max.
  NgramProposer(int32_t ngram_min, int32_t ngram_max);
  void propose(std::span<const int32_t> tokens, int32_t max_tokens, std::vector<int32_t>& draft) override;

 private:
  int32_t ngram_min_, ngram_max_;
};

}  // namespace serval
