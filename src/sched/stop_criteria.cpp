#include "sched/stop_criteria.h"

#include <algorithm>

#include "core/error.h"

namespace serval {

const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kAbort: return "abort";
    case FinishReason::kTimeout: return "timeout";
    case FinishReason::kError: return "error";
    case FinishReason::kNone: break;
  }
  return nullptr;
}

void StopCriteria::validate() const {
  SERVAL_CHECK(max_tokens >= 1, "max_tokens must be at least 1, got ", max_tokens);
  for (int32_t id : stop_token_ids)
    SERVAL_CHECK(id >= 0, "stop_token_ids must be token ids (>= 0), got ", id);
  SERVAL_CHECK(min_tokens >= 0 && min_tokens <= max_tokens,
               "min_tokens must be in [0, max_tokens = ", max_tokens, "], got ", min_tokens);
}

FinishReason StopCriteria::check(int32_t token, int64_t num_output, int64_t num_tokens,
                                 int64_t max_model_len) const {
  auto contains = [token](const std::vector<int32_t>& ids) {
    return std::find(ids.begin(), ids.end(), token) != ids.end();
  };
  // With min_tokens the first min_tokens outputs cannot stop (vLLM masks them).
  if (num_output > min_tokens) {
    if (!ignore_eos && contains(eos_token_ids)) return FinishReason::kStop;
    if (contains(stop_token_ids)) return FinishReason::kStop;
  }
  if (num_output >= max_tokens) return FinishReason::kLength;
  if (max_model_len > 0 && num_tokens >= max_model_len) return FinishReason::kLength;
  return FinishReason::kNone;
}

std::vector<int32_t> StopCriteria::banned_tokens(int64_t num_output) const {
  if (num_output >= min_tokens) return {};
  std::vector<int32_t> out = stop_token_ids;
  if (!ignore_eos) out.insert(out.end(), eos_token_ids.begin(), eos_token_ids.end());
  return out;
}

}  // namespace serval
