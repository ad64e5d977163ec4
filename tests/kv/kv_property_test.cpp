// Randomized property test of KvCacheManager with the prefix cache: many
// sequences drawn from a few shared prefixes are admitted (match + adopt),
// computed in chunks, committed, forked, decoded, aborted and preempted on
// allocation failure, in a small pool. After every operation: the manager's
// own invariants, ref counts equal to the tables' holdings, and every
// sequence reads back its own tokens from the shadow K/V (so a wrong cache
// hit, a missed copy-on-write or a block shared while written fails).
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "kv/kv_cache_manager.h"
#include "shadow_kv.h"

namespace serval {
namespace {

using Tokens = std::vector<int32_t>;

struct SimSeq {
  BlockTable table;
  Tokens tokens;
  int64_t computed = 0;
  size_t max_len = 0;  // finishes when its tokens reach this
};

struct SimConfig {
  uint64_t seed = 0;
  int64_t num_blocks = 24;
  int32_t block_size = 4;
  bool prefix_cache = true;
  BlockHashFn hash;  // empty: the real one
  int operations = 2500;
};

struct SimCounts {
  int64_t admitted = 0, forks = 0, alloc_failures = 0, preemptions = 0, finished = 0;
  int64_t aborted = 0;
};

class Simulation {
 public:
  explicit Simulation(const SimConfig& c)
      : c_(c), rng_(c.seed), kv_(c.num_blocks, c.block_size, c.prefix_cache, c.hash),
        shadow_(c.num_blocks, c.block_size) {
    for (int i = 0; i < 4; ++i) {
      Tokens p(size_t(pick(2, 24)));
      for (int32_t& t : p) t = int32_t(pick(0, 50));
      prefixes_.push_back(p);
    }
  }

  void run() {
    const bool failed_before = ::testing::Test::HasFailure();
    for (int op = 0; op < c_.operations; ++op) {
      const int64_t r = pick(0, 99);
      if (r < 20 || seqs_.empty()) {
        admit();
      } else if (r < 75) {
        step(pick_seq());
      } else if (r < 83) {
        fork(pick_seq());
      } else {
        ++counts_.aborted;
        drop(pick_seq());
      }
      verify();
      if (!failed_before && ::testing::Test::HasFailure()) {
        ADD_FAILURE() << "seed " << c_.seed << " failed at operation " << op;
        return;
      }
    }
    while (!seqs_.empty()) drop(0);
    verify();
    const KvUsage u = kv_.usage();
    EXPECT_EQ(u.used_blocks, 0);
    EXPECT_EQ(u.free_blocks + u.cached_blocks, u.num_blocks);
    if (!c_.prefix_cache) {
      EXPECT_EQ(u.cached_blocks, 0);
    }
  }

  const SimCounts& counts() const { return counts_; }
  const KvCacheManager& kv() const { return kv_; }

 private:
  int64_t pick(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng_); }
  size_t pick_seq() { return size_t(pick(0, int64_t(seqs_.size()) - 1)); }

  void admit() {
    Tokens prompt = prefixes_[size_t(pick(0, int64_t(prefixes_.size()) - 1))];
    prompt.resize(size_t(pick(1, int64_t(prompt.size()))));
    const int64_t suffix = pick(0, 10);
    for (int64_t i = 0; i < suffix; ++i) prompt.push_back(int32_t(pick(0, 3)));

    const PrefixMatch m = kv_.match_prefix(prompt);
    ASSERT_EQ(m.num_tokens % c_.block_size, 0);
    ASSERT_LT(m.num_tokens, int64_t(prompt.size()));
    ASSERT_EQ(m.num_tokens, int64_t(m.blocks.size()) * c_.block_size);
    if (!c_.prefix_cache) {
      ASSERT_EQ(m.num_tokens, 0);
    }
    const int64_t chunk = std::min<int64_t>(pick(1, 12), int64_t(prompt.size()) - m.num_tokens);
    const bool fits = kv_.can_adopt_and_allocate(m, chunk);
    SimSeq s{kv_.new_table(), prompt, 0, prompt.size() + size_t(pick(1, 24))};
    kv_.adopt_prefix(s.table, m);
    s.computed = m.num_tokens;
    ASSERT_TRUE(shadow_.holds(s.table, prompt, m.num_tokens)) << "prefix hit with wrong K/V";
    ++counts_.admitted;
    seqs_.push_back(std::move(s));
    compute(seqs_.size() - 1, chunk, fits);
  }

  void step(size_t i) {
    SimSeq& s = seqs_[i];
    const int64_t remaining = int64_t(s.tokens.size()) - s.computed;
    const int64_t chunk = std::min<int64_t>(remaining, pick(1, 12));
    compute(i, chunk, kv_.can_allocate(s.table, chunk));
  }

  // One forward of `chunk` tokens of sequence i; `fits` is what the
  // admission check predicted.
  void compute(size_t i, int64_t chunk, bool fits) {
    SimSeq& s = seqs_[i];
    const std::vector<BlockId> before = s.table.blocks();
    auto a = kv_.allocate_slots(s.table, chunk);
    ASSERT_EQ(a.has_value(), fits) << "can_allocate disagrees with allocate_slots";
    if (!a) {
      ++counts_.alloc_failures;
      ASSERT_EQ(s.table.blocks(), before);
      ASSERT_EQ(s.table.num_tokens(), s.computed);
      if (pick(0, 1)) {  // preempt it (recomputed later means: admitted anew)
        ++counts_.preemptions;
        drop(i);
      }
      return;
    }
    shadow_.copy_blocks(a->copies);
    shadow_.write(a->slots, std::span(s.tokens).subspan(size_t(s.computed), size_t(chunk)));
    s.computed += chunk;
    kv_.commit_full_blocks(s.table, std::span(s.tokens).first(size_t(s.computed)));
    if (s.computed == int64_t(s.tokens.size())) {
      if (s.tokens.size() >= s.max_len) {
        ++counts_.finished;
        drop(i);
      } else {
        s.tokens.push_back(int32_t(pick(0, 3)));  // "sampled"
      }
    }
  }

  void fork(size_t i) {
    SimSeq child = seqs_[i];
    child.table = kv_.fork(seqs_[i].table);
    // The fork samples its own next token when the parent just did.
    if (child.computed + 1 == int64_t(child.tokens.size()) && child.computed > 0)
      child.tokens.back() = int32_t(pick(0, 3));
    ++counts_.forks;
    seqs_.push_back(std::move(child));
  }

  void drop(size_t i) {
    kv_.free(seqs_[i].table);
    ASSERT_EQ(seqs_[i].table.num_blocks(), 0);
    seqs_.erase(seqs_.begin() + std::ptrdiff_t(i));
  }

  void verify() {
    ASSERT_NO_THROW(kv_.check_invariants());
    std::vector<int32_t> held(size_t(c_.num_blocks), 0);
    for (const SimSeq& s : seqs_) {
      ASSERT_EQ(s.table.num_tokens(), s.computed);
      for (BlockId b : s.table.blocks()) ++held[size_t(b)];
      ASSERT_TRUE(shadow_.holds(s.table, s.tokens, s.computed)) << "a sequence's K/V changed";
    }
    int64_t referenced = 0;
    for (BlockId b = 0; b < BlockId(c_.num_blocks); ++b) {
      ASSERT_EQ(kv_.pool().ref_count(b), held[size_t(b)]) << "block " << b;
      referenced += held[size_t(b)] > 0;
    }
    const KvUsage u = kv_.usage();
    ASSERT_EQ(u.used_blocks, referenced);
    ASSERT_EQ(u.free_blocks + u.cached_blocks + u.used_blocks, u.num_blocks);
  }

  SimConfig c_;
  std::mt19937_64 rng_;
  KvCacheManager kv_;
  testing::ShadowKv shadow_;
  std::vector<Tokens> prefixes_;
  std::vector<SimSeq> seqs_;
  SimCounts counts_;
};

TEST(KvCacheProperty, RandomOperationsKeepAccountingAndContent) {
  int64_t total_ops = 0;
  for (uint64_t seed = 1; seed <= 8; ++seed) {
    SimConfig c;
    c.seed = seed;
    c.block_size = int32_t(1 + seed % 4);                    // 2, 3, 4, 1, ...
    c.num_blocks = (seed <= 4 ? 64 : 32) / c.block_size;  // then tighter pools
    Simulation sim(c);
    sim.run();
    total_ops += c.operations;
    const PrefixCacheStats st = sim.kv().prefix_cache_stats();
    const SimCounts& n = sim.counts();
    // The run must have exercised every path, or it proves little.
    EXPECT_GT(st.hit_tokens, 0) << "seed " << seed;
    EXPECT_GT(st.evicted_blocks, 0) << "seed " << seed;
    if (c.block_size > 1) {  // size-1 blocks are never partially filled
      EXPECT_GT(st.cow_copies, 0) << "seed " << seed;
    }
    EXPECT_GT(n.alloc_failures, 0) << "seed " << seed;
    EXPECT_GT(n.forks, 0) << "seed " << seed;
    EXPECT_GT(n.finished, 0) << "seed " << seed;
  }
  EXPECT_GE(total_ops, 10000);
}

TEST(KvCacheProperty, RandomOperationsWithCollidingHashes) {
  // A 2-bit hash: siblings collide all the time; only token checks keep
  // hits correct, and colliding blocks stay private.
  SimConfig c;
  c.seed = 11;
  c.block_size = 2;
  c.num_blocks = 32;
  c.hash = [](uint64_t parent, std::span<const int32_t> t) { return (parent + uint64_t(t[0])) & 3; };
  Simulation sim(c);
  sim.run();
  EXPECT_GT(sim.kv().prefix_cache_stats().hit_tokens, 0);
}

TEST(KvCacheProperty, RandomOperationsWithCacheDisabled) {
  SimConfig c;
  c.seed = 21;
  c.prefix_cache = false;
  Simulation sim(c);
  sim.run();
  EXPECT_EQ(sim.kv().prefix_cache_stats().hit_tokens, 0);
  EXPECT_GT(sim.kv().prefix_cache_stats().cow_copies, 0);
}

}  // namespace
}  // namespace serval
