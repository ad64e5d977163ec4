// The tokenizer stored in GGUF metadata (tokenizer.ggml.*), as llama.cpp writes it.
#include "core/error.h"
#include "model/gguf.h"
#include "tokenizer/bpe_tokenizer.h"
#include "tokenizer/loader_util.h"
#include "tokenizer/pretokenizer_regex.h"
#include "tokenizer/spm_tokenizer.h"

namespace serval {

namespace {

std::vector<TokenType> read_types(const GgufFile& g, size_t n) {
  std::vector<TokenType> types(n, TokenType::Normal);
  if (!g.has("tokenizer.ggml.token_type")) return types;
  std::vector<int64_t> raw = g.get_int_array("tokenizer.ggml.token_type");
  SERVAL_CHECK(raw.size() == n, g.path(), ": tokenizer.ggml.token_type has ", raw.size(), " entries but there are ",
               n, " tokens");
  for (size_t i = 0; i < n; ++i) {
    SERVAL_CHECK(raw[i] >= 0 && raw[i] <= 6, g.path(), ": token ", i, " has unknown token type ", raw[i]);
    types[i] = static_cast<TokenType>(raw[i]);
  }
  return types;
}

// Tokens written literally in text that must not go through BPE.
std::vector<AddedToken> added_from_types(const std::vector<std::string>& pieces, const std::vector<TokenType>& types,
                                         bool include_unknown) {
  std::vector<AddedToken> added;
  for (size_t i = 0; i < pieces.size(); ++i) {
    TokenType t = types[i];
    if (t == TokenType::Control || t == TokenType::UserDefined || (include_unknown && t == TokenType::Unknown))
      added.push_back({pieces[i], static_cast<int32_t>(i), t != TokenType::UserDefined, false, false});
  }
  return added;
}

std::string pattern_for_pre(const std::string& pre) {
  if (pre == "llama-bpe" || pre == "llama3" || pre == "llama-v3" || pre == "smaug-bpe") return kLlama3Pattern;
  if (pre == "qwen2" || pre == "qwen35") return kQwen2Pattern;
  // llama.cpp's group that splits every digit off before the GPT-2 regex.
  for (const char* name : {"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva"})
    if (pre == name) return kSmolLMPattern;
  return kGpt2Pattern;
}

}  // namespace

std::unique_ptr<Tokenizer> load_tokenizer(const GgufFile& g) {
  SERVAL_CHECK(g.has("tokenizer.ggml.model"), g.path(), ": no tokenizer.ggml.model key (the file has no tokenizer)");
  std::string model = g.get_string("tokenizer.ggml.model");
  const std::vector<std::string>& pieces = g.get_string_array("tokenizer.ggml.tokens");
  SERVAL_CHECK(!pieces.empty(), g.path(), ": tokenizer.ggml.tokens is empty");
  std::vector<TokenType> types = read_types(g, pieces.size());
  std::unique_ptr<Tokenizer> tok;
  if (model == "llama") {
    SpmVocab v;
    v.pieces = pieces;
    if (g.has("tokenizer.ggml.scores")) {
      std::vector<double> s = g.get_float_array("tokenizer.ggml.scores");
      SERVAL_CHECK(s.size() == pieces.size(), g.path(), ": tokenizer.ggml.scores has ", s.size(),
                   " entries but there are ", pieces.size(), " tokens");
      v.scores.assign(s.begin(), s.end());
    }
    v.types = types;
    v.added = added_from_types(pieces, types, /*include_unknown=*/true);
    v.add_dummy_prefix = g.get_bool("tokenizer.ggml.add_space_prefix", true);
    v.prefix_every_fragment = true;  // llama.cpp and HF's Llama 2 tokenizer
    v.unk_id = static_cast<int32_t>(g.get_int("tokenizer.ggml.unknown_token_id", 0));
    tok = std::make_unique<SpmTokenizer>(std::move(v));
    tok->add_bos = g.get_bool("tokenizer.ggml.add_bos_token", true);
  } else if (model == "gpt2") {
    BpeVocab v;
    v.pieces = pieces;
    for (const std::string& m : g.get_string_array("tokenizer.ggml.merges")) {
      size_t sp = m.find(' ', 1);
      SERVAL_CHECK(sp != std::string::npos, g.path(), ": malformed merge \"", m, "\" in tokenizer.ggml.merges");
      v.merges.emplace_back(m.substr(0, sp), m.substr(sp + 1));
    }
    v.added = added_from_types(pieces, types, /*include_unknown=*/false);
    std::string pre = g.get_string("tokenizer.ggml.pre", "default");
    v.pattern = pattern_for_pre(pre);
    v.nfc = pre == "qwen2";
    v.ignore_merges = pre == "llama-bpe" || pre == "llama3" || pre == "llama-v3";
    tok = std::make_unique<BpeTokenizer>(std::move(v));
    tok->add_bos = g.get_bool("tokenizer.ggml.add_bos_token", false);
  } else {
    fail(g.path(), ": tokenizer model \"", model, "\" is not supported (supported: llama, gpt2)");
  }
  auto id_key = [&](const char* key) -> int32_t {
    int64_t id = g.get_int(key, -1);
    SERVAL_CHECK(id < tok->vocab_size(), g.path(), ": ", key, " = ", id, " is outside the vocabulary (size ",
                 tok->vocab_size(), ")");
    return static_cast<int32_t>(id);
  };
  tok->bos_id = id_key("tokenizer.ggml.bos_token_id");
  tok->eos_id = id_key("tokenizer.ggml.eos_token_id");
  if (tok->bos_id < 0) tok->add_bos = false;
  tok->add_eos = g.get_bool("tokenizer.ggml.add_eos_token", false) && tok->eos_id >= 0;
  tok->chat_template = g.get_string("tokenizer.chat_template", "");
  tok->fim_pre_id = id_key("tokenizer.ggml.fim_pre_token_id");
  tok->fim_suf_id = id_key("tokenizer.ggml.fim_suf_token_id");
  tok->fim_mid_id = id_key("tokenizer.ggml.fim_mid_token_id");
  std::vector<int32_t> extra;
  for (const char* key : {"tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"})
    if (int32_t id = id_key(key); id >= 0) extra.push_back(id);
  collect_eos_ids(*tok, extra);
  return tok;
}

}  // namespace serval
