#pragma once
// Pieces shared by the GGUF and tokenizer.json loaders.
#include <nlohmann/json.hpp>

#include "tokenizer/tokenizer.h"
#include "tokenizer/vocab.h"

namespace serval {

// Fills tok.eos_ids: eos_id plus the end-of-turn tokens the vocabulary has
// (<|eot_id|>, <|eom_id|>, <|end_of_text|>, <|im_end|>, <|endoftext|>), and `extra`.
void collect_eos_ids(Tokenizer& tok, const std::vector<int32_t>& extra = {});

// Reads tokenizer.json (+ tokenizer_config.json when `config_path` is not empty).
TokenizerSpec read_tokenizer_json_spec(const std::string& json_path, const std::string& config_path);
// tokenizer_config.json's "chat_template": a string, or a list of {name,
// template} whose `name` entry is used ("default" unless asked otherwise);
// empty when absent.
std::string chat_template_from_config(const nlohmann::json& cfg, const std::string& name = "default");
// The tokenizer a spec describes (with eos_ids filled).
std::unique_ptr<Tokenizer> build_tokenizer(TokenizerSpec spec);

}  // namespace serval
