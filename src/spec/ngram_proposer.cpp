#include "spec/ngram_proposer.h"

#include <algorithm>

#include "core/error.h"

namespace serval {

NgramProposer::NgramProposer(int32_t ngram_min, int32_t ngram_max) : ngram_min_(ngram_min), ngram_max_(ngram_max) {
  SERVAL_CHECK(ngram_min >= 1 && ngram_min <= ngram_max, "n-gram proposer: need 1 <= --ngram-min <= --ngram-max, got ",
               ngram_min, " and ", ngram_max);
}

void NgramProposer::propose(std::span<const int32_t> tokens, int32_t max_tokens, std::vector<int32_t>& draft) {
  draft.clear();
  const int64_t len = int64_t(tokens.size());
  if (max_tokens <= 0) return;
  for (int64_t n = std::min<int64_t>(ngram_max_, len - 1); n >= ngram_min_; --n) {
    const auto suffix = tokens.subspan(size_t(len - n));
    // The most recent earlier occurrence: it ends before the suffix itself
    // (start + n <= len - 1, so at least one token follows it).
    for (int64_t start = len - n - 1; start >= 0; --start) {
      if (!std::equal(suffix.begin(), suffix.end(), tokens.begin() + start)) continue;
      const int64_t from = start + n;
      const int64_t count = std::min<int64_t>(max_tokens, len - from);
      draft.assign(tokens.begin() + from, tokens.begin() + from + count);
      return;
    }
  }
}

}  // namespace serval
