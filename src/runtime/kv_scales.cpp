#include "runtime/kv_scales.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "core/error.h"
#include "kv/kv_quant.h"

namespace serval {

std::vector<float> kv_pool_amax(Backend& backend, const KvLayer& kv, const KvGeometry& g, int64_t tokens) {
  const int64_t H = g.num_kv_heads, D = g.head_dim, n = tokens * H * D;
  SERVAL_CHECK(!kv_dtype_quantized(g.dtype) && tokens <= g.num_blocks * g.block_size,
               "kv_pool_amax: a pool of ", dtype_name(g.dtype), " for ", tokens, " tokens");
  std::vector<uint8_t> bytes(size_t(dtype_bytes(g.dtype, n)));
  std::vector<float> values(static_cast<size_t>(n));
  std::vector<float> amax(size_t(2 * H), 0.0f);
  const DeviceBuffer* pools[2] = {&kv.k, &kv.v};
  for (int64_t which = 0; which < 2; ++which) {
    backend.copy_to_host(bytes.data(), pools[which]->data(), int64_t(bytes.size()));
    to_f32(g.dtype, bytes.data(), values.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      float& m = amax[size_t(which * H + (i / D) % H)];
      m = std::fmax(m, std::fabs(values[size_t(i)]));  // fmax drops a NaN
    }
  }
  return amax;
}

std::vector<float> kv_scales_for_amax(DType dtype, const std::vector<float>& amax) {
  std::vector<float> scales(amax.size());
  for (size_t i = 0; i < amax.size(); ++i) scales[i] = kv_scale_for_amax(dtype, amax[i]);
  return scales;
}

void upload_kv_scales(Backend& backend, const KvScales& scales, std::vector<KvLayer>& layers) {
  SERVAL_CHECK(scales.layers.size() == layers.size(), "KV scales for ", scales.layers.size(), " layers, the pool has ",
               layers.size());
  for (size_t l = 0; l < layers.size(); ++l) {
    const std::vector<float>& s = scales.layers[l];
    SERVAL_CHECK(int64_t(s.size() * sizeof(float)) == layers[l].scales.bytes(), "KV scales of layer ", l, ": ",
                 s.size(), " values for a buffer of ", layers[l].scales.bytes(), " bytes");
    backend.copy_to_device(layers[l].scales.data(), s.data(), int64_t(s.size() * sizeof(float)));
  }
}

std::string describe_kv_scales(const KvScales& scales) {
  float lo[2] = {INFINITY, INFINITY}, hi[2] = {0, 0};
  for (const std::vector<float>& s : scales.layers) {
    const size_t H = s.size() / 2;
    for (size_t i = 0; i < s.size(); ++i) {
      lo[i / H] = std::min(lo[i / H], s[i]);
      hi[i / H] = std::max(hi[i / H], s[i]);
    }
  }
  char buf[160];
  std::snprintf(buf, sizeof buf, "scales per (layer, KV head) %.3g-%.3g (K), %.3g-%.3g (V)", lo[0], hi[0], lo[1],
                hi[1]);
  return buf;
}

}  // namespace serval
