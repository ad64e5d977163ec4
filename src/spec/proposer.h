#pragma once
// Proposer: where speculative decoding's draft tokens come from (DESIGN.md
// §3, "Speculative decoding in the same rule"). Given a sequence's tokens
// (prompt then output), it proposes up to `max_tokens` tokens that the
// target model is likely to produce next; the engine verifies them in one
// forward pass (spec/verify.h). A proposer is deterministic in the tokens it
// is given (it draws no random numbers): verification then needs no draft
// distribution (see verify.h). Engine loop thread only.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace serval {

class Proposer {
 public:
  virtual ~Proposer() = default;
  // Replaces `draft` with at most max_tokens proposed tokens (empty: no
  // proposal; the row decodes one token as without speculation).
  virtual void propose(std::span<const int32_t> tokens, int32_t max_tokens, std::vector<int32_t>& draft) = 0;
};

// Speculative decoding's settings (flags --speculative,
// --num-speculative-tokens, --ngram-max, --ngram-min).
struct SpeculativeConfig {
  std::string method = "none";  // none | ngram | oracle (serval bench only)
  int32_t num_tokens = 3;       // k: draft tokens per row and step, 1..8
  int32_t ngram_max = 4;        // longest suffix matched
  int32_t ngram_min = 1;        // shortest suffix matched
  double oracle_acceptance = 0.8;  // oracle: the chance each draft token is right
  static constexpr int32_t kMaxTokens = 8;

  bool enabled() const { return method != "none"; }
  // Throws serval::Error naming the flag and the value.
  void validate() const;
};

// The proposer `config` names, or nullptr for "none". Throws like
// validate(), and for "oracle", which needs the target's continuations
// (spec/oracle_proposer.h: serval bench makes it).
std::unique_ptr<Proposer> make_proposer(const SpeculativeConfig& config);

}  // namespace serval
