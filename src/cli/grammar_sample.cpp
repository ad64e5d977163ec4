// `serval grammar-sample`: random walks through a grammar over a real
// vocabulary, as an end-to-end probe of the grammar engine without a model.
// Each step draws a token uniformly from the mask; past half the budget the
// walk heads for an end (EOS where allowed, else the sampled token that
// leaves the fewest bytes to finish). One JSON line per output:
// {"text": ..., "complete": bool}; complete means the grammar accepted the
// whole text and EOS was drawn.
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "cli/commands.h"
#include "core/error.h"
#include "grammar/compiled_grammar.h"
#include "grammar/ebnf_parser.h"
#include "grammar/json_builtins.h"
#include "grammar/json_schema_grammar.h"
#include "grammar/regex_to_grammar.h"
#include "grammar/token_mask.h"
#include "tokenizer/tokenizer.h"

namespace serval::cli {

namespace {

using namespace serval::grammar;

struct GrammarSampleOptions {
  std::string tokenizer;
  std::string json_schema, regex, grammar_file, choice;
  bool json_object = false;
  bool strict = false;
  uint32_t max_whitespace = 1;
  bool newlines = false;
  bool print_grammar = false;
  uint64_t seed = 0;
  int max_tokens = 256;
  int count = 1;
};

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  SERVAL_CHECK(f, "cannot open \"", path, "\"");
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::vector<std::string> split_choices(const std::string& s) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s) {
    if (c == ',') {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  out.push_back(cur);
  return out;
}

Grammar build_grammar(const GrammarSampleOptions& o) {
  int given = !o.json_schema.empty() + !o.regex.empty() + !o.grammar_file.empty() + !o.choice.empty() + o.json_object;
  SERVAL_CHECK(given == 1, "give exactly one of --json-schema, --regex, --grammar, --choice, --json-object");
  JsonSchemaOptions opts;
  opts.strict = o.strict;
  opts.max_whitespace = o.max_whitespace;
  opts.allow_newlines = o.newlines;
  if (!o.json_schema.empty()) return json_schema_text_to_grammar(read_text(o.json_schema), opts);
  if (!o.regex.empty()) return regex_to_grammar(o.regex);
  if (!o.grammar_file.empty()) return parse_gbnf(read_text(o.grammar_file));
  if (!o.choice.empty()) return choice_grammar(split_choices(o.choice));
  return json_object_grammar(opts);
}

struct Walk {
  std::string text;
  bool complete = false;
};

Walk random_walk(const TokenMasker& masker, const std::shared_ptr<const CompiledGrammar>& g, std::mt19937_64& rng,
                 int max_tokens) {
  const TokenVocabulary& vocab = masker.vocab();
  GrammarMatcher m(g);
  Walk w;
  std::vector<uint32_t> mask(vocab.mask_words());
  std::vector<int32_t> allowed;
  std::uniform_real_distribution<double> coin(0.0, 1.0);
  for (int step = 0; step < max_tokens; ++step) {
    bool hurry = step >= max_tokens / 2;
    if (m.can_end() && (m.is_terminated() || coin(rng) < (hurry ? 1.0 : 0.1))) {
      w.complete = true;
      return w;
    }
    masker.fill_mask(m, mask);
    allowed.clear();
    for (size_t i = 0; i < mask.size(); ++i)
      for (uint32_t bits = mask[i]; bits; bits &= bits - 1)
        if (int32_t id = int32_t(i * 32 + size_t(__builtin_ctz(bits))); !vocab.is_eos(id)) allowed.push_back(id);
    if (allowed.empty()) break;
    int32_t pick = allowed[std::uniform_int_distribution<size_t>(0, allowed.size() - 1)(rng)];
    if (hurry) {
      // Of a sample of allowed tokens, the one closest to an end.
      size_t best = SIZE_MAX;
      for (int k = 0; k < 64; ++k) {
        int32_t id = allowed[std::uniform_int_distribution<size_t>(0, allowed.size() - 1)(rng)];
        SERVAL_CHECK(m.accept_bytes(vocab.bytes(id)), "internal error: a masked-in token was refused");
        size_t left = m.min_bytes_to_end();
        m.rollback(1);
        if (left < best) best = left, pick = id;
      }
    }
    SERVAL_CHECK(masker.accept_token(m, pick), "internal error: a masked-in token was refused");
    w.text += vocab.bytes(pick);
  }
  w.complete = m.can_end();  // out of budget: complete if EOS is allowed here
  return w;
}

int run_grammar_sample(const GrammarSampleOptions& o) {
  std::unique_ptr<Tokenizer> tok = load_tokenizer(o.tokenizer);
  Grammar grammar = build_grammar(o);
  if (o.print_grammar) std::cerr << to_gbnf(grammar);
  auto compiled = CompiledGrammar::compile(grammar);
  TokenMasker masker(compiled, TokenVocabulary::from_tokenizer(*tok));
  std::mt19937_64 rng(o.seed);
  for (int i = 0; i < o.count; ++i) {
    Walk w = random_walk(masker, compiled, rng, o.max_tokens);
    nlohmann::json line = {{"text", w.text}, {"complete", w.complete}};
    std::cout << line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  }
  return 0;
}

}  // namespace

void register_grammar_sample(CLI::App& app, Action& action) {
  auto opts = std::make_shared<GrammarSampleOptions>();
  auto* sub = app.add_subcommand("grammar-sample", "Random walks through a grammar over a tokenizer's vocabulary (a probe of structured output)");
  sub->add_option("--tokenizer", opts->tokenizer, "a .gguf file, a folder with tokenizer.json, or a tokenizer.json")->required();
  sub->add_option("--json-schema", opts->json_schema, "a JSON Schema file");
  sub->add_option("--regex", opts->regex, "a regular expression");
  sub->add_option("--grammar", opts->grammar_file, "a GBNF grammar file");
  sub->add_option("--choice", opts->choice, "comma-separated strings: output exactly one");
  sub->add_flag("--json-object", opts->json_object, "any JSON object");
  sub->add_flag("--strict", opts->strict, "JSON Schema as OpenAI strict mode: no properties beyond 'properties'");
  sub->add_option("--max-whitespace", opts->max_whitespace, "JSON: whitespace characters allowed between tokens (default 1)");
  sub->add_flag("--newlines", opts->newlines, "JSON: that whitespace may hold newlines and tabs");
  sub->add_flag("--print-grammar", opts->print_grammar, "print the grammar (GBNF) to stderr");
  sub->add_option("--seed", opts->seed, "random seed");
  sub->add_option("--max-tokens", opts->max_tokens, "tokens per walk at most")->check(CLI::PositiveNumber);
  sub->add_option("--count", opts->count, "number of walks")->check(CLI::NonNegativeNumber);
  sub->callback([opts, &action] { action = [opts] { return run_grammar_sample(*opts); }; });
}

}  // namespace serval::cli
