#pragma once
// K/V cache scales stored in a checkpoint, as llm-compressor and vLLM write
// them: `model.layers.N.self_attn.k_scale` and `v_scale` (loaded as
// blk.N.kv_k_scale / kv_v_scale), one value per layer or one per KV head,
// for codes up to ModelConfig::kv_scale_code_max (value = code * scale).
// --kv-cache-dtype fp8|int8 takes them instead of calibrating.
#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "model/model_config.h"
#include "model/weights.h"

namespace serval {

std::string kv_scale_tensor_name(int64_t layer, bool v);

// Throws serval::Error naming the tensor when the checkpoint's KV scales are
// malformed: present for some layers (or only K or only V) and not others,
// neither 1 nor num_kv_heads values, not finite or not positive.
void check_kv_checkpoint_scales(const ModelConfig& config, const WeightStore& weights);

// Per layer, [2 * num_kv_heads] scales (K's then V's) for codes of `dtype`
// (FP8_E4M3 or I8), converted from the checkpoint's through their amax
// (scale * kv_scale_code_max); empty when the checkpoint has none.
std::vector<std::vector<float>> kv_checkpoint_scales(const ModelConfig& config, const WeightStore& weights,
                                                     DType dtype);

}  // namespace serval
