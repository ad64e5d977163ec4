#pragma once
// Byte-level BPE (GPT-2, Llama 3, Qwen): added tokens are split out, the rest is
// cut by the pre-tokenizer regex, each piece is mapped byte-wise to GPT-2's
// printable characters and merged by rank.
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "tokenizer/pretokenizer_regex.h"
#include "tokenizer/special_splitter.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/vocab.h"

namespace serval {

class BpeTokenizer : public Tokenizer {
 public:
  explicit BpeTokenizer(BpeVocab vocab);

  std::vector<int32_t> encode(std::string_view text, bool add_special) const override;
  std::string token_bytes(int32_t id) const override;
  const std::string& token_piece(int32_t id) const override { return pieces_.at(id); }
  int32_t vocab_size() const override { return static_cast<int32_t>(pieces_.size()); }
  bool is_special(int32_t id) const override { return id >= 0 && id < vocab_size() && special_[id]; }
  std::optional<int32_t> token_id(std::string_view piece) const override;
  const std::string& pattern() const { return regex_.pattern(); }

 private:
  void encode_plain(std::string_view text, std::vector<int32_t>& out) const;
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;
  std::vector<int32_t> merge_word(std::string_view word) const;

  struct Merge {
    int32_t rank;
    int32_t result;
  };
  std::vector<std::string> pieces_;
  std::vector<bool> special_;
  std::vector<bool> added_;  // added tokens decode as written, not byte-mapped
  std::unordered_map<std::string, int32_t> ids_;
  std::unordered_map<uint64_t, Merge> merges_;  // (left id, right id) -> rank, merged id
  int32_t byte_ids_[256];
  PretokenizerRegex regex_;
  SpecialSplitter splitter_;
  bool ignore_merges_;
  bool nfc_;

  mutable std::mutex cache_mu_;  // encode() runs on many request threads
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

}  // namespace serval
