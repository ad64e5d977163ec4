#include "sched/request_fit.h"

#include <algorithm>
#include <limits>

#include "core/error.h"

namespace serval {

int64_t kv_blocks_held(const KvFitLimits& l, int64_t len) {
  const int64_t bs = l.block_size;
  // Every token but the last generated one goes through the model.
  const int64_t all = (len - 1 + bs - 1) / bs;
  if (l.window <= 0) return all;
  // The window behind the step's first token, the step's chunk, and the
  // partial blocks at both ends.
  return std::min(all, (l.window + std::max<int64_t>(l.max_chunk_tokens, 1) + bs - 1) / bs + 1);
}

int64_t context_room(const KvFitLimits& l, int64_t prompt) {
  return l.max_model_len == 0 ? std::numeric_limits<int64_t>::max() : l.max_model_len - prompt;
}

RequestFit request_fit(const KvFitLimits& l, int64_t prompt, int64_t max_tokens) {
  const int64_t max_len = prompt + max_tokens;
  if (max_tokens > context_room(l, prompt)) {
    if (prompt >= l.max_model_len && max_tokens > 0)
      return {Misfit::kPromptFillsContext, str_cat("the prompt has ", prompt, " tokens but the model's context is ",
                                                   l.max_model_len, " tokens, which leaves no room for output")};
    return {Misfit::kPastContext, str_cat(prompt, " prompt tokens + max_tokens ", max_tokens, " = ", max_len,
                                          " exceed the model's context of ", l.max_model_len, " tokens")};
  }
  const int64_t need = kv_blocks_held(l, max_len);
  if (need > l.num_blocks)
    return {Misfit::kPastKvCache, str_cat(prompt, " prompt tokens + max_tokens ", max_tokens, " need ", need,
                                          " KV blocks of ", l.block_size, " tokens but the whole cache has ",
                                          l.num_blocks, "; lower max_tokens or give the KV cache more memory")};
  return {};
}

void check_request_fits(const KvFitLimits& l, int64_t prompt, int64_t max_tokens, const std::string& who) {
  const RequestFit fit = request_fit(l, prompt, max_tokens);
  SERVAL_CHECK(fit.fits(), who, fit.reason);
}

}  // namespace serval
