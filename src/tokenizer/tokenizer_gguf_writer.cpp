#include <cmath>
#include <filesystem>

#include "core/error.h"
#include "model/gguf.h"
#include "tokenizer/loader_util.h"
#include "tokenizer/pretokenizer_regex.h"
#include "tokenizer/tokenizer_gguf.h"

namespace serval {

namespace fs = std::filesystem;

namespace {

// llama.cpp's name (tokenizer.ggml.pre) for a pre-tokenizer regex.
std::string pre_name(const BpeVocab& v) {
  if (v.pattern == kLlama3Pattern) return "llama-bpe";
  if (v.pattern == kQwen2Pattern) return "qwen2";
  if (v.pattern == kGpt2Pattern) return "gpt2";
  if (v.pattern == kSmolLMPattern) return "smollm";
  fail("pre-tokenizer regex has no GGUF name (Serval knows the GPT-2, Llama 3, Qwen2 and SmolLM ones): ", v.pattern);
}

void write_spm(const SpmVocab& v, GgufWriter& w) {
  w.set_string("tokenizer.ggml.model", "llama");
  w.set_string_array("tokenizer.ggml.tokens", v.pieces);
  std::vector<float> scores(v.scores.size());
  for (size_t i = 0; i < scores.size(); ++i) scores[i] = std::isfinite(v.scores[i]) ? v.scores[i] : -1e9f;
  w.set_f32_array("tokenizer.ggml.scores", scores);
  std::vector<int32_t> types(v.types.size());
  for (size_t i = 0; i < types.size(); ++i) types[i] = static_cast<int32_t>(v.types[i]);
  w.set_i32_array("tokenizer.ggml.token_type", types);
  w.set_u32("tokenizer.ggml.unknown_token_id", static_cast<uint32_t>(v.unk_id));
  w.set_bool("tokenizer.ggml.add_space_prefix", v.add_dummy_prefix);
}

void write_bpe(const BpeVocab& v, GgufWriter& w) {
  SERVAL_CHECK(!v.nfc || v.pattern == kQwen2Pattern,
               "an NFC normalizer is only expressible in GGUF with the Qwen2 pre-tokenizer");
  w.set_string("tokenizer.ggml.model", "gpt2");
  w.set_string("tokenizer.ggml.pre", pre_name(v));
  w.set_string_array("tokenizer.ggml.tokens", v.pieces);
  std::vector<int32_t> types(v.pieces.size(), static_cast<int32_t>(TokenType::Normal));
  for (const auto& a : v.added)
    types[a.id] = static_cast<int32_t>(a.special ? TokenType::Control : TokenType::UserDefined);
  w.set_i32_array("tokenizer.ggml.token_type", types);
  std::vector<std::string> merges;
  merges.reserve(v.merges.size());
  for (const auto& [a, b] : v.merges) merges.push_back(a + " " + b);
  w.set_string_array("tokenizer.ggml.merges", merges);
}

}  // namespace

void add_tokenizer_metadata(const std::string& source, GgufWriter& w) {
  fs::path p(source);
  fs::path json = fs::is_directory(p) ? p / "tokenizer.json" : p;
  SERVAL_CHECK(fs::exists(json), "no tokenizer.json at \"", source, "\"");
  fs::path cfg = json.parent_path() / "tokenizer_config.json";
  TokenizerSpec spec = read_tokenizer_json_spec(json.string(), fs::exists(cfg) ? cfg.string() : std::string());
  if (spec.spm)
    write_spm(spec.spm_vocab, w);
  else
    write_bpe(spec.bpe_vocab, w);
  if (spec.bos_id >= 0) w.set_u32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(spec.bos_id));
  if (spec.eos_id >= 0) w.set_u32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(spec.eos_id));
  w.set_bool("tokenizer.ggml.add_bos_token", spec.add_bos && spec.bos_id >= 0);
  w.set_bool("tokenizer.ggml.add_eos_token", spec.add_eos && spec.eos_id >= 0);
  if (!spec.chat_template.empty()) w.set_string("tokenizer.chat_template", spec.chat_template);
}

}  // namespace serval
