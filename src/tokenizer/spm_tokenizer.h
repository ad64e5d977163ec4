#pragma once
// SentencePiece-style BPE (Llama 2, TinyLlama, the stories models): spaces
// become "▁", a "▁" is prepended, and the adjacent pair whose merged piece has
// the highest score is merged until none is in the vocabulary; characters
// outside the vocabulary fall back to <0xNN> byte tokens.
#include <string>
#include <unordered_map>
#include <vector>

#include "tokenizer/special_splitter.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/vocab.h"

namespace serval {

class SpmTokenizer : public Tokenizer {
 public:
  explicit SpmTokenizer(SpmVocab vocab);

  std::vector<int32_t> encode(std::string_view text, bool add_special) const override;
  std::vector<int32_t> encode_continuation(std::string_view text) const override;
  std::string token_bytes(int32_t id) const override;
  const std::string& token_piece(int32_t id) const override { return pieces_.at(id); }
  int32_t vocab_size() const override { return static_cast<int32_t>(pieces_.size()); }
  bool is_special(int32_t id) const override;
  bool strips_leading_space() const override { return add_dummy_prefix_; }
  std::optional<int32_t> token_id(std::string_view piece) const override;

 private:
  // `continuation`: no dummy prefix before the text's first fragment.
  std::vector<int32_t> encode_text(std::string_view text, bool add_special, bool continuation) const;
  void encode_fragment(std::string_view text, bool prefix, std::vector<int32_t>& out) const;
  // Id of a piece that text may merge into (normal and user-defined pieces only).
  int32_t mergeable_id(std::string_view piece) const;

  std::vector<std::string> pieces_;
  std::vector<float> scores_;
  std::vector<TokenType> types_;
  std::vector<bool> added_special_;  // added tokens flagged special (HF added_tokens)
  std::unordered_map<std::string, int32_t> ids_;        // every piece
  std::unordered_map<std::string, int32_t> mergeable_;  // normal and user-defined pieces
  int32_t byte_ids_[256];
  SpecialSplitter splitter_;
  bool add_dummy_prefix_;
  bool prefix_every_fragment_;
  bool prefix_unless_leading_space_;
  int32_t unk_id_;
};

}  // namespace serval
