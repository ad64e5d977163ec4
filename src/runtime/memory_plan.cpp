#include "runtime/memory_plan.h"

#include <algorithm>

#include "core/error.h"
#include "kv/kv_memory_plan.h"

namespace serval {

namespace {
constexpr double kGiB = double(int64_t(1) << 30);
}

void check_weights_fit(int64_t bytes, Backend& be, double fraction) {
  if (!be.has_device_memory()) return;
  int64_t free_b = 0, total_b = 0;
  be.memory_info(free_b, total_b);
  SERVAL_CHECK(bytes <= free_b && double(bytes) <= fraction * double(total_b), "the model's weights need ",
               double(bytes) / kGiB, " GiB of GPU memory, but the GPU has ", double(free_b) / kGiB, " GiB free of ",
               double(total_b) / kGiB, " GiB (--gpu-memory-fraction ", fraction,
               "): use a smaller or quantized model, or another GPU");
}

int64_t plan_kv_tokens(const RunnerOptions& opts, Backend& be, const KvPoolBudget& b) {
  SERVAL_CHECK(opts.kv_cache_tokens >= 0 && opts.kv_memory_bytes >= 0,
               "runner: kv_cache_tokens and kv_memory_bytes must not be negative");
  if (opts.kv_cache_tokens > 0) return opts.kv_cache_tokens;
  if (opts.kv_memory_bytes > 0) {
    const int64_t tokens = opts.kv_memory_bytes / b.bytes_per_token;
    SERVAL_CHECK(tokens >= opts.block_size, "runner: kv_memory_bytes ", opts.kv_memory_bytes,
                 " holds less than one block of ", opts.block_size, " tokens (", b.bytes_per_token,
                 " bytes per token)");
    return tokens;
  }
  if (be.has_device_memory() && opts.gpu_memory_fraction > 0) {
    // Everything this process holds on the device (weights, activations, the
    // CUDA context) is already allocated: the pool gets the rest of the fraction.
    int64_t free_b = 0, total_b = 0;
    be.memory_info(free_b, total_b);
    const int64_t used = total_b - free_b;
    const int64_t budget = int64_t(opts.gpu_memory_fraction * double(total_b)) - used - kDeviceReserveBytes;
    const int64_t min_bytes = b.bytes_per_token * opts.block_size;
    SERVAL_CHECK(budget >= min_bytes && budget <= free_b, "GPU memory plan: --gpu-memory-fraction ",
                 opts.gpu_memory_fraction, " of ", double(total_b) / kGiB, " GiB leaves no room for a KV cache: ",
                 double(used) / kGiB, " GiB are in use (weights ", double(b.weight_bytes) / kGiB,
                 " GiB, activations ", double(b.activation_bytes) / kGiB, " GiB for ", b.activation_tokens,
                 " tokens per step), ", double(kDeviceReserveBytes) / kGiB,
                 " GiB is reserved for scratch; raise the fraction or lower --max-num-batched-tokens / --max-num-seqs");
    return budget / b.bytes_per_token;
  }
  return 4 * std::min<int64_t>(b.max_position, 4096);
}

int64_t plan_host_kv_tokens(const RunnerOptions& opts, const Backend& be, const KvPoolBudget& b,
                            int64_t available_bytes) {
  if (opts.host_memory_fraction == 0 || opts.kv_cache_tokens > 0 || opts.kv_memory_bytes > 0 ||
      be.has_device_memory())
    return 0;
  return kv_tokens_for_memory(opts.host_memory_fraction, available_bytes,
                              b.weight_bytes + kHostActivationReserveBytes, b.bytes_per_token, opts.block_size);
}

}  // namespace serval
