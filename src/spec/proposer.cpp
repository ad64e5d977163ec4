#include "spec/proposer.h"

#include "core/error.h"
#include "spec/ngram_proposer.h"

namespace serval {

void SpeculativeConfig::validate() const {
  SERVAL_CHECK(method == "none" || method == "ngram" || method == "oracle",
               "--speculative must be none, ngram or oracle (serval bench only), got '", method, "'");
  SERVAL_CHECK(num_tokens >= 1 && num_tokens <= kMaxTokens, "--num-speculative-tokens must be in [1, ", kMaxTokens,
               "], got ", num_tokens);
  SERVAL_CHECK(ngram_min >= 1, "--ngram-min must be at least 1, got ", ngram_min);
  SERVAL_CHECK(ngram_max >= ngram_min, "--ngram-max (", ngram_max, ") must be at least --ngram-min (", ngram_min, ")");
  SERVAL_CHECK(oracle_acceptance >= 0.0 && oracle_acceptance <= 1.0, "--oracle-acceptance must be in [0, 1], got ",
               oracle_acceptance);
}

std::unique_ptr<Proposer> make_proposer(const SpeculativeConfig& config) {
  config.validate();
  if (config.method == "ngram") return std::make_unique<NgramProposer>(config.ngram_min, config.ngram_max);
  SERVAL_CHECK(config.method != "oracle", "--speculative oracle needs the target's greedy continuations: only "
               "serval bench --mode engine runs it (it records them first)");
  return nullptr;
}

}  // namespace serval
