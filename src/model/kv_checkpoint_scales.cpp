#include "model/kv_checkpoint_scales.h"

#include <cmath>

#include "core/error.h"
#include "kv/kv_quant.h"
#include "model/model_def.h"

namespace serval {

std::string kv_scale_tensor_name(int64_t layer, bool v) {
  return "blk." + std::to_string(layer) + (v ? ".kv_v_scale" : ".kv_k_scale");
}

namespace {

std::string hf_name(int64_t layer, bool v) {
  return "model.layers." + std::to_string(layer) + (v ? ".self_attn.v_scale" : ".self_attn.k_scale");
}

// The values of one scale tensor, checked; `heads` of them (one broadcast).
std::vector<float> read_scale(const TensorView& t, int64_t layer, bool v, int64_t heads) {
  const std::string name = hf_name(layer, v);
  SERVAL_CHECK(t.numel() == 1 || t.numel() == heads, "tensor \"", name, "\" has shape ", t.shape_str(),
               ": a KV scale holds 1 value or one per KV head (", heads, ")");
  SERVAL_CHECK(t.dtype == DType::F32 || t.dtype == DType::F16 || t.dtype == DType::BF16, "tensor \"", name,
               "\" is ", dtype_name(t.dtype), ": a KV scale is f32, f16 or bf16");
  SERVAL_CHECK(t.nbytes == dtype_bytes(t.dtype, t.numel()), "tensor \"", name, "\" holds ", t.nbytes,
               " bytes, expected ", dtype_bytes(t.dtype, t.numel()));
  std::vector<float> values(static_cast<size_t>(t.numel()));
  to_f32(t.dtype, t.data, values.data(), t.numel());
  for (size_t i = 0; i < values.size(); ++i)
    SERVAL_CHECK(std::isfinite(values[i]) && values[i] > 0, "tensor \"", name, "\" has value ", values[i],
                 " at ", i, ": a KV scale must be finite and positive");
  if (values.size() == 1) values.assign(size_t(heads), values[0]);
  return values;
}

}  // namespace

void check_kv_checkpoint_scales(const ModelConfig& config, const WeightStore& weights) {
  kv_checkpoint_scales(config, weights, DType::FP8_E4M3);
}

std::vector<std::vector<float>> kv_checkpoint_scales(const ModelConfig& config, const WeightStore& weights,
                                                     DType dtype) {
  const ModelDef def = ModelDef::of(config);
  int64_t with = 0;
  for (int64_t l = 0; l < config.num_layers; ++l)
    for (bool v : {false, true}) with += weights.find(kv_scale_tensor_name(l, v)) != nullptr;
  if (with == 0) return {};
  std::vector<std::vector<float>> out;
  for (int64_t l = 0; l < config.num_layers; ++l) {
    const int64_t heads = def.layer(l).attention.num_kv_heads;
    std::vector<float> layer;
    for (bool v : {false, true}) {
      const TensorView* t = weights.find(kv_scale_tensor_name(l, v));
      SERVAL_CHECK(t != nullptr, "tensor \"", hf_name(l, v), "\" is missing: the checkpoint has KV scales for ",
                   "other layers, and Serval takes them for all or none");
      for (float s : read_scale(*t, l, v, heads))
        layer.push_back(s * config.kv_scale_code_max / kv_code_max(dtype));  // the same amax
    }
    out.push_back(std::move(layer));
  }
  return out;
}

}  // namespace serval
