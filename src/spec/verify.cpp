#include "spec/verify.h"

#include "core/error.h"

namespace serval {

int32_t accepted_length(std::span<const int32_t> draft, std::span<const int32_t> sampled) {
  SERVAL_CHECK(sampled.size() == draft.size() + 1, "verification: ", sampled.size(), " sampled tokens for a draft of ",
               draft.size(), " (expected one more)");
  size_t a = 0;
  while (a < draft.size() && sampled[a] == draft[a]) ++a;
  return int32_t(a + 1);
}

}  // namespace serval
