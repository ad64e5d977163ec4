#include "kv/block_hash.h"

namespace serval {
namespace {

uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

}  // namespace

uint64_t hash_block_tokens(uint64_t parent_hash, std::span<const int32_t> tokens) {
  uint64_t h = mix64(parent_hash ^ 0x9e3779b97f4a7c15ULL);
  for (int32_t t : tokens) h = mix64(h ^ (uint64_t(uint32_t(t)) + 0x9e3779b97f4a7c15ULL));
  return mix64(h ^ uint64_t(tokens.size()));
}

}  // namespace serval
