// Hugging Face tokenizer.json + tokenizer_config.json -> GGUF tokenizer.ggml.* keys
// (llama.cpp's names, read by Serval's tokenizer module).
#include <filesystem>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/convert.h"
#include "model/mapped_file.h"

namespace serval {

namespace {

using nlohmann::json;
namespace fs = std::filesystem;

json read_json(const fs::path& path) {
  try {
    return json::parse(read_text_file(path.string()));
  } catch (const json::exception& e) {
    fail("\"", path.string(), "\" is not valid JSON: ", e.what());
  }
}

// "bos_token": "<s>" or {"content": "<s>", ...} or null.
std::string token_text(const json& cfg, const char* key) {
  if (!cfg.contains(key)) return "";
  const json& v = cfg[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return "";
}

bool has_type(const json& node, const std::string& type) {
  if (!node.is_object()) return false;
  if (node.value("type", "") == type) return true;
  for (const char* list : {"pretokenizers", "processors", "decoders"})
    if (node.contains(list) && node[list].is_array())
      for (const json& child : node[list])
        if (has_type(child, type)) return true;
  return false;
}

// True when the post-processor's single-sequence template starts with a special token.
bool template_adds_bos(const json& tok) {
  if (!tok.contains("post_processor") || !tok["post_processor"].is_object()) return false;
  const json& pp = tok["post_processor"];
  const json* single = nullptr;
  if (pp.value("type", "") == "TemplateProcessing" && pp.contains("single")) single = &pp["single"];
  if (pp.contains("processors") && pp["processors"].is_array())
    for (const json& p : pp["processors"])
      if (p.value("type", "") == "TemplateProcessing" && p.contains("single")) single = &p["single"];
  return single && single->is_array() && !single->empty() && (*single)[0].contains("SpecialToken");
}

std::vector<std::string> merges_of(const json& model) {
  std::vector<std::string> merges;
  if (!model.contains("merges") || !model["merges"].is_array()) return merges;
  for (const json& m : model["merges"]) {
    if (m.is_string()) merges.push_back(m.get<std::string>());
    else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string())
      merges.push_back(m[0].get<std::string>() + " " + m[1].get<std::string>());
    else fail("tokenizer.json: merges must be \"a b\" strings or [a, b] pairs");
  }
  return merges;
}

}  // namespace

void set_gguf_tokenizer_from_hf(GgufWriter& w, const std::string& dir, const std::string& arch, int64_t vocab_size) {
  const fs::path tok_path = fs::path(dir) / "tokenizer.json";
  if (!fs::exists(tok_path)) fail("model folder \"", dir, "\" has no tokenizer.json");
  const json tok = read_json(tok_path);
  const fs::path cfg_path = fs::path(dir) / "tokenizer_config.json";
  const json cfg = fs::exists(cfg_path) ? read_json(cfg_path) : json::object();
  try {
    const json& model = tok.at("model");
    const std::string type = model.value("type", "");
    if (type != "BPE") fail("tokenizer model type \"", type, "\" is not supported (supported: BPE)");
    const bool byte_level = has_type(tok.value("pre_tokenizer", json()), "ByteLevel") ||
                            has_type(tok.value("decoder", json()), "ByteLevel");
    const bool spm = !byte_level && model.value("byte_fallback", false);
    if (!byte_level && !spm)
      fail("tokenizer.json is neither byte-level BPE nor SentencePiece-style BPE with byte fallback");

    // Dense id -> token table from the model vocab and the added tokens.
    std::vector<std::string> tokens;
    std::vector<int32_t> types;
    std::vector<bool> filled;
    auto place = [&](int64_t id, const std::string& text, GgufTokenType t) {
      if (id < 0 || id > (int64_t(1) << 24)) fail("tokenizer.json: token id ", id, " is out of range");
      if (size_t(id) >= tokens.size()) {
        tokens.resize(size_t(id) + 1);
        types.resize(size_t(id) + 1, int32_t(GgufTokenType::Unused));
        filled.resize(size_t(id) + 1, false);
      }
      tokens[size_t(id)] = text;
      types[size_t(id)] = int32_t(t);
      filled[size_t(id)] = true;
    };
    const std::string unk = model.contains("unk_token") && model["unk_token"].is_string()
                                ? model["unk_token"].get<std::string>() : "";
    for (auto it = model.at("vocab").begin(); it != model.at("vocab").end(); ++it) {
      const std::string& text = it.key();
      GgufTokenType t = GgufTokenType::Normal;
      if (spm && text == unk) t = GgufTokenType::Unknown;
      else if (spm && text.size() == 6 && text.compare(0, 3, "<0x") == 0 && text[5] == '>') t = GgufTokenType::Byte;
      place(it.value().get<int64_t>(), text, t);
    }
    if (tok.contains("added_tokens") && tok["added_tokens"].is_array())
      for (const json& a : tok["added_tokens"]) {
        const std::string text = a.at("content").get<std::string>();
        GgufTokenType t = a.value("special", false) ? GgufTokenType::Control : GgufTokenType::UserDefined;
        if (spm && text == unk) t = GgufTokenType::Unknown;
        place(a.at("id").get<int64_t>(), text, t);
      }
    // The embedding may be larger than the tokenizer (Qwen pads to a multiple of 128).
    if (vocab_size > int64_t(tokens.size())) {
      tokens.resize(size_t(vocab_size));
      types.resize(size_t(vocab_size), int32_t(GgufTokenType::Unused));
      filled.resize(size_t(vocab_size), false);
    }
    for (size_t i = 0; i < tokens.size(); ++i)
      if (!filled[i]) tokens[i] = "[PAD" + std::to_string(i) + "]";
    if (int64_t(tokens.size()) > vocab_size)
      fail("tokenizer.json has ", tokens.size(), " tokens but the model's vocab_size is ", vocab_size);

    std::unordered_map<std::string, int64_t> ids;
    for (size_t i = 0; i < tokens.size(); ++i)
      if (filled[i]) ids.emplace(tokens[i], int64_t(i));
    auto id_of = [&](const std::string& text) -> int64_t {
      auto it = ids.find(text);
      return text.empty() || it == ids.end() ? -1 : it->second;
    };
    const std::vector<std::string> merges = merges_of(model);
    if (byte_level) {
      w.set_string("tokenizer.ggml.model", "gpt2");
      w.set_string("tokenizer.ggml.pre", arch == "llama" ? "llama-bpe" : "qwen2");
      w.set_string_array("tokenizer.ggml.tokens", tokens);
      w.set_i32_array("tokenizer.ggml.token_type", types);
      w.set_string_array("tokenizer.ggml.merges", merges);
    } else {
      // SentencePiece BPE merges by piece score. tokenizer.json keeps the merges in
      // that order instead, so a merge's rank gives its result's score.
      std::vector<float> scores(tokens.size(), 0.0f);
      std::vector<bool> scored(tokens.size(), false);
      for (size_t r = 0; r < merges.size(); ++r) {
        const size_t sp = merges[r].find(' ');
        if (sp == std::string::npos) continue;
        const int64_t id = id_of(merges[r].substr(0, sp) + merges[r].substr(sp + 1));
        if (id >= 0 && !scored[size_t(id)]) {
          scores[size_t(id)] = -float(r + 1);
          scored[size_t(id)] = true;
        }
      }
      w.set_string("tokenizer.ggml.model", "llama");
      w.set_string_array("tokenizer.ggml.tokens", tokens);
      w.set_f32_array("tokenizer.ggml.scores", scores);
      w.set_i32_array("tokenizer.ggml.token_type", types);
    }

    const int64_t bos = id_of(token_text(cfg, "bos_token"));
    const int64_t eos = id_of(token_text(cfg, "eos_token"));
    const int64_t pad = id_of(token_text(cfg, "pad_token"));
    const int64_t unk_id = id_of(unk.empty() ? token_text(cfg, "unk_token") : unk);
    if (bos >= 0) w.set_u32("tokenizer.ggml.bos_token_id", uint32_t(bos));
    if (eos >= 0) w.set_u32("tokenizer.ggml.eos_token_id", uint32_t(eos));
    if (pad >= 0) w.set_u32("tokenizer.ggml.padding_token_id", uint32_t(pad));
    if (unk_id >= 0) w.set_u32("tokenizer.ggml.unknown_token_id", uint32_t(unk_id));
    bool add_bos;
    if (cfg.contains("add_bos_token") && cfg["add_bos_token"].is_boolean()) add_bos = cfg["add_bos_token"].get<bool>();
    else add_bos = bos >= 0 && (spm || template_adds_bos(tok) || arch == "llama");
    w.set_bool("tokenizer.ggml.add_bos_token", add_bos);
    const bool add_eos = cfg.contains("add_eos_token") && cfg["add_eos_token"].is_boolean() && cfg["add_eos_token"].get<bool>();
    w.set_bool("tokenizer.ggml.add_eos_token", add_eos);

    if (cfg.contains("chat_template")) {
      const json& t = cfg["chat_template"];
      if (t.is_string()) {
        w.set_string("tokenizer.chat_template", t.get<std::string>());
      } else if (t.is_array()) {  // [{"name": "default", "template": ...}, ...]
        for (const json& e : t)
          if (e.is_object() && e.value("name", "") == "default" && e.contains("template") && e["template"].is_string())
            w.set_string("tokenizer.chat_template", e["template"].get<std::string>());
      }
    }
  } catch (const json::exception& e) {
    fail("\"", tok_path.string(), "\": ", e.what());
  }
}

}  // namespace serval
