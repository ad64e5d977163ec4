#include "kv/kv_quant.h"

#include <array>

#include "core/error.h"

namespace serval {

const float* fp8_e4m3_table() {
  static const auto table = [] {
    std::array<float, 256> t{};
    for (int b = 0; b < 256; ++b) t[size_t(b)] = fp8_e4m3_to_f32(uint8_t(b));
    return t;
  }();
  return table.data();
}

DType parse_kv_cache_dtype(const std::string& name, DType compute) {
  if (name == "auto") return compute;
  if (name == "fp8") return DType::FP8_E4M3;
  if (name == "int8") return DType::I8;
  throw Error("--kv-cache-dtype must be auto, fp8 or int8, got \"" + name + "\"");
}

}  // namespace serval
