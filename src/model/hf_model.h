#pragma once
// Hugging Face model folders: config.json -> ModelConfig, safetensors weights
// (model.safetensors, or shards listed by model.safetensors.index.json) renamed to
// GGUF tensor names.
#include <map>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "model/model_loader.h"

namespace serval {

// Parses a config.json text (`label` names it in errors).
ModelConfig config_from_hf_json(const std::string& json_text, const std::string& label = "config.json");
ModelConfig config_from_hf_folder(const std::string& dir);

// "model.layers.3.self_attn.q_proj.weight" -> "blk.3.attn_q.weight"; returns ""
// for tensors Serval does not use (rotary inv_freq buffers).
std::string gguf_name_from_hf(const std::string& hf_name);

class SafetensorsFile;
class WeightStore;
// Adds the tensors of one safetensors file that Serval uses, under GGUF names
// (views into the file; the caller keeps `file` alive). `only` (optional) keeps
// just the HF names the index assigns to this file.
void add_safetensors_weights(const SafetensorsFile& file, const ModelConfig& config, WeightStore& out,
                             const std::map<std::string, std::string>* weight_map = nullptr,
                             const std::string& shard_name = "");

// Config + weights (views into the mmap'd safetensors), shapes checked.
LoadedModel load_hf_model(const std::string& dir);

}  // namespace serval
