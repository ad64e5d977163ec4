// libFuzzer harness: structured-output constraints, which requests carry
// (guided_grammar, guided_regex, a response_format JSON schema). The first
// byte picks the front end, the rest is its text; what compiles is then run:
// masks over a small vocabulary along a walk of the allowed tokens. Every
// input must compile or throw serval::Error; a crash, sanitizer report, hang
// or memory blow-up is a bug.
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.h"
#include "grammar/ebnf_parser.h"
#include "grammar/json_schema_grammar.h"
#include "grammar/regex_to_grammar.h"
#include "grammar/token_mask.h"

namespace {

using namespace serval::grammar;

const std::shared_ptr<const TokenVocabulary>& vocab() {
  static const auto v = std::make_shared<const TokenVocabulary>(
      std::vector<std::string>{"</s>", "{", "}", "\"", "a", "ab", "x", "\xC3\xA9", "\xC3", "\xA9", " ", ":", ",", "1", "12",
                               "-", ".", "[", "]", "(", ")", "null", "true", "\\", "z", "2024-", "01", "\n", "\xF0\x9F"},
      std::vector<int32_t>{}, std::vector<int32_t>{0});
  return v;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  try {
    Grammar g = data[0] % 3 == 0 ? parse_gbnf(text) : data[0] % 3 == 1 ? regex_to_grammar(text)
                                                                        : json_schema_text_to_grammar(text);
    auto compiled = CompiledGrammar::compile(g);
    TokenMasker masker(compiled, vocab());
    GrammarMatcher m(compiled);
    std::vector<uint32_t> mask(vocab()->mask_words());
    for (int step = 0; step < 16; ++step) {
      masker.fill_mask(m, mask);
      int32_t n = vocab()->size(), pick = -1;
      for (int32_t k = 0; k < n - 1 && pick < 0; ++k) {
        int32_t id = 1 + (k + step * 7) % (n - 1);  // a different token first at each step
        if (mask_allows(mask, id)) pick = id;
      }
      if (pick < 0 || !masker.accept_token(m, pick)) break;
    }
  } catch (const serval::Error&) {
  }
  return 0;
}
