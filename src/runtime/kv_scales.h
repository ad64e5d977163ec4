#pragma once
// Scales of a quantized KV cache (kv/kv_quant.h): one f32 per (layer, KV
// head) for K and one for V, laid out per layer as KvLayer::scales is
// ([2, num_kv_heads], K's then V's).
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/backend.h"

namespace serval {

struct KvScales {
  std::vector<std::vector<float>> layers;  // [num_layers][2 * num_kv_heads]
  std::string source;                      // for the start-up log
};

// Per KV head, the largest |value| of K and of V in the first `tokens` slots
// of a full-precision pool (read back from the device): [2 * num_kv_heads].
std::vector<float> kv_pool_amax(Backend& backend, const KvLayer& kv, const KvGeometry& geom, int64_t tokens);

// The scales of `dtype` for those amaxes (kv_scale_for_amax, elementwise).
std::vector<float> kv_scales_for_amax(DType dtype, const std::vector<float>& amax);

// Uploads each layer's scales to its pools' KvLayer::scales.
void upload_kv_scales(Backend& backend, const KvScales& scales, std::vector<KvLayer>& layers);

// "K/V scales per head: 0.0012-0.031 (K), 0.0004-0.0098 (V)".
std::string describe_kv_scales(const KvScales& scales);

}  // namespace serval
