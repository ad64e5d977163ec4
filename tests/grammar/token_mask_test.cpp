// Token masks: the cached trie walk must give exactly the masks of trying
// every token on its own, on a small vocabulary built to hit the corner cases
// and on Llama 3's real 128k vocabulary.
#include "grammar/token_mask.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>

#include "grammar/json_schema_grammar.h"
#include "grammar/regex_to_grammar.h"
#include "grammar_test_util.h"
#include "model/model_loader.h"
#include "tokenizer/tokenizer.h"

namespace serval::grammar {
namespace {

using testing::compile_gbnf;

const char* kJsonGbnf = R"(
  root   ::= object
  value  ::= object | array | string | number | "true" | "false" | "null"
  object ::= "{" ws ( string ws ":" ws value ws ( "," ws string ws ":" ws value ws )* )? "}"
  array  ::= "[" ws ( value ws ( "," ws value ws )* )? "]"
  string ::= "\"" ( [^"\\\x00-\x1F] | "\\" ["\\/bfnrt] )* "\""
  number ::= "-"? ( "0" | [1-9] [0-9]* ) ( "." [0-9]+ )?
  ws     ::= " "?
)";

std::shared_ptr<const TokenVocabulary> small_vocab() {
  std::vector<std::string> t = {"<s>", "</s>", "{", "}", "\"", "\",", "\"}", "\":", "a", "ab", "abc", "b\"", "c\",\"",
                                " ", " \"", "1", "12", "0", "-", ".", "5}", "},", "[", "]", "[]", "\\", "\\n", "\\\"",
                                "é", "\xC3", "\xA9", "\xA9\"", "true", "tr", "ue", "null", ",", ", ", ": ", ":",
                                "\"a\":1}", "x\"}", "}}", "]}", ",\"", "\n"};
  return std::make_shared<const TokenVocabulary>(std::move(t), std::vector<int32_t>{0}, std::vector<int32_t>{1});
}

// Compares the masks at every prefix of `text` (as a sequence of single
// bytes and of tokens where possible).
void expect_masks_match(const std::shared_ptr<const CompiledGrammar>& g, const std::shared_ptr<const TokenVocabulary>& v,
                        const std::string& text) {
  TokenMasker masker(g, v);
  GrammarMatcher m(g);
  std::vector<uint32_t> fast(v->mask_words()), slow(v->mask_words());
  for (size_t i = 0; i <= text.size(); ++i) {
    masker.fill_mask(m, fast);
    fill_mask_reference(m, *v, slow);
    for (int32_t id = 0; id < v->size(); ++id)
      ASSERT_EQ(mask_allows(fast, id), mask_allows(slow, id))
          << "after \"" << text.substr(0, i) << "\": token " << id << " \"" << v->bytes(id) << "\"";
    if (i < text.size()) {
      ASSERT_TRUE(m.accept_bytes(text.substr(i, 1))) << text.substr(0, i + 1);
    }
  }
}

TEST(TokenMask, EqualsBruteForceOnASmallVocabulary) {
  auto g = compile_gbnf(kJsonGbnf);
  auto v = small_vocab();
  expect_masks_match(g, v, R"({"a": [1, -0.5, "x\"é"], "abc":{}, "b": [true, null, {"c": "d"}]})");
  expect_masks_match(g, v, R"({ "ab" : 12 , "c" : [ ] })");
}

TEST(TokenMask, EosOnlyWhereTheTextMayEndAndSpecialTokensNever) {
  auto g = compile_gbnf(R"(root ::= "a" "b"?)");
  auto v = small_vocab();
  TokenMasker masker(g, v);
  GrammarMatcher m(g);
  auto mask = masker.mask(m);
  EXPECT_FALSE(mask_allows(mask, 1));
  EXPECT_FALSE(mask_allows(mask, 0));
  EXPECT_TRUE(mask_allows(mask, 8));    // a
  EXPECT_TRUE(mask_allows(mask, 9));    // ab
  EXPECT_FALSE(mask_allows(mask, 10));  // abc
  ASSERT_TRUE(masker.accept_token(m, 8));
  mask = masker.mask(m);
  EXPECT_TRUE(mask_allows(mask, 1));
  EXPECT_FALSE(masker.accept_token(m, 0));
  EXPECT_TRUE(masker.accept_token(m, 1));  // EOS: accepted, the matcher unchanged
  EXPECT_TRUE(m.can_end());
}

TEST(TokenMask, RegexLikeAndGbnfGrammars) {
  auto v = small_vocab();
  expect_masks_match(compile_gbnf(R"(root ::= ("ab" | "a" "b"? "c") "\"" [,:] "\"" "a"*)"), v, "abc\",\"aaa");
  expect_masks_match(compile_gbnf(R"(root ::= [a-c]{2,4} ("é" | "\"")+ "}")"), v, "abé\"é}");
}

const Tokenizer* llama3() {
  static std::unique_ptr<Tokenizer> tok = [] {
    std::string path = models_dir() + "/tokenizers/llama3/tokenizer.json";
    return load_tokenizer(path);
  }();
  return tok.get();
}

TEST(TokenMask, EqualsBruteForceOnLlama3Vocabulary) {
  auto v = TokenVocabulary::from_tokenizer(*llama3());
  ASSERT_GT(v->size(), 128000);
  auto g = compile_gbnf(kJsonGbnf);
  TokenMasker masker(g, v);
  GrammarMatcher m(g);
  std::vector<uint32_t> fast(v->mask_words()), slow(v->mask_words());
  const std::string text = R"({"name": "Ada \"L\" é", "n": [-12.5, {}], "ok": true})";
  // A handful of states: the start, inside keys, strings, numbers, arrays.
  for (size_t cut : {0, 1, 3, 9, 14, 20, 26, 30, 33, 38, 44, 50}) {
    GrammarMatcher at(g);
    ASSERT_TRUE(at.accept_bytes(text.substr(0, cut)));
    masker.fill_mask(at, fast);
    fill_mask_reference(at, *v, slow);
    size_t allowed = 0;
    for (int32_t id = 0; id < v->size(); ++id) {
      ASSERT_EQ(mask_allows(fast, id), mask_allows(slow, id))
          << "after \"" << text.substr(0, cut) << "\": token " << id << " \"" << v->bytes(id) << "\"";
      allowed += mask_allows(fast, id);
    }
    EXPECT_GT(allowed, 0u);
  }
}

const char* kSchema = R"({"type": "object", "properties": {
    "id": {"type": "string", "format": "uuid"},
    "name": {"type": "string", "maxLength": 40},
    "age": {"type": "integer", "minimum": 0, "maximum": 150},
    "score": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
    "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 4},
    "address": {"type": "object", "properties": {"city": {"type": "string"}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                "required": ["city"]},
    "notes": {"anyOf": [{"type": "string"}, {"type": "null"}]}},
  "required": ["id", "name", "age"]})";

// Random walks: a uniformly drawn allowed token each step.
template <typename OnStep>
void walk(const TokenMasker& masker, const std::shared_ptr<const CompiledGrammar>& g, uint64_t seed, int steps, OnStep on_step) {
  std::mt19937_64 rng(seed);
  GrammarMatcher m(g);
  std::vector<uint32_t> mask(masker.vocab().mask_words());
  for (int step = 0; step < steps; ++step) {
    on_step(m, step);
    masker.fill_mask(m, mask);
    std::vector<int32_t> allowed;
    for (int32_t id = 0; id < masker.vocab().size(); ++id)
      if (mask_allows(mask, id) && !masker.vocab().is_eos(id)) allowed.push_back(id);
    if (allowed.empty()) return;
    ASSERT_TRUE(masker.accept_token(m, allowed[rng() % allowed.size()]));
  }
}

// Byte-level BPE (Llama 3, 128k) and SentencePiece with byte tokens that
// duplicate other tokens' bytes (Llama 2, 32k).
TEST(TokenMask, EqualsBruteForceAlongRandomWalks) {
  std::unique_ptr<Tokenizer> llama2 = load_tokenizer(models_dir() + "/llama-2-tiny-random/llama-2-tiny-random.gguf");
  const std::shared_ptr<const CompiledGrammar> grammars[] = {
      CompiledGrammar::compile(json_schema_text_to_grammar(kSchema)),
      CompiledGrammar::compile(regex_to_grammar("[a-z ]{1,30}(, [A-Z][a-z]+)*\\.")),
  };
  for (const Tokenizer* tok : {llama3(), static_cast<const Tokenizer*>(llama2.get())}) {
    auto v = TokenVocabulary::from_tokenizer(*tok);
    std::vector<uint32_t> fast(v->mask_words()), slow(v->mask_words());
    for (const auto& g : grammars) {
      TokenMasker masker(g, v);
      walk(masker, g, 7, 36, [&](GrammarMatcher& m, int step) {
        if (step % 4) return;
        masker.fill_mask(m, fast);
        fill_mask_reference(m, *v, slow);
        for (int32_t id = 0; id < v->size(); ++id)
          ASSERT_EQ(mask_allows(fast, id), mask_allows(slow, id))
              << "vocabulary of " << v->size() << ", step " << step << ": token " << id << " \"" << v->bytes(id) << "\"";
      });
    }
  }
}

// Not a test of speed (tests must not depend on timing): prints the cost of
// a mask on the 128k vocabulary, cold (first use of a grammar context, which
// walks the trie) and warm (cached), for a few kinds of JSON states, and over
// random walks through a JSON schema.
TEST(TokenMask, ReportsMicrosecondsPerMaskOnLlama3) {
  auto v = TokenVocabulary::from_tokenizer(*llama3());
  auto g = compile_gbnf(kJsonGbnf);
  TokenMasker masker(g, v);
  std::vector<uint32_t> mask(v->mask_words());
  struct State {
    const char* name;
    const char* prefix;
  };
  const State states[] = {{"start", ""}, {"in a key", R"({"na)"}, {"after a key", R"({"name")"},
                          {"in a string value", R"({"name": "Ad)"}, {"in a number", R"({"n": -12)"},
                          {"after a value", R"({"n": 1)"}, {"in an array", R"({"n": [1, )"}};
  using clock = std::chrono::steady_clock;
  auto us = [](auto d) { return std::chrono::duration<double, std::micro>(d).count(); };
  for (const auto& s : states) {
    GrammarMatcher m(g);
    ASSERT_TRUE(m.accept_bytes(s.prefix));
    auto t0 = clock::now();
    masker.fill_mask(m, mask);
    auto t1 = clock::now();
    const int reps = 200;
    for (int i = 0; i < reps; ++i) masker.fill_mask(m, mask);
    auto t2 = clock::now();
    size_t allowed = 0;
    for (int32_t id = 0; id < v->size(); ++id) allowed += mask_allows(mask, id);
    std::printf("[ mask     ] json gbnf, %-18s cold %8.0f us  warm %7.1f us  (%zu of %d tokens allowed)\n", s.name,
                us(t1 - t0), us(t2 - t1) / reps, allowed, v->size());
  }
  // A schema: the first walk fills the cache (cold), later walks use it.
  auto sg = CompiledGrammar::compile(json_schema_text_to_grammar(kSchema));
  TokenMasker smasker(sg, v);
  for (int round = 0; round < 2; ++round) {
    double total = 0, worst = 0;
    int n = 0;
    for (uint64_t seed = 1; seed <= 8; ++seed) {
      walk(smasker, sg, seed, 60, [&](GrammarMatcher& m, int) {
        auto t0 = clock::now();
        smasker.fill_mask(m, mask);
        double t = us(clock::now() - t0);
        total += t, worst = std::max(worst, t), ++n;
      });
    }
    std::printf("[ mask     ] json schema walks, %s: %d masks, mean %.1f us, max %.0f us (cache entries %zu)\n",
                round ? "warm" : "cold", n, total / n, worst, smasker.cache_size());
  }
}

}  // namespace
}  // namespace serval::grammar
