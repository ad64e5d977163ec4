#include "kv/kv_memory_plan.h"

#include <cstdio>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace serval {

std::string KvMemoryPlan::describe() const {
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "KV cache: %lld tokens in %lld blocks of %d (%.3f GiB, %s), %.1f sequences of the "
                "model's context length (%lld tokens)",
                (long long)tokens(), (long long)num_blocks, block_size,
                double(bytes()) / double(1ll << 30), std::string(dtype_name(dtype)).c_str(), sequences(), (long long)context_len);
  return buf;
}

int64_t available_memory_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string key;
    int64_t kib = 0;
    if (fields >> key >> kib && key == "MemAvailable:") return kib * 1024;
  }
  return 0;
}

int64_t kv_tokens_for_memory(double fraction, int64_t available_bytes, int64_t reserved_bytes,
                             int64_t bytes_per_token, int32_t block_size) {
  SERVAL_CHECK(fraction > 0.0 && fraction <= 1.0,
               "the KV cache memory fraction must be in (0, 1], got ", fraction);
  SERVAL_CHECK(bytes_per_token > 0 && block_size >= 1, "KV memory plan: bad geometry (",
               bytes_per_token, " bytes per token, block size ", block_size, ")");
  SERVAL_CHECK(available_bytes > 0, "cannot read the available memory (/proc/meminfo): "
               "give the KV cache size with --kv-cache-tokens");
  const double budget = fraction * double(available_bytes - reserved_bytes);
  const int64_t blocks = budget > 0 ? int64_t(budget / double(bytes_per_token)) / block_size : 0;
  SERVAL_CHECK(blocks >= 1, "no memory left for the KV cache: ", available_bytes >> 20,
               " MiB available, ", reserved_bytes >> 20, " MiB for weights and activations, ",
               "fraction ", fraction, "; free memory or pass --kv-cache-tokens");
  return blocks * block_size;
}

}  // namespace serval
