// Hugging Face tokenizer.json (+ tokenizer_config.json). model.type BPE with
// byte_fallback is SentencePiece-style (Llama 2); BPE without it is byte-level
// (Llama 3, Qwen).
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "core/error.h"
#include "tokenizer/loader_util.h"
#include "tokenizer/pretokenizer_regex.h"
#include "tokenizer/utf8.h"

namespace serval {

using json = nlohmann::json;

namespace {

json read_json(const std::string& path) {
  std::ifstream f(path);
  SERVAL_CHECK(f, "cannot open \"", path, "\"");
  try {
    return json::parse(f);
  } catch (const json::exception& e) {
    fail("\"", path, "\" is not valid JSON: ", e.what());
  }
}

// Every object of `node` (a pre-tokenizer or normalizer, or a Sequence of them).
std::vector<const json*> flatten(const json& node, const char* list_key) {
  std::vector<const json*> out;
  if (!node.is_object()) return out;
  if (node.value("type", "") == "Sequence" && node.contains(list_key)) {
    for (const auto& n : node[list_key]) {
      auto sub = flatten(n, list_key);
      out.insert(out.end(), sub.begin(), sub.end());
    }
  } else {
    out.push_back(&node);
  }
  return out;
}

// tokenizer_config.json writes special tokens as a string or {"content": ...}.
std::string token_text(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return {};
}

std::pair<std::string, std::string> parse_merge(const json& m, const std::string& path) {
  if (m.is_array() && m.size() == 2) return {m[0].get<std::string>(), m[1].get<std::string>()};
  if (m.is_string()) {
    const std::string& s = m.get_ref<const std::string&>();
    size_t sp = s.find(' ', 1);
    if (sp != std::string::npos) return {s.substr(0, sp), s.substr(sp + 1)};
  }
  fail("\"", path, "\": malformed merge ", m.dump());
}

struct JsonVocab {
  std::vector<std::string> pieces;
  std::vector<AddedToken> added;
  std::vector<std::pair<std::string, std::string>> merges;
};

// A vocabulary id: an integer of 0 .. 2^24 - 1 (a float such as 2e97 would
// not convert to an integer at all).
int32_t token_id(const json& id, const std::string& path, const std::string& piece) {
  SERVAL_CHECK(id.is_number_integer(), "\"", path, "\": the id of \"", piece, "\" is not an integer: ", id.dump());
  SERVAL_CHECK(id.is_number_unsigned() && id.get<uint64_t>() < (uint64_t{1} << 24), "\"", path, "\": the id of \"",
               piece, "\" is out of range (0 to 2^24 - 1): ", id.dump());
  return static_cast<int32_t>(id.get<uint64_t>());
}

JsonVocab read_vocab(const json& tj, const std::string& path) {
  const json& model = tj["model"];
  SERVAL_CHECK(model.contains("vocab") && model["vocab"].is_object(), "\"", path, "\": model.vocab is missing");
  JsonVocab v;
  auto place = [&](int32_t id, const std::string& piece) {
    if (size_t(id) >= v.pieces.size()) v.pieces.resize(size_t(id) + 1);
    v.pieces[size_t(id)] = piece;
  };
  for (const auto& [piece, id] : model["vocab"].items()) place(token_id(id, path, piece), piece);
  if (tj.contains("added_tokens")) {
    for (const auto& t : tj["added_tokens"]) {
      AddedToken a;
      a.content = t.at("content").get<std::string>();
      a.id = token_id(t.at("id"), path, a.content);
      a.special = t.value("special", false);
      a.lstrip = t.value("lstrip", false);
      a.rstrip = t.value("rstrip", false);
      place(a.id, a.content);
      v.added.push_back(std::move(a));
    }
  }
  SERVAL_CHECK(!v.pieces.empty(), "\"", path, "\": the vocabulary is empty");
  if (model.contains("merges"))
    for (const auto& m : model["merges"]) v.merges.push_back(parse_merge(m, path));
  return v;
}

// Which special tokens encode(add_special) puts around a text, as transformers
// decides: a TemplateProcessing post-processor in tokenizer.json says it
// outright; Llama tokenizer classes rebuild that template from add_bos_token
// (default true) and add_eos_token; any other class adds nothing.
void set_special_tokens_added(const json& tj, const json& cfg, const std::unordered_map<std::string, int32_t>& ids,
                              TokenizerSpec& spec) {
  const json* tmpl = nullptr;
  if (tj.contains("post_processor") && tj["post_processor"].is_object()) {
    const json& pp = tj["post_processor"];
    if (pp.value("type", "") == "TemplateProcessing") tmpl = &pp;
    if (pp.value("type", "") == "Sequence" && pp.contains("processors") && pp["processors"].is_array())
      for (const json& p : pp["processors"])
        if (p.is_object() && p.value("type", "") == "TemplateProcessing") tmpl = &p;
  }
  const std::string cls = cfg.is_object() ? cfg.value("tokenizer_class", "") : "";
  auto flag = [&](const char* key, bool dflt) {
    return cfg.contains(key) && cfg[key].is_boolean() ? cfg[key].get<bool>() : dflt;
  };
  if (cls.find("Llama") != std::string::npos) {
    spec.add_bos = flag("add_bos_token", true) && spec.bos_id >= 0;
    spec.add_eos = flag("add_eos_token", false) && spec.eos_id >= 0;
    return;
  }
  spec.add_bos = spec.add_eos = false;
  if (!tmpl || !tmpl->contains("single") || !(*tmpl)["single"].is_array()) return;
  bool before_text = true;
  for (const json& item : (*tmpl)["single"]) {
    if (item.contains("Sequence")) {
      before_text = false;
      continue;
    }
    if (!item.contains("SpecialToken")) continue;
    auto it = ids.find(item["SpecialToken"].value("id", ""));
    if (it == ids.end()) continue;
    if (before_text) {
      spec.add_bos = true;
      if (spec.bos_id < 0) spec.bos_id = it->second;
    } else {
      spec.add_eos = true;
      if (spec.eos_id < 0) spec.eos_id = it->second;
    }
  }
}

SpmVocab make_spm(const json& tj, JsonVocab v) {
  SpmVocab s;
  const size_t n = v.pieces.size();
  // HF lists a merge for every pair whose concatenation is a piece, ordered by
  // the piece's SentencePiece score; the rank of a piece's first merge orders
  // pieces the same way. Pieces no merge produces are not reachable by merging.
  std::unordered_map<std::string, int32_t> ids;
  for (size_t i = 0; i < n; ++i) ids.emplace(v.pieces[i], static_cast<int32_t>(i));
  s.scores.assign(n, -std::numeric_limits<float>::infinity());
  std::vector<bool> produced(n, false);
  for (size_t r = 0; r < v.merges.size(); ++r) {
    auto it = ids.find(v.merges[r].first + v.merges[r].second);
    if (it != ids.end() && !produced[it->second]) {
      produced[it->second] = true;
      s.scores[it->second] = -static_cast<float>(r);
    }
  }
  s.types.assign(n, TokenType::Normal);
  for (size_t i = 0; i < n; ++i) {
    const std::string& p = v.pieces[i];
    bool single_char = !p.empty() && utf8::char_len(static_cast<unsigned char>(p[0])) >= p.size();
    if (p.size() == 6 && p.rfind("<0x", 0) == 0 && p.back() == '>')
      s.types[i] = TokenType::Byte;
    else if (!produced[i] && !single_char)
      s.types[i] = TokenType::Unused;
  }
  for (const auto& a : v.added) s.types[a.id] = a.special ? TokenType::Control : TokenType::UserDefined;
  const json& model = tj["model"];
  if (model.contains("unk_token") && model["unk_token"].is_string()) {
    auto it = ids.find(model["unk_token"].get<std::string>());
    if (it != ids.end()) {
      s.unk_id = it->second;
      s.types[it->second] = TokenType::Unknown;
    }
  }
  // Where the "▁" prefix comes from: a Prepend normalizer (legacy Llama 2: every
  // fragment between added tokens) or a Metaspace pre-tokenizer (prepend_scheme).
  s.add_dummy_prefix = false;
  s.prefix_every_fragment = true;
  const json normalizer = tj.value("normalizer", json()), pre_tokenizer = tj.value("pre_tokenizer", json());
  for (const json* nrm : flatten(normalizer, "normalizers"))
    if (nrm->value("type", "") == "Prepend") s.add_dummy_prefix = true;
  for (const json* pre : flatten(pre_tokenizer, "pretokenizers")) {
    if (pre->value("type", "") != "Metaspace") continue;
    std::string scheme = pre->value("prepend_scheme", pre->value("add_prefix_space", true) ? "always" : "never");
    s.add_dummy_prefix = scheme != "never";
    s.prefix_every_fragment = scheme == "always";
    s.prefix_unless_leading_space = true;
  }
  s.pieces = std::move(v.pieces);
  s.added = std::move(v.added);
  return s;
}

BpeVocab make_byte_level(const json& tj, JsonVocab v, const std::string& path) {
  BpeVocab b;
  b.pieces = std::move(v.pieces);
  b.merges = std::move(v.merges);
  b.added = std::move(v.added);
  b.ignore_merges = tj["model"].value("ignore_merges", false);
  b.pattern = kGpt2Pattern;
  const json normalizer = tj.value("normalizer", json()), pre_tokenizer = tj.value("pre_tokenizer", json());
  bool split = false, digits = false, byte_level_regex = false;
  for (const json* pre : flatten(pre_tokenizer, "pretokenizers")) {
    std::string type = pre->value("type", "");
    if (type == "Split" && pre->contains("pattern")) {
      const json& pat = (*pre)["pattern"];
      SERVAL_CHECK(pat.contains("Regex"), "\"", path, "\": Split pre-tokenizer without a Regex pattern");
      b.pattern = pat["Regex"].get<std::string>();
      split = true;
    } else if (type == "Digits") {
      // SmolLM's and StarCoder's Sequence[Digits(individual_digits), ByteLevel(use_regex)]
      // is one regex (kSmolLMPattern); other uses of Digits are not.
      SERVAL_CHECK(pre->value("individual_digits", false) && !digits && !byte_level_regex, "\"", path,
                   "\": a Digits pre-tokenizer is only supported with individual_digits, once, before ByteLevel");
      digits = true;
    } else if (type == "ByteLevel" && pre->value("use_regex", true)) {
      byte_level_regex = true;
    }
  }
  if (digits) {
    SERVAL_CHECK(!split && byte_level_regex, "\"", path,
                 "\": a Digits pre-tokenizer is only supported followed by ByteLevel with use_regex, without Split");
    b.pattern = kSmolLMPattern;
  }
  for (const json* nrm : flatten(normalizer, "normalizers")) {
    std::string type = nrm->value("type", "");
    if (type == "NFC")
      b.nfc = true;
    else
      fail("\"", path, "\": normalizer \"", type, "\" is not supported for byte-level BPE (supported: NFC)");
  }
  return b;
}

TokenizerSpec read_spec(const std::string& json_path, const std::string& config_path) {
  json tj = read_json(json_path);
  SERVAL_CHECK(tj.contains("model") && tj["model"].is_object(), "\"", json_path, "\" has no \"model\" object");
  std::string type = tj["model"].value("type", "BPE");
  SERVAL_CHECK(type == "BPE", "\"", json_path, "\": tokenizer model type \"", type,
               "\" is not supported (supported: BPE)");
  TokenizerSpec spec;
  spec.spm = tj["model"].value("byte_fallback", false);
  JsonVocab v = read_vocab(tj, json_path);
  std::unordered_map<std::string, int32_t> ids;
  for (size_t i = 0; i < v.pieces.size(); ++i) ids.emplace(v.pieces[i], static_cast<int32_t>(i));
  if (spec.spm)
    spec.spm_vocab = make_spm(tj, std::move(v));
  else
    spec.bpe_vocab = make_byte_level(tj, std::move(v), json_path);

  json cfg = config_path.empty() ? json::object() : read_json(config_path);
  auto lookup = [&](const char* key) -> int32_t {
    if (!cfg.contains(key)) return -1;
    std::string text = token_text(cfg[key]);
    if (text.empty()) return -1;
    auto it = ids.find(text);
    SERVAL_CHECK(it != ids.end(), "\"", config_path, "\": ", key, " \"", text, "\" is not in the vocabulary");
    return it->second;
  };
  spec.bos_id = lookup("bos_token");
  spec.eos_id = lookup("eos_token");
  if (config_path.empty()) {  // no config: the usual names
    for (const char* name : {"<s>", "<|begin_of_text|>"})
      if (auto it = ids.find(name); it != ids.end() && spec.bos_id < 0) spec.bos_id = it->second;
    for (const char* name : {"</s>", "<|end_of_text|>", "<|endoftext|>", "<eos>"})
      if (auto it = ids.find(name); it != ids.end() && spec.eos_id < 0) spec.eos_id = it->second;
  }
  set_special_tokens_added(tj, cfg, ids, spec);
  spec.chat_template = chat_template_from_config(cfg);
  return spec;
}

}  // namespace

TokenizerSpec read_tokenizer_json_spec(const std::string& json_path, const std::string& config_path) {
  try {
    return read_spec(json_path, config_path);
  } catch (const json::exception& e) {
    // Valid JSON with a field of another type than the loader reads.
    fail("\"", json_path, "\"", config_path.empty() ? "" : " or \"" + config_path + "\"",
         ": a field has the wrong JSON type: ", e.what());
  }
}

std::string chat_template_from_config(const json& cfg, const std::string& name) {
  if (!cfg.is_object() || !cfg.contains("chat_template")) return "";
  const json& ct = cfg["chat_template"];
  if (ct.is_string()) return name == "default" ? ct.get<std::string>() : "";
  if (ct.is_array())  // [{"name": "default", "template": ...}, ...]
    for (const auto& t : ct)
      if (t.is_object() && t.value("name", "") == name && t.contains("template") && t["template"].is_string())
        return t["template"].get<std::string>();
  return "";
}

}  // namespace serval
