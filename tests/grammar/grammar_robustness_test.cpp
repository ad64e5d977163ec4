// Mangled grammars, patterns and schemas (requests carry them, so they are
// untrusted input): each must compile or throw serval::Error, and whatever
// compiles must give masks equal to brute force along a few random steps.
#include <gtest/gtest.h>

#include <random>

#include "core/error.h"
#include "grammar/ebnf_parser.h"
#include "grammar/json_schema_grammar.h"
#include "grammar/regex_to_grammar.h"
#include "grammar/token_mask.h"

namespace serval::grammar {
namespace {

const char* kSeeds[3][3] = {
    {R"(root ::= "{" ws (pair ("," ws pair)*)? "}"
        pair ::= [a-z]+ ws ":" ws ([0-9]{1,3} | "\"" [^"]* "\"")
        ws ::= " "?)",
     R"g(root ::= (a | b)+ c?
        a ::= "x" [^\n]{2,4} | "é"
        b ::= "(" root ")"
        c ::= .)g",
     R"(root ::= [\x20-\x7E]{0,5} ("\u00e9" | "\U0001F600")* "end")"},
    {R"(^(\d{3})-[a-z]+(?:\.[A-Z]{2,3})?$)", R"([^"\\]{1,8}|(ab)*c+?\w\s\D)", R"(x{2,}y?(z|w){0,3}[α-ω])"},
    {R"({"type":"object","properties":{"a":{"type":"integer","minimum":-5,"maximum":300},"b":{"type":"string","maxLength":4},
        "c":{"type":"array","items":{"enum":["x",1,null]},"maxItems":3}},"required":["a"]})",
     R"({"$defs":{"n":{"type":"object","properties":{"v":{"type":"number","exclusiveMinimum":0,"maximum":2.5},
        "k":{"anyOf":[{"$ref":"#/$defs/n"},{"type":"null"}]}},"required":["v","k"],"additionalProperties":false}},"$ref":"#/$defs/n"})",
     R"({"type":"array","prefixItems":[{"type":"string","format":"date"},{"type":"string","pattern":"^[a-c]+$"}],"items":{"type":"boolean"}})"},
};

std::string mutate(std::string s, std::mt19937& rng) {
  const std::string alphabet = "\"\\[]()|*+?{},:-^$.#\n azAZ09\xC3\xA9\xF0\x9F";
  int edits = 1 + int(rng() % 4);
  for (int e = 0; e < edits && !s.empty(); ++e) {
    size_t at = rng() % s.size();
    switch (rng() % 4) {
      case 0: s.erase(at, 1 + rng() % 3); break;
      case 1: s.insert(at, 1, alphabet[rng() % alphabet.size()]); break;
      case 2: s[at] = alphabet[rng() % alphabet.size()]; break;
      default: s.insert(at, s.substr(rng() % s.size(), 1 + rng() % 6)); break;
    }
  }
  return s;
}

std::shared_ptr<const TokenVocabulary> vocab() {
  std::vector<std::string> t = {"</s>", "{", "}", "\"", "a", "ab", "x", "é", "\xC3", "\xA9", " ", ":", ",", "1", "12",
                                "-", ".", "[", "]", "(", ")", "null", "true", "end", "\\", "z", "2024-", "01", "\n"};
  return std::make_shared<const TokenVocabulary>(std::move(t), std::vector<int32_t>{}, std::vector<int32_t>{0});
}

TEST(GrammarRobustness, MangledInputsCompileOrThrowErrorAndMasksStayExact) {
  std::mt19937 rng(1234);
  auto v = vocab();
  int compiled = 0;
  for (int iter = 0; iter < 4000; ++iter) {
    int kind = iter % 3;
    std::string text = mutate(kSeeds[kind][rng() % 3], rng);
    std::shared_ptr<const CompiledGrammar> g;
    try {
      Grammar gr = kind == 0 ? parse_gbnf(text) : kind == 1 ? regex_to_grammar(text) : json_schema_text_to_grammar(text);
      g = CompiledGrammar::compile(gr);
    } catch (const Error&) {
      continue;
    }
    ++compiled;
    TokenMasker masker(g, v);
    GrammarMatcher m(g);
    std::vector<uint32_t> fast(v->mask_words()), slow(v->mask_words());
    for (int step = 0; step < 6; ++step) {
      masker.fill_mask(m, fast);
      fill_mask_reference(m, *v, slow);
      ASSERT_EQ(fast, slow) << text;
      std::vector<int32_t> allowed;
      for (int32_t id = 1; id < v->size(); ++id)
        if (mask_allows(fast, id)) allowed.push_back(id);
      if (allowed.empty()) break;
      ASSERT_TRUE(masker.accept_token(m, allowed[rng() % allowed.size()]));
      ASSERT_FALSE(m.is_dead());
    }
  }
  EXPECT_GT(compiled, 100);
}

}  // namespace
}  // namespace serval::grammar
