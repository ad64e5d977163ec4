#pragma once
// Quantized Hugging Face checkpoints: config.json's quantization_config read
// and checked, and the tensors stored for each quantized weight brought to a
// Linear format (model/linear.h). What loads (docs/QUANTIZED_CHECKPOINTS.md):
//  - quant_method "fp8" (transformers' FineGrainedFP8, DeepSeek-V3 style):
//    F8_E4M3 weights with `weight_scale_inv` scales per [128, 128] block
//    (weight_block_size), or per tensor (weight_block_size null; the older
//    static kind, AutoFP8's, names its scale `weight_scale`);
//  - quant_method "compressed-tensors" (llm-compressor): format
//    "float-quantized" (FP8 e4m3 weights, `weight_scale` per tensor, channel or
//    block), "int-quantized" (int8 weights, `weight_scale` per tensor or
//    channel: W8A8 / INT8) and "pack-quantized" (int4 packed eight to an int32
//    in `weight_packed`, `weight_scale` per group or channel, packed
//    `weight_zero_point` when asymmetric: W4A16; or int8 packed four to an
//    int32 per channel: W8A16); its `ignore` list is honoured;
//  - quant_method "awq" (AutoAWQ, version "gemm"): `qweight` / `qzeros`
//    [in, out / 8] int32 in AWQ's interleaved nibble order, `scales` [in / g, out];
//  - quant_method "gptq" (AutoGPTQ's v1 zero points, stored minus one, and
//    GPTQModel's gptq_v2): `qweight` [in / 8, out], `qzeros` [in / g, out / 8],
//    `scales` [in / g, out], `g_idx` [in]; 4 bits, or 8 bits per channel.
// FP8 weights are w = q * scale, int8 w = q * scale[row], int4
// w = (q - zero) * scale per group with q and zero in 0..15 (each tool's
// convention mapped onto that exactly). A weight whose groups are not
// contiguous (GPTQ desc_act, compressed-tensors actorder "group": a g_idx
// that is not column / group_size) is dequantized to a dense f32 matrix at
// load. Activation quantization (dynamic per token or group, static
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
  enum class Method : uint8_t { None, Fp8, CompressedTensors, Awq, Gptq };
  // How a quantized weight is stored in the checkpoint.
  enum class Storage : uint8_t {
    Fp8,        // `weight` F8_E4M3 [out, in] beside its scales
    Int8,       // `weight` I8 [out, in] beside its scales (compressed-tensors int-/naive-quantized)
    CtPacked,   // compressed-tensors pack-quantized: `weight_packed`, `weight_scale`, `weight_zero_point`, ...
    Awq,        // AutoAWQ GEMM: `qweight`, `qzeros`, `scales`
    Gptq,       // GPTQ: `qweight`, `qzeros`, `scales`, `g_idx`
  };
  enum class Scales : uint8_t {
    Tensor,          // one scale
    Channel,         // one per output row: [out, 1] (or [out])
    Block,           // one per block_rows x block_cols block: [ceil(out / rows), ceil(in / cols)]
    BlockOrTensor,   // fp8 without weight_block_size: transformers' default 128 x 128 blocks, or
                     // vLLM's (AutoFP8's) per-tensor scale; the scale's shape tells
    Group,           // int: one per group_size inputs of a row
  };
  Method method = Method::None;
  Storage storage = Storage::Fp8;
  Scales scales = Scales::Tensor;
  int64_t block_rows = 0, block_cols = 0;
  int64_t bits = 8;           // int weights: 4 or 8
  int64_t group_size = 0;     // Scales::Group
  bool symmetric = true;      // int weights without zero points
  bool zeros_minus_one = false;  // GPTQ v1: a zero point is stored minus one
  bool act_order = false;     // GPTQ desc_act / compressed-tensors actorder: g_idx may reorder groups
  // Names of the scale tensor beside a module's weight, in the order looked for.
  std::vector<std::string> scale_names;
  // compressed-tensors: the config groups' targets ("Linear", module names,
  // "re:" regexes) and `ignore`; fp8 and awq: modules_to_not_convert.
  std::vector<std::string> targets, ignore;
  std::string activations;  // what the checkpoint asks of activations (not emulated), for `describe`
  std::string scheme_field;  // the config field that sets the scales, for errors
  // compressed-tensors kv_cache_scheme: the largest code the checkpoint's
  // k_scale / v_scale were set for (448 fp8, 127 int8); 0: no scheme.
  float kv_code_max = 0;

  // Whether the config quantizes the linear module `module` (an HF module
  // name: "model.layers.0.self_attn.q_proj", "lm_head"). GPTQ: every module
  // (the file's tensors tell which are).
  bool quantizes(const std::string& module) const;
  // "compressed-tensors fp8 e4m3, per-channel weight scales; activations: dynamic per token (not emulated)"
  std::string describe() const;
  // quant_method as config.json spells it ("" for None).
  std::string method_name() const;
};

// Reads config.json's quantization_config (absent or null: Method::None).
// Throws serval::Error naming the field and value of a variant Serval does
// not load.
HfQuantization hf_quantization_from_json(const nlohmann::json& config);

// Checks every linear weight of `config`'s model against `q` (a quantized
// module has its format's tensors; an unquantized one a plain `weight`) and
// adds what the Linear formats need to `store` (names in model_def.h): an FP8
// or int8 weight's f32 scales under quant_scale_name ([1] per tensor, [out]
// per channel, [ceil(out / rows), ceil(in / cols)] per block); an int4
// weight's packed nibbles, [out, g] scales and zero points
// (int4_weight_name, quant_scale_name, int4_zero_name); a weight the formats
// cannot hold (groups reordered by g_idx) dequantized, f32 [out, in] under its
// own name. `tensors`: every tensor of the folder, by its HF name. Throws
// naming the tensor (a missing or mis-shaped tensor, a quantized tensor that
// is not a quantized linear's).
void add_hf_quantized_weights(const HfQuantization& q, const std::map<std::string, const SafetensorsTensor*>& tensors,
                              const ModelConfig& config, WeightStore& store);

}  // namespace serval
