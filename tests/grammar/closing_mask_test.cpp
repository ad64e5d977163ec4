// Budget masks (grammar/closing_mask.h): random walks through JSON grammars
// over a small vocabulary with a token budget end valid whenever the shortest
// valid text fits; the shortest completion is one; the closing mask allows
// only its prefixes (and EOS where the text may end).
#include "grammar/closing_mask.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "grammar/json_schema_grammar.h"
#include "grammar_test_util.h"

namespace serval::grammar {
namespace {

std::shared_ptr<const TokenVocabulary> vocab() {
  std::vector<std::string> t = {"<s>", "</s>", "{", "}", "\"", "\",", "\"}", "\":", "a", "ab", "abc", " ", " \"",
                                "1", "12", "0", "-", ".", "[", "]", "true", "false", "null", ",", ", ", ":",
                                "\"a\": 1, \"b\": [", "{\"", "\"name\"", "x", "xyz", "]}", "\"\"", "9"};
  // Every printable ASCII character alone too, as real vocabularies have
  // (else a walk can reach a text no token continues).
  for (char c = ' '; c <= '~'; ++c)
    if (std::find(t.begin(), t.end(), std::string(1, c)) == t.end()) t.emplace_back(1, c);
  return std::make_shared<const TokenVocabulary>(std::move(t), std::vector<int32_t>{0}, std::vector<int32_t>{1});
}

TEST(ClosingMask, ShortestCompletionCompletes) {
  const auto g = CompiledGrammar::compile(json_schema_text_to_grammar(
      R"({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "array", "items": {"type": "string"}, "minItems": 2}}, "required": ["a", "b"]})"));
  GrammarMatcher m(g);
  ASSERT_TRUE(m.accept_bytes("{\"a\": 12"));
  const size_t need = m.min_bytes_to_end();
  const std::string s = shortest_completion(m);
  EXPECT_EQ(s.size(), need);
  EXPECT_TRUE(testing::matches(g, "{\"a\": 12" + s)) << s;
  EXPECT_EQ(m.num_steps(), 1u);  // left as it was
}

TEST(ClosingMask, BudgetedWalksEndValid) {
  const auto v = vocab();
  const char* schemas[] = {
      R"({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "array", "items": {"type": "string"}}}, "required": ["a", "b"]})",
      R"({"type": "array", "items": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}, "minItems": 1})",
      R"({"type": "string", "pattern": "^(abc|xyz)( (abc|xyz))*$"})",
  };
  std::mt19937 rng(11);
  int ended = 0, walks = 0;
  for (const char* schema : schemas) {
    const auto g = CompiledGrammar::compile(json_schema_text_to_grammar(schema));
    TokenMasker masker(g, v);
    for (int budget : {8, 12, 20, 40}) {
      for (int walk = 0; walk < 40; ++walk, ++walks) {
        GrammarMatcher m(g);
        std::string text;
        bool done = false;
        std::vector<uint32_t> mask(v->mask_words());
        for (int used = 0; used < budget && !done; ++used) {
          fill_budget_mask(masker, m, budget - used, mask);
          std::vector<int32_t> allowed;
          for (int32_t id = 0; id < v->size(); ++id)
            if (mask_allows(mask, id)) allowed.push_back(id);
          ASSERT_FALSE(allowed.empty()) << schema << " after " << text;
          const int32_t id = allowed[rng() % allowed.size()];
          if (v->is_eos(id)) {
            done = true;
            break;
          }
          ASSERT_TRUE(masker.accept_token(m, id));
          text += v->bytes(id);
        }
        // A walk ends at EOS within its budget whenever the shortest text fits it.
        GrammarMatcher fresh(g);
        if (int(fresh.min_bytes_to_end()) + 1 <= budget) {
          EXPECT_TRUE(done) << schema << " budget " << budget << ": " << text;
          EXPECT_TRUE(testing::matches(g, text)) << text;
        }
        ended += done;
      }
    }
  }
  EXPECT_GT(ended, walks / 2);
}

TEST(ClosingMask, AllowsOnlyPrefixesOfTheShortestCompletion) {
  const auto v = vocab();
  const auto g = testing::compile_gbnf(R"(root ::= "{" ("\"a\"" | "\"name\"") ": " ("1" | "12") "}")");
  GrammarMatcher m(g);
  ASSERT_TRUE(m.accept_bytes("{"));
  std::vector<uint32_t> mask(v->mask_words());
  fill_closing_mask(m, *v, mask);
  // The shortest completion is "a": 1} (7 bytes); its token prefixes: "\"".
  for (int32_t id = 0; id < v->size(); ++id) {
    const bool prefix = std::string("\"a\": 1}").rfind(v->bytes(id), 0) == 0 && !v->is_special(id);
    EXPECT_EQ(mask_allows(mask, id), prefix) << v->bytes(id);
  }
  ASSERT_TRUE(m.accept_bytes("\"a\": 1}"));
  fill_closing_mask(m, *v, mask);
  EXPECT_TRUE(mask_allows(mask, 1));  // EOS
}

}  // namespace
}  // namespace serval::grammar
