#include "tokenizer/fim.h"

namespace serval {
namespace {

struct FimStyle {
  const char *prefix, *suffix, *middle;
};

constexpr FimStyle kStyles[] = {
    {"<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"},
    {"<fim_prefix>", "<fim_suffix>", "<fim_middle>"},
    {"\xe2\x96\x81<PRE>", "\xe2\x96\x81<SUF>", "\xe2\x96\x81<MID>"},  // "▁<PRE>" ...
    {"<PRE>", "<SUF>", "<MID>"},
    {"<\xef\xbd\x9c" "fim\xe2\x96\x81" "begin\xef\xbd\x9c>", "<\xef\xbd\x9c" "fim\xe2\x96\x81" "hole\xef\xbd\x9c>",
     "<\xef\xbd\x9c" "fim\xe2\x96\x81" "end\xef\xbd\x9c>"},  // "<｜fim▁begin｜>" ...
};

bool in_vocab(const Tokenizer& tok, int32_t id) { return id >= 0 && id < tok.vocab_size(); }

std::vector<int32_t> assemble(const Tokenizer& tok, const FimTokens& fim, std::vector<int32_t> head,
                              const std::vector<int32_t>& prefix_ids, std::string_view suffix) {
  std::vector<int32_t> ids = std::move(head);
  ids.push_back(fim.prefix);
  ids.insert(ids.end(), prefix_ids.begin(), prefix_ids.end());
  ids.push_back(fim.suffix);
  const std::vector<int32_t> suffix_ids = tok.encode_continuation(suffix);
  ids.insert(ids.end(), suffix_ids.begin(), suffix_ids.end());
  ids.push_back(fim.middle);
  return ids;
}

}  // namespace

std::optional<FimTokens> find_fim_tokens(const Tokenizer& tok) {
  if (in_vocab(tok, tok.fim_pre_id) && in_vocab(tok, tok.fim_suf_id) && in_vocab(tok, tok.fim_mid_id))
    return FimTokens{tok.fim_pre_id, tok.fim_suf_id, tok.fim_mid_id};
  for (const FimStyle& s : kStyles) {
    const auto p = tok.token_id(s.prefix), x = tok.token_id(s.suffix), m = tok.token_id(s.middle);
    if (p && x && m) return FimTokens{*p, *x, *m};
  }
  return std::nullopt;
}

std::vector<int32_t> fim_prompt(const Tokenizer& tok, const FimTokens& fim, std::string_view prefix,
                                std::string_view suffix, bool add_special) {
  std::vector<int32_t> head;
  if (add_special && tok.add_bos && tok.bos_id >= 0) head.push_back(tok.bos_id);
  return assemble(tok, fim, std::move(head), tok.encode(prefix, /*add_special=*/false), suffix);
}

std::vector<int32_t> fim_prompt(const Tokenizer& tok, const FimTokens& fim, const std::vector<int32_t>& prefix_ids,
                                std::string_view suffix) {
  std::vector<int32_t> head, rest = prefix_ids;
  if (!rest.empty() && tok.bos_id >= 0 && rest.front() == tok.bos_id) {
    head.push_back(rest.front());
    rest.erase(rest.begin());
  }
  return assemble(tok, fim, std::move(head), rest, suffix);
}

}  // namespace serval
