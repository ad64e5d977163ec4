// Malformed and hostile templates: thousands of mutations of real templates
// either render or throw serval::Error; nothing crashes, hangs or exhausts
// memory.
#include <gtest/gtest.h>

#include <random>

#include "tokenizer/chat_template.h"
#include "tokenizer_test_util.h"

namespace serval {
namespace {

using namespace serval::testing;
using ojson = nlohmann::ordered_json;

const ojson& conversation() {
  static const ojson vars = ojson::parse(R"({
    "messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi <think>x</think>"},
                 {"role": "assistant", "content": "ok", "tool_calls": [{"function": {"name": "f", "arguments": {"a": 1}}}]},
                 {"role": "tool", "content": "r"}, {"role": "user", "content": "again"}],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
    "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>"})");
  return vars;
}

// Parses and renders; true when it worked, false on a serval::Error.
bool try_render(const std::string& source) {
  try {
    ChatTemplate t(source);
    t.render(conversation());
    return true;
  } catch (const Error&) {
    return false;
  }
}

TEST(JinjaRobustness, MutatedRealTemplatesFailCleanly) {
  std::vector<std::string> seeds = {load_chat_template(model_path(kQwen3Dir)), load_chat_template(model_path(kLlama3Dir)),
                                    read_file(std::string(SERVAL_SOURCE_DIR) + "/tests/python/chat_templates/language_features.jinja")};
  for (const auto& s : seeds) ASSERT_TRUE(try_render(s));
  const std::string alphabet = "{}%#-+()[]'\".|~,:=!<>*/ \n\\0123abcfinorstxz_";
  std::mt19937 rng(1234);
  int rendered = 0, failed = 0;
  for (int i = 0; i < 3000; ++i) {
    std::string t = seeds[static_cast<size_t>(i) % seeds.size()];
    int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits && !t.empty(); ++e) {
      size_t pos = rng() % t.size();
      char c = alphabet[rng() % alphabet.size()];
      switch (rng() % 3) {
        case 0: t.erase(pos, 1 + rng() % 8); break;
        case 1: t.insert(pos, 1, c); break;
        default: t[pos] = c;
      }
    }
    (try_render(t) ? rendered : failed)++;
  }
  EXPECT_GT(rendered, 0);
  EXPECT_GT(failed, 0);
}

TEST(JinjaRobustness, HostileExpressionsAreBounded) {
  for (const char* source : {"{{ 'x' * 1000000000000 }}", "{{ [1] * 1000000000000 }}", "{{ 2 ** 100000000000 }}",
                             "{{ 2 ** 64 }}", "{{ '%999999999s' % 'x' }}", "{{ '%.99999f' % 1.0 }}",
                             "{% for i in range(1000000000) %}{% endfor %}", "{{ 1 // 0 }}", "{{ 1 % 0 }}",
                             "{{ 'a'.split('') }}", "{{ 'a' | round }}", "{{ none.x.y }}",
                             "{{ loop.index }}", "{{ namespace(a=1).b.c }}", "{{ range(1, 2, 0) }}"})
    EXPECT_FALSE(try_render(source)) << source;
}

}  // namespace
}  // namespace serval
