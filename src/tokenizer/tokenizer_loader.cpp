// load_tokenizer(path): picks the GGUF or tokenizer.json loader.
#include <algorithm>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "model/gguf.h"
#include "tokenizer/bpe_tokenizer.h"
#include "tokenizer/loader_util.h"
#include "tokenizer/spm_tokenizer.h"
#include "tokenizer/tokenizer.h"

namespace serval {

namespace fs = std::filesystem;

void collect_eos_ids(Tokenizer& tok, const std::vector<int32_t>& extra) {
  std::vector<int32_t> ids;
  auto add = [&](int32_t id) {
    if (id >= 0 && id < tok.vocab_size() && std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
  };
  add(tok.eos_id);
  for (int32_t id : extra) add(id);
  for (const char* name : {"<|eot_id|>", "<|eom_id|>", "<|end_of_text|>", "<|im_end|>", "<|endoftext|>"}) {
    auto id = tok.token_id(name);
    if (id && tok.is_special(*id)) add(*id);
  }
  tok.eos_ids = std::move(ids);
}

std::unique_ptr<Tokenizer> build_tokenizer(TokenizerSpec spec) {
  std::unique_ptr<Tokenizer> tok;
  if (spec.spm)
    tok = std::make_unique<SpmTokenizer>(std::move(spec.spm_vocab));
  else
    tok = std::make_unique<BpeTokenizer>(std::move(spec.bpe_vocab));
  tok->bos_id = spec.bos_id;
  tok->eos_id = spec.eos_id;
  tok->add_bos = spec.add_bos && spec.bos_id >= 0;
  tok->add_eos = spec.add_eos && spec.eos_id >= 0;
  tok->chat_template = std::move(spec.chat_template);
  collect_eos_ids(*tok);
  return tok;
}

std::unique_ptr<Tokenizer> load_tokenizer_json(const std::string& json_path, const std::string& config_path) {
  return build_tokenizer(read_tokenizer_json_spec(json_path, config_path));
}

namespace {

bool starts_with_gguf_magic(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  char magic[4] = {};
  f.read(magic, 4);
  return f.gcount() == 4 && std::string_view(magic, 4) == "GGUF";
}

std::string config_beside(const fs::path& json) {
  fs::path cfg = json.parent_path() / "tokenizer_config.json";
  return fs::exists(cfg) ? cfg.string() : std::string();
}

}  // namespace

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path) {
  fs::path p(path);
  SERVAL_CHECK(fs::exists(p), "tokenizer source \"", path, "\" does not exist");
  if (fs::is_directory(p)) {
    fs::path json = p / "tokenizer.json";
    SERVAL_CHECK(fs::exists(json), "folder \"", path,
                 "\" has no tokenizer.json (Serval reads tokenizers from tokenizer.json or a .gguf file)");
    return load_tokenizer_json(json.string(), config_beside(json));
  }
  if (starts_with_gguf_magic(p)) return load_tokenizer(*GgufFile::open(path));
  if (p.extension() == ".json") return load_tokenizer_json(path, config_beside(p));
  fail("cannot load a tokenizer from \"", path,
       "\": expected a .gguf file, a tokenizer.json file, or a folder holding tokenizer.json");
}

}  // namespace serval
