#include "sampling/philox.h"

namespace serval {
namespace {

constexpr uint64_t kMul0 = 0xD2E7470EE14C6C93ull;
constexpr uint64_t kMul1 = 0xCA5A826395121157ull;
constexpr uint64_t kWeyl0 = 0x9E3779B97F4A7C15ull;  // golden ratio
constexpr uint64_t kWeyl1 = 0xBB67AE8584CAA73Bull;  // sqrt(3) - 1

inline void mulhilo(uint64_t a, uint64_t b, uint64_t& hi, uint64_t& lo) {
  const unsigned __int128 p = static_cast<unsigned __int128>(a) * b;
  hi = static_cast<uint64_t>(p >> 64);
  lo = static_cast<uint64_t>(p);
}

}  // namespace

PhiloxCounter philox4x64_10(PhiloxCounter c, PhiloxKey k) {
  for (int round = 0; round < 10; ++round) {
    uint64_t hi0, lo0, hi1, lo1;
    mulhilo(kMul0, c[0], hi0, lo0);
    mulhilo(kMul1, c[2], hi1, lo1);
    c = {hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0};
    k[0] += kWeyl0;
    k[1] += kWeyl1;
  }
  return c;
}

}  // namespace serval
