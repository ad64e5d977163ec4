// libFuzzer harness: safetensors parsing, then the Hugging Face loader's steps:
// ModelConfig from a config.json (taken from the file's __metadata__["config"]
// when present, else a fixed tiny llama config), tensor renaming, dtype checks,
// a quantization_config's scales (model/hf_quant.h) and shape validation, and
// the first layer's weights loaded (FP8 ones dequantized as q/k rows permute).
// Every input must either load or throw serval::Error.
#include <cstddef>
#include <cstdint>
#include <map>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/hf_model.h"
#include "model/hf_quant.h"
#include "model/model_def.h"
#include "model/safetensors.h"

namespace {
const char* kDefaultConfig = R"({"architectures": ["LlamaForCausalLM"], "vocab_size": 16,
  "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
  "num_key_value_heads": 1, "tie_word_embeddings": true})";
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    auto file = serval::SafetensorsFile::parse(data, size, "fuzz");
    auto it = file->metadata().find("config");
    const std::string config_text = it == file->metadata().end() ? kDefaultConfig : it->second;
    const serval::ModelConfig config = serval::config_from_hf_json(config_text, "fuzz config");
    serval::WeightStore weights;
    serval::add_safetensors_weights(*file, config, weights);
    std::map<std::string, const serval::SafetensorsTensor*> by_name;
    for (const auto& t : file->tensors()) by_name[t.name] = &t;
    serval::add_hf_quantized_weights(serval::hf_quantization_from_json(nlohmann::json::parse(config_text)), by_name,
                                    config, weights);
    const serval::ModelDef def = serval::ModelDef::of(config);
    def.check_weights(weights);
    def.load_layer(weights, 0, serval::WeightTransforms{true});
  } catch (const serval::Error&) {
  }
  return 0;
}
