#pragma once
// Content hash of a full KV block: it covers the whole token prefix that ends
// in the block, as a chain hash(parent's hash, this block's token ids). The
// prefix cache keys its radix tree by it and still compares the tokens on
// every match, so a collision costs a cache miss, never wrong K/V.
#include <cstdint>
#include <functional>
#include <span>

namespace serval {

using BlockHashFn = std::function<uint64_t(uint64_t parent_hash, std::span<const int32_t> tokens)>;

// Hash of the empty prefix (the radix tree's root).
inline constexpr uint64_t kRootBlockHash = 0x6a09e667f3bcc908ULL;

// The default chain hash: 64 bits, every token and the length mixed through
// a bijective avalanche step (splitmix64's finalizer).
uint64_t hash_block_tokens(uint64_t parent_hash, std::span<const int32_t> tokens);

}  // namespace serval
