#pragma once
// Rng: the per-request random stream used by sampling. A Philox4x64-10 counter
// stream keyed by the request's seed, so the same seed gives the same draws on
// every platform and standard library (no std:: distributions are used).
#include <cstdint>

#include "sampling/philox.h"

namespace serval {

class Rng {
 public:
  explicit Rng(uint64_t seed);

  uint64_t seed() const { return key_[0]; }
  // Next 64 random bits.
  uint64_t next_u64();
  // Uniform in [0, 1) with 53 random bits (exact multiples of 2^-53).
  double uniform();

 private:
  PhiloxKey key_;
  PhiloxCounter counter_{0, 0, 0, 0};
  PhiloxCounter block_{};
  int used_ = 4;  // words of block_ already handed out
};

// A fresh seed from a process-wide random source (for requests without one).
// Thread-safe; never returns the same value twice in a process.
uint64_t random_seed();

}  // namespace serval
