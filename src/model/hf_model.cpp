// Hugging Face folder loader: config.json + safetensors (single file or shards).
#include <cstring>
#include <filesystem>
#include <regex>
#include <set>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/hf_model.h"
#include "model/hf_quant.h"
#include "model/mapped_file.h"
#include "model/model_def.h"
#include "model/rope_factors.h"
#include "model/safetensors.h"

namespace serval {

namespace fs = std::filesystem;

std::string gguf_name_from_hf(const std::string& n) {
  static const std::map<std::string, std::string> top = {
      {"model.embed_tokens.weight", "token_embd.weight"},
      {"model.norm.weight", "output_norm.weight"},
      {"lm_head.weight", "output.weight"},
  };
  if (auto it = top.find(n); it != top.end()) return it->second;
  static const std::map<std::string, std::string> layer = {
      {"input_layernorm.weight", "attn_norm.weight"},
      {"post_attention_layernorm.weight", "ffn_norm.weight"},
      {"self_attn.q_proj.weight", "attn_q.weight"},
      {"self_attn.k_proj.weight", "attn_k.weight"},
      {"self_attn.v_proj.weight", "attn_v.weight"},
      {"self_attn.o_proj.weight", "attn_output.weight"},
      {"self_attn.q_proj.bias", "attn_q.bias"},
      {"self_attn.k_proj.bias", "attn_k.bias"},
      {"self_attn.v_proj.bias", "attn_v.bias"},
      {"self_attn.q_norm.weight", "attn_q_norm.weight"},
      {"self_attn.k_norm.weight", "attn_k_norm.weight"},
      {"mlp.gate_proj.weight", "ffn_gate.weight"},
      {"mlp.up_proj.weight", "ffn_up.weight"},
      {"mlp.down_proj.weight", "ffn_down.weight"},
      {"self_attn.k_scale", "kv_k_scale"},  // a quantized KV cache's (model/kv_checkpoint_scales.h)
      {"self_attn.v_scale", "kv_v_scale"},
  };
  static const std::regex re(R"(model\.layers\.(\d+)\.(.+))");
  std::smatch m;
  if (std::regex_match(n, m, re)) {
    if (auto it = layer.find(m[2].str()); it != layer.end()) return "blk." + m[1].str() + "." + it->second;
  }
  return "";
}

namespace {

// The safetensors files of a folder: the shards named by the index, or model.safetensors.
std::vector<std::string> weight_files(const std::string& dir, std::map<std::string, std::string>& weight_map) {
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  if (fs::exists(index)) {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(read_text_file(index.string()));
    } catch (const nlohmann::json::exception& e) {
      fail("\"", index.string(), "\" is not valid JSON: ", e.what());
    }
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
      fail("\"", index.string(), "\" has no weight_map object");
    std::set<std::string> files;
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      if (!it.value().is_string()) fail("\"", index.string(), "\": weight_map values must be file names");
      const std::string file = it.value().get<std::string>();
      // Shards live beside the index; a path elsewhere is not a shard.
      if (file.empty() || file.find('/') != std::string::npos || file == "..")
        fail("\"", index.string(), "\": bad shard file name \"", file, "\"");
      weight_map[it.key()] = file;
      files.insert(file);
    }
    return {files.begin(), files.end()};
  }
  const fs::path single = fs::path(dir) / "model.safetensors";
  if (!fs::exists(single))
    fail("model folder \"", dir, "\" has neither model.safetensors nor model.safetensors.index.json");
  return {"model.safetensors"};
}

}  // namespace

void add_safetensors_weights(const SafetensorsFile& st, const ModelConfig& config, WeightStore& out,
                             const std::map<std::string, std::string>* weight_map, const std::string& shard_name) {
  for (const SafetensorsTensor& t : st.tensors()) {
    if (weight_map) {
      auto it = weight_map->find(t.name);
      if (it == weight_map->end() || it->second != shard_name) continue;  // the index places it elsewhere
    }
    const std::string name = gguf_name_from_hf(t.name);
    if (name.empty()) continue;
    if (name == "output.weight" && config.tie_word_embeddings) continue;
    TensorView v;
    v.name = name;
    v.shape = t.shape;
    v.data = t.data;
    v.nbytes = t.nbytes;
    try {
      v.dtype = dtype_from_safetensors(t.dtype, t.name);
      out.add(std::move(v));
    } catch (const Error& e) {
      fail("safetensors \"", st.path(), "\": ", e.what());
    }
  }
}

LoadedModel load_hf_model(const std::string& dir) {
  LoadedModel m;
  const std::string config_path = dir + "/config.json";
  const std::string config_text = read_text_file(config_path);
  m.config = config_from_hf_json(config_text, config_path);  // checks quantization_config too
  const HfQuantization quant = hf_quantization_from_json(nlohmann::json::parse(config_text));
  m.path = dir;
  m.format = "hf";
  std::map<std::string, std::string> weight_map;
  std::map<std::string, const SafetensorsTensor*> by_name;  // every tensor of the folder (scales included)
  for (const std::string& file : weight_files(dir, weight_map)) {
    auto st = SafetensorsFile::open((fs::path(dir) / file).string());
    add_safetensors_weights(*st, m.config, m.weights, weight_map.empty() ? nullptr : &weight_map, file);
    for (const SafetensorsTensor& t : st->tensors()) {
      auto it = weight_map.find(t.name);
      if (weight_map.empty() || (it != weight_map.end() && it->second == file)) by_name[t.name] = &t;
    }
    m.weights.keep_alive(st);
  }
  try {
    add_hf_quantized_weights(quant, by_name, m.config, m.weights);
  } catch (const Error& e) {
    fail("model folder \"", dir, "\": ", e.what());
  }
  for (const auto& [hf_name, file] : weight_map) {
    const std::string name = gguf_name_from_hf(hf_name);
    if (!name.empty() && !m.weights.find(name) && !(name == "output.weight" && m.config.tie_word_embeddings))
      fail("model folder \"", dir, "\": tensor \"", hf_name, "\" is listed in the index but not in \"", file, "\"");
  }
  // One rule for the runtime, whatever the source: llama3 scaling is the
  // rope_freqs.weight divisors (as in llama.cpp's GGUF files).
  if (m.config.rope_scaling.type == RopeScaling::Type::Llama3) {
    const std::vector<float> f = llama3_rope_factors(m.config);
    std::vector<uint8_t> bytes(f.size() * 4);
    std::memcpy(bytes.data(), f.data(), bytes.size());
    m.weights.add_owned(kRopeFreqsTensor, DType::F32, {int64_t(f.size())}, std::move(bytes));
  }
  try {
    ModelDef::of(m.config).check_weights(m.weights);
  } catch (const Error& e) {
    fail("model folder \"", dir, "\": ", e.what());
  }
  return m;
}

}  // namespace serval
