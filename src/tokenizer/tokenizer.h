#pragma once
// Tokenizer: text <-> token ids. Two algorithms live behind this interface:
// SentencePiece-style BPE (scores, byte fallback <0xNN>, "▁" for spaces) and
// byte-level BPE (GPT-2 / Llama 3 / Qwen: merge ranks, regex pre-tokenizer).
// Both split added/special tokens out of the text before running BPE.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace serval {

class GgufFile;

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Encodes text. add_special adds what the model's tokenizer adds around a
  // sequence (BOS for Llama 2/3 when add_bos is set; EOS when add_eos is set).
  // Special/added tokens written in the text are always recognized, as Hugging
  // Face tokenizers do.
  virtual std::vector<int32_t> encode(std::string_view text, bool add_special) const = 0;
  // The bytes a token stands for when decoded in the middle of a text (byte
  // tokens give one raw byte, "▁" gives a space, byte-level symbols are mapped
  // back to bytes). Control tokens (BOS/EOS) give their text.
  virtual std::string token_bytes(int32_t id) const = 0;
  // The token's string as stored in the vocabulary ("▁the", "Ġthe", "<0x0A>").
  virtual const std::string& token_piece(int32_t id) const = 0;
  virtual int32_t vocab_size() const = 0;
  // True for control/special tokens (BOS, EOS, <|eot_id|> ...) that decoding
  // with skip_special leaves out.
  virtual bool is_special(int32_t id) const = 0;
  // SentencePiece decoding drops the space of the first "▁" piece of a text.
  virtual bool strips_leading_space() const { return false; }
  virtual std::optional<int32_t> token_id(std::string_view piece) const = 0;
  // Encodes text that continues a text rather than starting one: nothing
  // added around it, and no SentencePiece dummy "▁" before its first word
  // (as CodeLlama's infilling encodes a suffix). Byte-level BPE adds no such
  // prefix: encode(text, false).
  virtual std::vector<int32_t> encode_continuation(std::string_view text) const { return encode(text, false); }

  // Decodes a whole sequence; invalid UTF-8 in the result is replaced by U+FFFD
  // ids past the vocabulary (padded embedding rows) are left out, as in
  // transformers; negative ids throw.
  std::string decode(const std::vector<int32_t>& ids, bool skip_special = true) const;

  int32_t bos_id = -1;
  int32_t eos_id = -1;
  std::vector<int32_t> eos_ids;  // every id that ends generation (eos, <|eot_id|>, ...)
  bool add_bos = false;
  bool add_eos = false;
  std::string chat_template;     // kept for the server
  // Fill-in-the-middle tokens a GGUF file names (tokenizer.ggml.fim_pre/suf/
  // mid_token_id); -1 when not given (tokenizer/fim.h also looks them up by text).
  int32_t fim_pre_id = -1, fim_suf_id = -1, fim_mid_id = -1;
};

// Loads the tokenizer of a model: a .gguf file (tokenizer.ggml.* metadata), or a
// folder holding tokenizer.json (+ tokenizer_config.json), or a tokenizer.json
// file. Throws serval::Error naming what is missing or malformed.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path);
// The tokenizer described by an already opened GGUF file's tokenizer.ggml.* keys.
std::unique_ptr<Tokenizer> load_tokenizer(const GgufFile& gguf);
// From tokenizer.json (and tokenizer_config.json when `config_path` is not empty).
std::unique_ptr<Tokenizer> load_tokenizer_json(const std::string& json_path, const std::string& config_path);

// Streams text out of a growing token sequence. push() returns the newly
// completed text: bytes of a UTF-8 character split across tokens are held back
// until the character is complete, and the SentencePiece leading space of the
// first token is handled like decode() does.
class IncrementalDetokenizer {
 public:
  // `first_in_text` says whether the first pushed token starts the text (so the
  // SentencePiece leading space is stripped) or continues a prompt.
  IncrementalDetokenizer(const Tokenizer& tok, bool skip_special = true, bool first_in_text = false);
  std::string push(int32_t id);
  // Whatever is held back at the end (an incomplete character becomes U+FFFD).
  std::string flush();

 private:
  const Tokenizer& tok_;
  bool skip_special_;
  bool first_;
  std::string pending_;
};

}  // namespace serval
