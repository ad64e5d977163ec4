#pragma once
// Whether a request can ever run: its prompt plus max_tokens within the
// model's context, and the KV blocks it holds at once within the whole pool.
// The one check behind the server's 400s (which name the parameter),
// Engine::check (submit refuses) and Scheduler::add (which must never admit
// a request it cannot finish).
#include <cstdint>
#include <string>

namespace serval {

struct KvFitLimits {
  int64_t max_model_len = 0;  // 0: unlimited
  int32_t block_size = 16;
  int64_t num_blocks = 0;
  // Sliding-window attention in every layer (the widest window; 0: none):
  // blocks wholly behind it are released as the sequence grows, so a
  // sequence holds at most the window plus one step's chunk.
  int64_t window = 0;
  int64_t max_chunk_tokens = 0;  // the largest chunk of one step (the scheduler's budget)
};

// Blocks a sequence of `len` tokens (all but its last one computed) holds at most.
int64_t kv_blocks_held(const KvFitLimits& limits, int64_t len);

// Output tokens the context leaves after `prompt` tokens (INT64_MAX without a
// context limit; 0 or less: none).
int64_t context_room(const KvFitLimits& limits, int64_t prompt);

// What keeps a request from ever running.
enum class Misfit {
  kNone,
  kPromptFillsContext,  // the prompt alone takes the whole context
  kPastContext,         // prompt + max_tokens exceed the context
  kPastKvCache,         // the KV blocks it would hold exceed the whole cache
};
struct RequestFit {
  Misfit misfit = Misfit::kNone;
  std::string reason;  // the numbers, for an error message ("" when it fits)
  bool fits() const { return misfit == Misfit::kNone; }
};
RequestFit request_fit(const KvFitLimits& limits, int64_t prompt, int64_t max_tokens);

// Throws serval::Error, its message starting with `who` (e.g. "request 7: "),
// when `prompt` tokens + `max_tokens` exceed the context or the pool.
void check_request_fits(const KvFitLimits& limits, int64_t prompt, int64_t max_tokens, const std::string& who);

}  // namespace serval
