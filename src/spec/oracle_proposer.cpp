#include "spec/oracle_proposer.h"

#include <algorithm>

#include "core/error.h"

namespace serval {

OracleProposer::OracleProposer(std::vector<std::vector<int32_t>> sequences, double acceptance, int64_t vocab_size,
                               uint64_t seed)
    : sequences_(std::move(sequences)), acceptance_(acceptance), vocab_size_(vocab_size), rng_(seed) {
  SERVAL_CHECK(acceptance >= 0.0 && acceptance <= 1.0, "--oracle-acceptance must be in [0, 1], got ", acceptance);
  SERVAL_CHECK(vocab_size >= 2, "oracle proposer: a vocabulary of ", vocab_size, " tokens");
}

void OracleProposer::propose(std::span<const int32_t> tokens, int32_t max_tokens, std::vector<int32_t>& draft) {
  draft.clear();
  const size_t len = tokens.size();
  for (const std::vector<int32_t>& s : sequences_) {
    if (s.size() <= len || !std::equal(tokens.begin(), tokens.end(), s.begin())) continue;
    const size_t count = std::min(size_t(std::max(max_tokens, 0)), s.size() - len);
    std::uniform_real_distribution<double> u(0.0, 1.0);
    for (size_t j = 0; j < count; ++j) {
      const int32_t truth = s[len + j];
      draft.push_back(u(rng_) < acceptance_ ? truth : int32_t((truth + 1) % vocab_size_));
    }
    return;
  }
}

}  // namespace serval
