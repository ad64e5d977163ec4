#pragma once
// What the loaders hand to the tokenizers: the vocabulary and the options read
// from GGUF metadata or tokenizer.json.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace serval {

// SentencePiece / GGUF token types (tokenizer.ggml.token_type).
enum class TokenType : int32_t { Undefined = 0, Normal = 1, Unknown = 2, Control = 3, UserDefined = 4, Unused = 5, Byte = 6 };

// A token matched literally in the text before BPE (HF added_tokens; GGUF
// control and user-defined tokens).
struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool special = true;  // left out by decode(skip_special)
  bool lstrip = false, rstrip = false;
};

struct SpmVocab {
  std::vector<std::string> pieces;  // by id
  std::vector<float> scores;        // by id
  std::vector<TokenType> types;     // by id
  std::vector<AddedToken> added;    // split out of the text before BPE
  bool add_dummy_prefix = true;     // prepend "▁" to the text
  // true: every text fragment between added tokens gets the "▁" prefix (HF
  // Llama 2 "legacy" normalizer, llama.cpp); false: only the one that starts the text
  // (HF Metaspace prepend_scheme "first").
  bool prefix_every_fragment = true;
  // HF Metaspace adds no "▁" to a fragment that already starts with a space.
  bool prefix_unless_leading_space = false;
  int32_t unk_id = 0;
};

struct BpeVocab {
  std::vector<std::string> pieces;  // by id, byte-level strings ("Ġthe"); added tokens as written
  std::vector<std::pair<std::string, std::string>> merges;  // in rank order
  std::vector<AddedToken> added;
  std::string pattern;         // pre-tokenizer regex
  bool ignore_merges = false;  // a pre-token that is itself in the vocab is emitted whole
  bool nfc = false;            // NFC-normalize text before pre-tokenizing (Qwen)
};

// Everything a tokenizer is made of, as read from tokenizer.json (+ config);
// turned into a Tokenizer by build_tokenizer() or written to GGUF metadata.
struct TokenizerSpec {
  bool spm = false;  // SentencePiece-style (spm_vocab) or byte-level (bpe_vocab)
  SpmVocab spm_vocab;
  BpeVocab bpe_vocab;
  int32_t bos_id = -1, eos_id = -1;
  bool add_bos = false, add_eos = false;
  std::string chat_template;
};

}  // namespace serval
