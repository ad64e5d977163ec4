#include "sampling/rng.h"

#include <atomic>
#include <chrono>
#include <random>

namespace serval {

Rng::Rng(uint64_t seed) : key_{seed, 0} {}

uint64_t Rng::next_u64() {
  if (used_ == 4) {
    block_ = philox4x64_10(counter_, key_);
    // 256-bit counter; carrying into the second word is enough for any stream.
    if (++counter_[0] == 0) ++counter_[1];
    used_ = 0;
  }
  return block_[used_++];
}

double Rng::uniform() { return double(next_u64() >> 11) * 0x1.0p-53; }

namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

uint64_t entropy() {
  std::random_device device;
  const uint64_t hw = (uint64_t(device()) << 32) ^ device();
  const uint64_t clock = uint64_t(std::chrono::steady_clock::now().time_since_epoch().count());
  return hw ^ splitmix64(clock);
}

}  // namespace

uint64_t random_seed() {
  // A Weyl sequence from a random start, mixed by splitmix64 (a bijection), so
  // distinct calls give distinct seeds.
  static std::atomic<uint64_t> state{entropy()};
  return splitmix64(state.fetch_add(0x9E3779B97F4A7C15ull, std::memory_order_relaxed));
}

}  // namespace serval
