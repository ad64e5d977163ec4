// config.json (Hugging Face transformers) -> ModelConfig.
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/hf_model.h"
#include "model/hf_quant.h"
#include "model/mapped_file.h"

namespace serval {

namespace {

using nlohmann::json;

std::string architecture_from_hf(const json& j) {
  if (j.contains("architectures") && j["architectures"].is_array() && !j["architectures"].empty()) {
    const json& a = j["architectures"][0];
    if (!a.is_string()) fail("\"architectures\" must hold strings");
    const std::string name = a.get<std::string>();
    if (name == "LlamaForCausalLM") return "llama";
    if (name == "MistralForCausalLM") return "mistral";
    if (name == "Qwen2ForCausalLM") return "qwen2";
    if (name == "Qwen3ForCausalLM") return "qwen3";
    check_architecture_supported(name);  // throws naming it
  }
  if (j.contains("model_type") && j["model_type"].is_string()) {
    const std::string t = j["model_type"].get<std::string>();
    check_architecture_supported(t);
    return t;
  }
  fail("config has neither \"architectures\" nor \"model_type\"");
}

int64_t get_int(const json& j, const char* key, int64_t dflt = -1) {
  if (!j.contains(key) || j[key].is_null()) {
    if (dflt < 0) fail("missing \"", key, "\"");
    return dflt;
  }
  const json& v = j[key];
  if (!v.is_number_integer()) fail("\"", key, "\" must be an integer");
  const int64_t x = v.get<int64_t>();
  if (x <= 0 || x > (int64_t(1) << 26)) fail("\"", key, "\" = ", x, " is out of range");
  return x;
}

double get_num(const json& j, const char* key, double dflt) {
  if (!j.contains(key) || j[key].is_null()) return dflt;
  if (!j[key].is_number()) fail("\"", key, "\" must be a number");
  return j[key].get<double>();
}

bool get_bool(const json& j, const char* key, bool dflt) {
  if (!j.contains(key) || j[key].is_null()) return dflt;
  if (!j[key].is_boolean()) fail("\"", key, "\" must be true or false");
  return j[key].get<bool>();
}

// Mistral: a window on every layer unless sliding_window is null. Qwen2/Qwen3:
// only with use_sliding_window, on the layers from max_window_layers on, or
// as layer_types lists them ("sliding_attention" / "full_attention").
void read_sliding_window(const json& j, ModelConfig& c) {
  if (!j.contains("sliding_window") || j["sliding_window"].is_null()) return;
  const bool qwen = c.architecture == "qwen2" || c.architecture == "qwen3";
  if (c.architecture == "llama") return;  // LlamaForCausalLM has no window, whatever the file says
  if (qwen && !get_bool(j, "use_sliding_window", false)) return;
  c.sliding_window = get_int(j, "sliding_window");
  if (qwen && j.contains("max_window_layers") && !j["max_window_layers"].is_null()) {
    const json& m = j["max_window_layers"];
    if (!m.is_number_integer() || m.get<int64_t>() < 0) fail("\"max_window_layers\" must be a non-negative integer");
    c.sliding_window_from_layer = m.get<int64_t>();
  } else if (qwen) {
    c.sliding_window_from_layer = 28;  // transformers' default
  }
  if (j.contains("layer_types") && !j["layer_types"].is_null()) {
    const json& types = j["layer_types"];
    if (!types.is_array() || int64_t(types.size()) != c.num_layers)
      fail("\"layer_types\" must list one type for each of the ", c.num_layers, " layers");
    for (const json& t : types) {
      if (t == "sliding_attention") c.sliding_layers.push_back(1);
      else if (t == "full_attention") c.sliding_layers.push_back(0);
      else fail("\"layer_types\" holds ", t.dump(), " (supported: sliding_attention, full_attention)");
    }
  }
}

// transformers 4 writes "rope_theta" and "rope_scaling"; transformers 5 writes both
// into one "rope_parameters" object ({"rope_type", "rope_theta", "factor", ...}).
const char* rope_key(const json& j) {
  return j.contains("rope_parameters") && !j["rope_parameters"].is_null() ? "rope_parameters" : "rope_scaling";
}

double rope_theta_from_hf(const json& j) {
  if (j.contains("rope_theta")) return get_num(j, "rope_theta", 10000.0);
  const char* key = rope_key(j);
  if (j.contains(key) && j[key].is_object()) return get_num(j[key], "rope_theta", 10000.0);
  return 10000.0;
}

RopeScaling rope_scaling_from_hf(const json& j) {
  RopeScaling rs;
  const char* key = rope_key(j);
  if (!j.contains(key) || j[key].is_null()) return rs;
  const json& r = j[key];
  if (!r.is_object()) fail("\"", key, "\" must be an object or null");
  std::string type;
  if (r.contains("rope_type") && r["rope_type"].is_string()) type = r["rope_type"].get<std::string>();
  else if (r.contains("type") && r["type"].is_string()) type = r["type"].get<std::string>();
  if (type.empty() || type == "default") return rs;
  rs.factor = float(get_num(r, "factor", 1.0));
  if (!(rs.factor > 0)) fail("rope_scaling factor must be positive");
  if (type == "linear") {
    rs.type = RopeScaling::Type::Linear;
  } else if (type == "llama3") {
    rs.type = RopeScaling::Type::Llama3;
    rs.low_freq_factor = float(get_num(r, "low_freq_factor", rs.low_freq_factor));
    rs.high_freq_factor = float(get_num(r, "high_freq_factor", rs.high_freq_factor));
    rs.original_max_position = get_int(r, "original_max_position_embeddings", rs.original_max_position);
  } else {
    fail("rope_scaling type \"", type, "\" is not supported (supported: linear, llama3)");
  }
  return rs;
}

}  // namespace

ModelConfig config_from_hf_json(const std::string& text, const std::string& label) {
  try {
    json j;
    try {
      j = json::parse(text);
    } catch (const json::exception& e) {
      fail("not valid JSON: ", e.what());
    }
    if (!j.is_object()) fail("must be a JSON object");
    ModelConfig c;
    c.architecture = architecture_from_hf(j);
    if (j.contains("_name_or_path") && j["_name_or_path"].is_string()) c.name = j["_name_or_path"].get<std::string>();
    if (j.contains("hidden_act") && j["hidden_act"].is_string() && j["hidden_act"] != "silu")
      fail("hidden_act \"", j["hidden_act"].get<std::string>(), "\" is not supported (supported: silu)");
    c.vocab_size = get_int(j, "vocab_size");
    c.hidden_size = get_int(j, "hidden_size");
    c.intermediate_size = get_int(j, "intermediate_size");
    c.num_layers = get_int(j, "num_hidden_layers");
    c.num_heads = get_int(j, "num_attention_heads");
    c.num_kv_heads = get_int(j, "num_key_value_heads", c.num_heads);
    c.head_dim = get_int(j, "head_dim", std::max<int64_t>(1, c.hidden_size / c.num_heads));
    c.rope_dim = c.head_dim;
    c.max_position = get_int(j, "max_position_embeddings", 2048);
    c.rms_eps = float(get_num(j, "rms_norm_eps", 1e-6));
    c.rope_theta = float(rope_theta_from_hf(j));
    c.rope_scaling = rope_scaling_from_hf(j);
    c.rope_style = RopeStyle::Neox;  // HF checkpoints keep q/k rows in rotate_half order
    c.tie_word_embeddings = get_bool(j, "tie_word_embeddings", false);
    // Qwen2 always has q/k/v biases; llama and qwen3 say so in attention_bias.
    c.attention_bias = get_bool(j, "attention_bias", c.architecture == "qwen2");
    c.qk_norm = c.architecture == "qwen3";
    read_sliding_window(j, c);
    const HfQuantization q = hf_quantization_from_json(j);
    if (q.method != HfQuantization::Method::None) {
      c.quant_method = q.method_name();
      c.quant_summary = q.describe();
      c.fp8_block_rows = q.block_rows;
      c.fp8_block_cols = q.block_cols;
      if (q.kv_code_max > 0) c.kv_scale_code_max = q.kv_code_max;
    }
    c.validate();
    return c;
  } catch (const nlohmann::json::exception& e) {
    fail("\"", label, "\": ", e.what());
  } catch (const Error& e) {
    fail("\"", label, "\": ", e.what());
  }
}

ModelConfig config_from_hf_folder(const std::string& dir) {
  const std::string path = dir + "/config.json";
  return config_from_hf_json(read_text_file(path), path);
}

}  // namespace serval
