#pragma once
// Philox4x64-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3",
// SC'11): a counter-based generator. Output is a pure function of (counter,
// key), computed with integer arithmetic only, so it is identical on every
// platform and can be reproduced on the GPU later (sampling on the device).
#include <array>
#include <cstdint>

namespace serval {

using PhiloxCounter = std::array<uint64_t, 4>;
using PhiloxKey = std::array<uint64_t, 2>;

// Ten rounds of Philox4x64 on `counter` under `key`.
PhiloxCounter philox4x64_10(PhiloxCounter counter, PhiloxKey key);

}  // namespace serval
