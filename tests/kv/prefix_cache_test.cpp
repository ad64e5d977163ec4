// Unit tests of the prefix cache in KvCacheManager: match/adopt/commit, the
// one-token cap, LRU leaf-first eviction, forks and copy-on-write, hash
// collisions, duplicate commits, and the disabled switch.
#include <gtest/gtest.h>

#include <numeric>

#include "core/error.h"
#include "kv/kv_cache_manager.h"
#include "shadow_kv.h"

namespace serval {
namespace {

using testing::ShadowKv;
using Tokens = std::vector<int32_t>;

Tokens iota_tokens(int32_t n, int32_t first) {
  Tokens t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), first);
  return t;
}

Tokens concat(Tokens a, const Tokens& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Admits a prompt the way the engine will: match, adopt, allocate the rest,
// write its K/V, commit. Returns the tokens that were computed.
int64_t admit(KvCacheManager& kv, ShadowKv& shadow, BlockTable& table, const Tokens& prompt) {
  const PrefixMatch m = kv.match_prefix(prompt);
  EXPECT_TRUE(kv.can_adopt_and_allocate(m, int64_t(prompt.size()) - m.num_tokens));
  kv.adopt_prefix(table, m);
  EXPECT_TRUE(shadow.holds(table, prompt, m.num_tokens)) << "cache hit with wrong K/V";
  const int64_t rest = int64_t(prompt.size()) - m.num_tokens;
  auto a = kv.allocate_slots(table, rest);
  EXPECT_TRUE(a.has_value());
  if (!a) return -1;
  shadow.copy_blocks(a->copies);
  shadow.write(a->slots, std::span(prompt).subspan(size_t(m.num_tokens)));
  kv.commit_full_blocks(table, prompt);
  kv.check_invariants();
  return rest;
}

TEST(PrefixCache, MatchAdoptCommitRoundTrip) {
  KvCacheManager kv(16, 4, /*enable_prefix_cache=*/true);
  ShadowKv shadow(16, 4);
  const Tokens a_prompt = iota_tokens(10, 100);
  BlockTable a = kv.new_table();
  EXPECT_EQ(admit(kv, shadow, a, a_prompt), 10);
  EXPECT_EQ(a.num_committed_blocks(), 2);
  EXPECT_TRUE(kv.pool().is_cached(a.blocks()[0]));
  EXPECT_TRUE(kv.pool().is_cached(a.blocks()[1]));
  EXPECT_FALSE(kv.pool().is_cached(a.blocks()[2]));  // partial: private
  const std::vector<BlockId> a_blocks = a.blocks();
  kv.free(a);
  kv.check_invariants();
  KvUsage u = kv.usage();
  EXPECT_EQ(u.used_blocks, 0);
  EXPECT_EQ(u.cached_blocks, 2);
  EXPECT_EQ(u.free_blocks, 14);
  EXPECT_EQ(u.available_blocks(), 16);

  // B shares A's first 8 tokens: computes only its last 3.
  const Tokens b_prompt = concat(Tokens(a_prompt.begin(), a_prompt.begin() + 8), {7, 8, 9});
  BlockTable b = kv.new_table();
  EXPECT_EQ(admit(kv, shadow, b, b_prompt), 3);
  EXPECT_EQ(b.blocks()[0], a_blocks[0]);
  EXPECT_EQ(b.blocks()[1], a_blocks[1]);
  EXPECT_EQ(kv.pool().ref_count(a_blocks[0]), 1);
  EXPECT_EQ(kv.usage().cached_blocks, 0);
  EXPECT_EQ(kv.prefix_cache_stats().query_tokens, 10 + 11);
  EXPECT_EQ(kv.prefix_cache_stats().hit_tokens, 8);
  EXPECT_TRUE(shadow.holds(b, b_prompt, 11));

  // B decodes past its third block; committing caches it under B's prefix.
  Tokens b_tokens = b_prompt;
  b_tokens.push_back(42);
  auto s = kv.allocate_slots(b, 1);
  ASSERT_TRUE(s.has_value());
  EXPECT_TRUE(s->copies.empty());
  shadow.write(s->slots, std::span(b_tokens).subspan(11));
  kv.commit_full_blocks(b, b_tokens);
  kv.check_invariants();
  EXPECT_EQ(b.num_committed_blocks(), 3);
  EXPECT_TRUE(kv.pool().is_cached(b.blocks()[2]));

  // C = B's 12 tokens + 1: hits all three blocks.
  BlockTable c = kv.new_table();
  EXPECT_EQ(admit(kv, shadow, c, concat(b_tokens, {5})), 1);
  EXPECT_EQ(c.blocks()[2], b.blocks()[2]);
  kv.free(b);
  kv.free(c);
  kv.check_invariants();
  EXPECT_EQ(kv.usage().used_blocks, 0);
  EXPECT_EQ(kv.usage().cached_blocks, 3);
}

TEST(PrefixCache, AtLeastOnePromptTokenIsRecomputed) {
  KvCacheManager kv(8, 4, true);
  ShadowKv shadow(8, 4);
  const Tokens prompt = iota_tokens(8, 0);  // exactly two full blocks
  BlockTable a = kv.new_table();
  admit(kv, shadow, a, prompt);
  EXPECT_EQ(kv.usage().used_blocks, 2);
  EXPECT_EQ(kv.match_prefix(prompt).num_tokens, 4);  // not 8: the last token needs logits
  EXPECT_EQ(kv.match_prefix(iota_tokens(9, 0)).num_tokens, 8);
  EXPECT_EQ(kv.match_prefix(iota_tokens(5, 0)).num_tokens, 4);
  EXPECT_EQ(kv.match_prefix(iota_tokens(4, 0)).num_tokens, 0);
  EXPECT_EQ(kv.match_prefix(iota_tokens(1, 0)).num_tokens, 0);
  EXPECT_EQ(kv.match_prefix(Tokens{}).num_tokens, 0);
  EXPECT_EQ(kv.match_prefix(iota_tokens(9, 1)).num_tokens, 0);  // other first block
  // Matching has no side effect on the pool.
  EXPECT_EQ(kv.prefix_cache_stats().query_tokens, 8);
  EXPECT_EQ(kv.usage().used_blocks, 2);
  kv.free(a);
  kv.check_invariants();
}

// Fills a 6-block pool (block size 2) with two freed 3-block prompts.
struct TwoCachedPrompts {
  KvCacheManager kv{6, 2, true};
  ShadowKv shadow{6, 2};
  Tokens a = iota_tokens(7, 10), b = iota_tokens(7, 50);  // 3 full blocks + 1
  std::vector<BlockId> a_blocks, b_blocks;

  TwoCachedPrompts() {
    BlockTable ta = kv.new_table(), tb = kv.new_table();
    admit(kv, shadow, ta, Tokens(a.begin(), a.begin() + 6));
    a_blocks = ta.blocks();
    kv.free(ta);  // A released first: older
    admit(kv, shadow, tb, Tokens(b.begin(), b.begin() + 6));
    b_blocks = tb.blocks();
    kv.free(tb);
    kv.check_invariants();
  }
  int64_t cached_tokens(const Tokens& t) { return kv.match_prefix(t).num_tokens; }
};

TEST(PrefixCache, EvictsLeastRecentlyUsedLeafFirst) {
  TwoCachedPrompts f;
  EXPECT_EQ(f.kv.usage().cached_blocks, 6);
  EXPECT_EQ(f.kv.usage().free_blocks, 0);
  BlockTable c = f.kv.new_table();
  auto s = f.kv.allocate_slots(c, 3);  // needs 2 blocks: A's two deepest
  ASSERT_TRUE(s.has_value());
  f.kv.check_invariants();
  EXPECT_EQ(f.kv.prefix_cache_stats().evicted_blocks, 2);
  EXPECT_TRUE(f.kv.pool().is_cached(f.a_blocks[0]));
  EXPECT_FALSE(f.kv.pool().is_cached(f.a_blocks[1]));
  EXPECT_FALSE(f.kv.pool().is_cached(f.a_blocks[2]));
  EXPECT_EQ(f.cached_tokens(f.a), 2);
  EXPECT_EQ(f.cached_tokens(f.b), 6);
  // One more: A's root block is now the oldest leaf.
  ASSERT_TRUE(f.kv.allocate_slots(c, 2));
  EXPECT_FALSE(f.kv.pool().is_cached(f.a_blocks[0]));
  EXPECT_EQ(f.cached_tokens(f.b), 6);
  f.kv.free(c);
  f.kv.check_invariants();
}

TEST(PrefixCache, MatchingRefreshesRecency) {
  TwoCachedPrompts f;
  EXPECT_EQ(f.cached_tokens(f.a), 6);  // A is now the most recently used
  BlockTable c = f.kv.new_table();
  ASSERT_TRUE(f.kv.allocate_slots(c, 4));
  f.kv.check_invariants();
  EXPECT_EQ(f.cached_tokens(f.a), 6);
  EXPECT_EQ(f.cached_tokens(f.b), 2);
  f.kv.free(c);
}

TEST(PrefixCache, SharedTrunkOutlivesItsBranches) {
  // Trunk T (one block) with branches X and Y; X is released before Y.
  KvCacheManager kv(3, 2, true);
  ShadowKv shadow(3, 2);
  const Tokens x = {1, 2, 3, 4}, y = {1, 2, 5, 6};
  BlockTable tx = kv.new_table(), ty = kv.new_table();
  admit(kv, shadow, tx, x);
  const BlockId trunk = tx.blocks()[0];
  EXPECT_EQ(admit(kv, shadow, ty, y), 2);  // shares the trunk
  EXPECT_EQ(kv.pool().ref_count(trunk), 2);
  const BlockId bx = tx.blocks()[1], by = ty.blocks()[1];
  kv.free(tx);
  EXPECT_EQ(kv.usage().cached_blocks, 1);  // X; the trunk is still used by Y
  kv.free(ty);
  EXPECT_EQ(kv.usage().cached_blocks, 3);
  kv.check_invariants();
  // Even if the trunk is touched last, it is not a leaf: X goes, then Y.
  EXPECT_EQ(kv.match_prefix(Tokens{1, 2, 9}).num_tokens, 2);
  BlockTable t = kv.new_table();
  ASSERT_TRUE(kv.allocate_slots(t, 1));
  EXPECT_FALSE(kv.pool().is_cached(bx));
  EXPECT_TRUE(kv.pool().is_cached(by) && kv.pool().is_cached(trunk));
  ASSERT_TRUE(kv.allocate_slots(t, 2));
  EXPECT_FALSE(kv.pool().is_cached(by));
  EXPECT_TRUE(kv.pool().is_cached(trunk));
  ASSERT_TRUE(kv.allocate_slots(t, 2));
  EXPECT_FALSE(kv.pool().is_cached(trunk));
  EXPECT_FALSE(kv.allocate_slots(t, 2).has_value());  // 5 tokens in 3 blocks: full
  kv.check_invariants();
  kv.free(t);
  EXPECT_EQ(kv.usage().free_blocks, 3);
}

TEST(PrefixCache, ReferencedBlocksAreNeverEvicted) {
  KvCacheManager kv(4, 2, true);
  ShadowKv shadow(4, 2);
  BlockTable a = kv.new_table();
  admit(kv, shadow, a, {1, 2, 3, 4, 5});  // 3 blocks, 2 cached and referenced
  BlockTable b = kv.new_table();
  EXPECT_FALSE(kv.can_allocate(b, 3));
  EXPECT_FALSE(kv.allocate_slots(b, 3).has_value());
  EXPECT_EQ(kv.usage().used_blocks, 3);
  EXPECT_EQ(b.num_tokens(), 0);
  kv.check_invariants();
  kv.free(a);
  EXPECT_TRUE(kv.can_allocate(b, 8));
  ASSERT_TRUE(kv.allocate_slots(b, 8));
  EXPECT_EQ(kv.usage().cached_blocks, 0);
  kv.free(b);
  kv.check_invariants();
}

TEST(PrefixCache, StaleMatchIsRefused) {
  KvCacheManager kv(2, 2, true);
  ShadowKv shadow(2, 2);
  BlockTable a = kv.new_table();
  admit(kv, shadow, a, {1, 2, 3});
  kv.free(a);
  const PrefixMatch m = kv.match_prefix(Tokens{1, 2, 3});
  ASSERT_EQ(m.num_tokens, 2);
  BlockTable other = kv.new_table();
  ASSERT_TRUE(kv.allocate_slots(other, 4));  // evicts the matched block
  BlockTable b = kv.new_table();
  EXPECT_THROW(kv.adopt_prefix(b, m), Error);
  EXPECT_EQ(b.num_tokens(), 0);
  kv.free(other);
  kv.check_invariants();
}

TEST(PrefixCache, AdmissionCheckCountsAdoptedEvictableBlocks) {
  KvCacheManager kv(3, 2, true);
  ShadowKv shadow(3, 2);
  BlockTable a = kv.new_table();
  admit(kv, shadow, a, {1, 2, 3, 4});
  kv.free(a);  // 2 cached, 1 free
  const PrefixMatch m = kv.match_prefix(Tokens{1, 2, 3, 4, 5});
  ASSERT_EQ(m.num_tokens, 4);
  EXPECT_TRUE(kv.can_adopt_and_allocate(m, 2));   // one new block
  EXPECT_FALSE(kv.can_adopt_and_allocate(m, 3));  // two new blocks: only 1 left
  BlockTable b = kv.new_table();
  kv.adopt_prefix(b, m);
  EXPECT_TRUE(kv.can_allocate(b, 2));
  EXPECT_FALSE(kv.can_allocate(b, 3));
  kv.free(b);
  kv.check_invariants();
}

TEST(PrefixCache, ForkSharesBlocksAndCopiesOnWrite) {
  for (bool enabled : {false, true}) {
    SCOPED_TRACE(enabled ? "cache on" : "cache off");
    KvCacheManager kv(8, 4, enabled);
    ShadowKv shadow(8, 4);
    const Tokens prompt = iota_tokens(6, 1);  // 1 full block + 2 tokens
    BlockTable a = kv.new_table();
    admit(kv, shadow, a, prompt);
    BlockTable b = kv.fork(a);
    kv.check_invariants();
    EXPECT_EQ(b.blocks(), a.blocks());
    EXPECT_EQ(b.num_tokens(), 6);
    for (BlockId id : a.blocks()) EXPECT_EQ(kv.pool().ref_count(id), 2);
    EXPECT_EQ(kv.usage().used_blocks, 2);

    // A writes first into the shared partial block: it gets a copy.
    const BlockId shared = a.blocks()[1];
    Tokens ta = concat(prompt, {70}), tb = concat(prompt, {80});
    auto sa = kv.allocate_slots(a, 1);
    ASSERT_TRUE(sa.has_value());
    ASSERT_EQ(sa->copies.size(), 1u);
    EXPECT_EQ(sa->copies[0].first, shared);
    EXPECT_EQ(sa->copies[0].second, a.blocks()[1]);
    EXPECT_NE(a.blocks()[1], shared);
    EXPECT_EQ(a.blocks()[0], b.blocks()[0]);
    shadow.copy_blocks(sa->copies);
    shadow.write(sa->slots, std::span(ta).subspan(6));
    EXPECT_EQ(kv.pool().ref_count(shared), 1);
    // B is the last holder now: it writes in place.
    auto sb = kv.allocate_slots(b, 1);
    ASSERT_TRUE(sb.has_value());
    EXPECT_TRUE(sb->copies.empty());
    EXPECT_EQ(b.blocks()[1], shared);
    shadow.write(sb->slots, std::span(tb).subspan(6));
    EXPECT_TRUE(shadow.holds(a, ta, 7));
    EXPECT_TRUE(shadow.holds(b, tb, 7));
    EXPECT_EQ(kv.prefix_cache_stats().cow_copies, 1);
    kv.check_invariants();
    kv.free(a);
    kv.free(b);
    kv.check_invariants();
    EXPECT_EQ(kv.usage().used_blocks, 0);
    EXPECT_EQ(kv.usage().cached_blocks, enabled ? 1 : 0);
  }
}

TEST(PrefixCache, ForkOnFullBlockNeedsNoCopyAndCopyFailureChangesNothing) {
  KvCacheManager kv(3, 2, true);
  ShadowKv shadow(3, 2);
  BlockTable a = kv.new_table();
  admit(kv, shadow, a, {1, 2});  // one full block
  BlockTable b = kv.fork(a);
  auto s = kv.allocate_slots(b, 1);
  ASSERT_TRUE(s.has_value());
  EXPECT_TRUE(s->copies.empty());  // appends go to a new block
  shadow.write(s->slots, Tokens{3});
  BlockTable c = kv.fork(b);  // shares b's partial block
  ASSERT_TRUE(kv.allocate_slots(a, 1));  // last free block
  EXPECT_FALSE(kv.can_allocate(c, 1));   // needs a copy, none left
  const auto before = c.blocks();
  EXPECT_FALSE(kv.allocate_slots(c, 1).has_value());
  EXPECT_EQ(c.blocks(), before);
  EXPECT_EQ(c.num_tokens(), 3);
  EXPECT_EQ(kv.pool().ref_count(before[1]), 2);
  kv.check_invariants();
  for (BlockTable* t : {&a, &b, &c}) kv.free(*t);
  EXPECT_EQ(kv.usage().used_blocks, 0);
  kv.check_invariants();
}

TEST(PrefixCache, HashCollisionsNeverReturnAnotherPrefix) {
  // Every block hashes alike: only the token comparison tells them apart.
  KvCacheManager kv(8, 2, true, [](uint64_t, std::span<const int32_t>) { return uint64_t(42); });
  ShadowKv shadow(8, 2);
  const Tokens a = {1, 2, 3, 4, 5}, b = {9, 9, 3, 4, 5};
  BlockTable ta = kv.new_table(), tb = kv.new_table();
  EXPECT_EQ(admit(kv, shadow, ta, a), 5);
  EXPECT_EQ(kv.usage().used_blocks, 3);
  EXPECT_EQ(admit(kv, shadow, tb, b), 5);  // collides at the root: a miss
  EXPECT_FALSE(kv.pool().is_cached(tb.blocks()[0]));  // kept private
  EXPECT_FALSE(kv.pool().is_cached(tb.blocks()[1]));  // and so is the rest
  EXPECT_EQ(kv.match_prefix(Tokens{1, 2, 7, 7, 7}).num_tokens, 2);
  EXPECT_EQ(kv.match_prefix(a).num_tokens, 4);
  EXPECT_EQ(kv.match_prefix(b).num_tokens, 0);
  kv.free(ta);
  kv.free(tb);
  kv.check_invariants();
  EXPECT_EQ(kv.usage().cached_blocks, 2);
  EXPECT_EQ(kv.usage().free_blocks, 6);
  BlockTable tc = kv.new_table();
  EXPECT_EQ(admit(kv, shadow, tc, concat(a, {6})), 2);
  kv.free(tc);
}

TEST(PrefixCache, ConcurrentIdenticalPrefixStaysPrivate) {
  KvCacheManager kv(8, 2, true);
  ShadowKv shadow(8, 2);
  const Tokens p = {1, 2, 3, 4, 5};
  BlockTable a = kv.new_table(), b = kv.new_table();
  // Both admitted before either committed: neither hits.
  for (BlockTable* t : {&a, &b}) {
    kv.adopt_prefix(*t, kv.match_prefix(p));
    auto s = kv.allocate_slots(*t, 5);
    ASSERT_TRUE(s.has_value());
    shadow.write(s->slots, p);
  }
  kv.commit_full_blocks(a, p);
  const auto b_blocks = b.blocks();
  kv.commit_full_blocks(b, p);
  kv.check_invariants();
  EXPECT_EQ(b.blocks(), b_blocks);  // no swap under a running sequence
  EXPECT_TRUE(kv.pool().is_cached(a.blocks()[0]) && kv.pool().is_cached(a.blocks()[1]));
  EXPECT_FALSE(kv.pool().is_cached(b.blocks()[0]) || kv.pool().is_cached(b.blocks()[1]));
  kv.free(b);
  EXPECT_EQ(kv.usage().free_blocks, 5);
  kv.free(a);
  EXPECT_EQ(kv.usage().cached_blocks, 2);
  kv.check_invariants();
}

TEST(PrefixCache, DisabledCacheNeverHitsNorCaches) {
  KvCacheManager kv(8, 4);
  EXPECT_FALSE(kv.prefix_cache_enabled());
  ShadowKv shadow(8, 4);
  const Tokens p = iota_tokens(9, 0);
  BlockTable a = kv.new_table(), b = kv.new_table();
  EXPECT_EQ(admit(kv, shadow, a, p), 9);
  EXPECT_EQ(a.num_committed_blocks(), 0);
  EXPECT_EQ(admit(kv, shadow, b, p), 9);
  EXPECT_NE(a.blocks()[0], b.blocks()[0]);
  kv.free(a);
  kv.free(b);
  kv.check_invariants();
  const KvUsage u = kv.usage();
  EXPECT_EQ(u.cached_blocks, 0);
  EXPECT_EQ(u.free_blocks, 8);
  const PrefixCacheStats s = kv.prefix_cache_stats();
  EXPECT_EQ(s.query_tokens, 0);
  EXPECT_EQ(s.hit_tokens, 0);
  EXPECT_EQ(s.evicted_blocks, 0);
}

TEST(PrefixCache, MisuseThrows) {
  KvCacheManager kv(4, 2, true);
  ShadowKv shadow(4, 2);
  BlockTable a = kv.new_table();
  admit(kv, shadow, a, {1, 2, 3});
  BlockTable b = kv.new_table();
  const Tokens p = {1, 2, 3};
  EXPECT_THROW(kv.adopt_prefix(a, kv.match_prefix(p)), Error);  // table not empty
  EXPECT_THROW(kv.commit_full_blocks(b, p), Error);               // no slots for them
  BlockTable other(4);
  EXPECT_THROW(kv.fork(other), Error);
  kv.free(a);
  kv.check_invariants();
}

TEST(PrefixCache, SurvivesAMoveOfTheManager) {
  KvCacheManager first(4, 2, true);
  ShadowKv shadow(4, 2);
  BlockTable a = first.new_table();
  admit(first, shadow, a, {1, 2, 3});
  KvCacheManager kv = std::move(first);
  kv.free(a);
  kv.check_invariants();
  EXPECT_EQ(kv.usage().cached_blocks, 1);
  BlockTable b = kv.new_table();
  EXPECT_EQ(admit(kv, shadow, b, {1, 2, 4}), 1);
  kv.free(b);
  kv.check_invariants();
}

}  // namespace
}  // namespace serval
