// KV memory planning: a fraction of the memory left after weights becomes
// whole blocks; bad fractions and no room are named errors; the start-up line
// says tokens, blocks, GiB and sequences of the context.
#include "kv/kv_memory_plan.h"

#include <gtest/gtest.h>

#include "core/error.h"

namespace serval {
namespace {

TEST(KvMemoryPlan, FractionOfWhatIsLeftInWholeBlocks) {
  // 1000 MiB available, 200 MiB reserved, half of the rest: 400 MiB of 64 KiB
  // tokens = 6400 tokens = 400 blocks of 16.
  const int64_t mib = 1 << 20;
  EXPECT_EQ(kv_tokens_for_memory(0.5, 1000 * mib, 200 * mib, 64 * 1024, 16), 6400);
  // Rounded down to a block: 6399 tokens' worth is 399 blocks.
  EXPECT_EQ(kv_tokens_for_memory(1.0, 6399 * 1024, 0, 1024, 16), 399 * 16);
}

TEST(KvMemoryPlan, ErrorsNameTheProblem) {
  auto message = [](double f, int64_t avail, int64_t reserved) {
    try {
      kv_tokens_for_memory(f, avail, reserved, 1024, 16);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_NE(message(0.0, 1 << 30, 0).find("fraction must be in (0, 1], got 0"), std::string::npos);
  EXPECT_NE(message(1.5, 1 << 30, 0).find("got 1.5"), std::string::npos);
  EXPECT_NE(message(0.9, 1 << 20, 2 << 20).find("no memory left for the KV cache"), std::string::npos);
  EXPECT_NE(message(0.9, 0, 0).find("--kv-cache-tokens"), std::string::npos);
}

TEST(KvMemoryPlan, DescribeSaysTokensBlocksBytesAndSequences) {
  KvMemoryPlan p;
  p.num_blocks = 256;
  p.block_size = 16;
  p.bytes_per_token = 1 << 16;
  p.context_len = 2048;
  EXPECT_EQ(p.tokens(), 4096);
  EXPECT_DOUBLE_EQ(p.sequences(), 2.0);
  EXPECT_EQ(p.describe(),
            "KV cache: 4096 tokens in 256 blocks of 16 (0.250 GiB, f32), 2.0 sequences of the model's "
            "context length (2048 tokens)");
  EXPECT_GT(available_memory_bytes(), 0);  // Linux: /proc/meminfo
}

}  // namespace
}  // namespace serval
