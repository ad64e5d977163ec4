#pragma once
// The runner's memory plan, in one place: whether the weights fit the device,
// and how many tokens the KV pool gets once weights and activations are
// allocated (DESIGN.md §3: the memory left is given to the pool).
#include <cstdint>

#include "runtime/backend.h"
#include "runtime/model_runner.h"

namespace serval {

// Device memory kept out of the KV pool for what grows at run time: attention
// partials, sampling scratch, cuBLASLt's workspace, graphs.
inline constexpr int64_t kDeviceReserveBytes = int64_t(1) << 30;

// Throws serval::Error when `weight_bytes` (planned_weight_bytes) do not fit
// the device's free memory or `fraction` of it. Nothing to check on a
// backend without device memory.
void check_weights_fit(int64_t weight_bytes, Backend& be, double fraction);

// Activation memory kept out of a host-memory pool (host_memory_fraction).
inline constexpr int64_t kHostActivationReserveBytes = int64_t(256) << 20;

struct KvPoolBudget {
  int64_t bytes_per_token = 0;     // K and V of one token in every layer
  int64_t weight_bytes = 0;        // for the message when nothing is left
  int64_t activation_bytes = 0;
  int64_t activation_tokens = 0;
  int64_t max_position = 0;        // the model's context
};

// Tokens the KV pool holds: opts.kv_cache_tokens, else what kv_memory_bytes
// holds, else on a device the rest of gpu_memory_fraction after what this
// process already holds and kDeviceReserveBytes, else 4 sequences of
// min(max_position, 4096). Throws serval::Error when less than a block fits.
int64_t plan_kv_tokens(const RunnerOptions& opts, Backend& be, const KvPoolBudget& budget);

// opts.host_memory_fraction's pool, in tokens (0 where it does not apply:
// set, a token count or byte size given, device memory), planned before the
// weights load: `available_bytes` is the host's memory available then.
int64_t plan_host_kv_tokens(const RunnerOptions& opts, const Backend& be, const KvPoolBudget& budget,
                            int64_t available_bytes);

}  // namespace serval
