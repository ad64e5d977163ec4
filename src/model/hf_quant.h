#pragma once
// Quantized Hugging Face checkpoints: config.json's quantization_config read
// and checked, and the scales stored beside each quantized weight found and
// brought to one layout. What loads (docs/QUANTIZED_CHECKPOINTS.md):
//  - quant_method "fp8" (transformers' FineGrainedFP8, DeepSeek-V3 style):
//    F8_E4M3 weights with `weight_scale_inv` scales per [128, 128] block
//    (weight_block_size), or per tensor (weight_block_size null; the older
//    static kind, AutoFP8's, names its scale `weight_scale`);
//  - quant_method "compressed-tensors" (llm-compressor), format
//    "float-quantized" (or "naive-quantized" with 8-bit float weights):
//    F8_E4M3 weights with `weight_scale` per tensor, per output channel or per
//    block; its `ignore` list (layers left unquantized) is honoured.
// Every weight is w = q * scale with the scheme's broadcasting, dequantized
// where the backend does not run the format (today: everywhere, once, at
// load). Activation quantization (dynamic per token or group, static
// `input_scale` / `activation_scale`) is not emulated: activations stay in
// the backend's dtype. Any other variant is refused with an error naming the
// config field and its value.
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "model/model_config.h"

namespace serval {

struct SafetensorsTensor;
class WeightStore;

struct HfQuantization {
  enum class Method : uint8_t { None, Fp8, CompressedTensors };
  enum class Scales : uint8_t {
    Tensor,          // one scale
    Channel,         // one per output row: [out, 1] (or [out])
    Block,           // one per block_rows x block_cols block: [ceil(out / rows), ceil(in / cols)]
    BlockOrTensor,   // fp8 without weight_block_size: transformers' default 128 x 128 blocks, or
                     // vLLM's (AutoFP8's) per-tensor scale; the scale's shape tells
  };
  Method method = Method::None;
  Scales scales = Scales::Tensor;
  int64_t block_rows = 0, block_cols = 0;
  // Names of the scale tensor beside a module's weight, in the order looked for.
  std::vector<std::string> scale_names;
  // compressed-tensors: the config groups' targets ("Linear", module names,
  // "re:" regexes) and `ignore`; fp8: modules_to_not_convert.
  std::vector<std::string> targets, ignore;
  std::string activations;  // what the checkpoint asks of activations (not emulated), for `describe`
  std::string scheme_field;  // the config field that sets the scales, for errors

  // Whether the config quantizes the linear module `module` (an HF module
  // name: "model.layers.0.self_attn.q_proj", "lm_head").
  bool quantizes(const std::string& module) const;
  // "compressed-tensors fp8 e4m3, per-channel weight scales; activations: dynamic per token (not emulated)"
  std::string describe() const;
};

// Reads config.json's quantization_config (absent or null: Method::None).
// Throws serval::Error naming the field and value of a variant Serval does
// not load.
HfQuantization hf_quantization_from_json(const nlohmann::json& config);

// Checks every linear weight of `config`'s model against `q` (a quantized
// module's weight is F8_E4M3 beside its scales; an unquantized one is not) and
// adds each FP8 weight's scales to `store`, in f32 under fp8_scale_name (model_def.h):
// [1] per tensor, [out] per channel, [ceil(out / rows), ceil(in / cols)] per
// block. `tensors`: every tensor of the folder, by its HF name. Throws naming
// the tensor (a missing or mis-shaped scale, an F8 tensor that is not a
// quantized linear's weight).
void add_hf_quantized_scales(const HfQuantization& q, const std::map<std::string, const SafetensorsTensor*>& tensors,
                             const ModelConfig& config, WeightStore& store);

}  // namespace serval
