#pragma once
// When a sequence stops generating, and why (OpenAI finish_reason).
#include <cstdint>
#include <optional>
#include <vector>

namespace serval {

enum class FinishReason {
  kNone,    // still running
  kStop,    // an EOS token or one of stop_token_ids was generated
  kLength,  // max_tokens reached, or the model's context is full
  kAbort,   // cancelled by the client
  kTimeout, // waited or ran past its deadline
  kError,   // failed; the engine reports the message
};

// "stop", "length", "abort", "timeout", "error"; nullptr for kNone (OpenAI's null finish_reason).
const char* finish_reason_name(FinishReason reason);

struct StopCriteria {
  int32_t max_tokens = 16;              // output tokens, >= 1 (OpenAI/vLLM default 16)
  std::vector<int32_t> eos_token_ids;   // the model's end-of-sequence tokens
  bool ignore_eos = false;              // keep generating past EOS
  std::vector<int32_t> stop_token_ids;  // extra tokens that stop (even with ignore_eos)
  // EOS and stop_token_ids cannot be sampled before this many output tokens
  // (vLLM: their logits are masked); <= max_tokens.
  int32_t min_tokens = 0;

  // Throws serval::Error naming the bad field.
  void validate() const;

  // The reason a sequence stops after generating `token` as its output number
  // `num_output` (1-based), with `num_tokens` tokens in total; kNone to go on.
  // Order as vLLM: EOS, then stop tokens, then length.
  FinishReason check(int32_t token, int64_t num_output, int64_t num_tokens,
                     int64_t max_model_len) const;

  // Tokens the sampler must not pick (logit -inf) for the next output when
  // `num_output` outputs exist: while num_output < min_tokens, the stop
  // tokens and, unless ignore_eos, EOS (vLLM's min_tokens); else none.
  std::vector<int32_t> banned_tokens(int64_t num_output) const;
};

}  // namespace serval
