// What the loaders read besides the vocabulary: BOS/EOS, add_bos, end-of-turn
// ids, chat templates, and the errors for unusable inputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "tokenizer_test_util.h"

namespace serval {
namespace {

using namespace serval::testing;

bool contains(const std::vector<int32_t>& v, int32_t x) { return std::find(v.begin(), v.end(), x) != v.end(); }

TEST(TokenizerLoader, Llama2FromGguf) {
  const Tokenizer* tok = shared_tokenizer(kLlama2Gguf);
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->vocab_size(), 32000);
  EXPECT_EQ(tok->bos_id, 1);
  EXPECT_EQ(tok->eos_id, 2);
  EXPECT_TRUE(tok->add_bos);
  EXPECT_FALSE(tok->add_eos);
  EXPECT_EQ(tok->eos_ids, std::vector<int32_t>{2});
  EXPECT_TRUE(tok->is_special(1));
  EXPECT_FALSE(tok->is_special(15043));
  EXPECT_EQ(tok->token_piece(15043), "▁Hello");
  EXPECT_EQ(tok->token_bytes(13), "\n");  // <0x0A>
  EXPECT_EQ(tok->encode("", true), std::vector<int32_t>{1});
  EXPECT_EQ(tok->encode("", false), std::vector<int32_t>{});
}

TEST(TokenizerLoader, Llama3FromFolder) {
  const Tokenizer* tok = shared_tokenizer(kLlama3Dir);
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->vocab_size(), 128256);
  EXPECT_EQ(tok->bos_id, 128000);
  EXPECT_EQ(tok->eos_id, 128001);
  // This tokenizer.json's post-processor is plain ByteLevel (no BOS template) and its
  // class is PreTrainedTokenizerFast, so transformers adds no BOS; neither do we.
  EXPECT_FALSE(tok->add_bos);
  EXPECT_TRUE(contains(tok->eos_ids, 128001));  // <|end_of_text|>
  EXPECT_TRUE(contains(tok->eos_ids, 128009));  // <|eot_id|>
  EXPECT_EQ(tok->eos_ids.size(), 2u);  // Llama 3.0 has no <|eom_id|> (3.1 does)
  EXPECT_FALSE(tok->chat_template.empty());
  EXPECT_EQ(tok->encode("Hi", true), (std::vector<int32_t>{13347}));
  // ignore_merges: " việc" is a vocabulary entry that the merges alone would
  // split into [3355, 26298, 66] (checked with HF tokenizers, ignore_merges off).
  EXPECT_EQ(tok->encode(" việc", false), std::vector<int32_t>{100769});
}

TEST(TokenizerLoader, Qwen3FromFolder) {
  const Tokenizer* tok = shared_tokenizer(kQwen3Dir);
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->vocab_size(), 151669);
  EXPECT_EQ(tok->bos_id, -1);
  EXPECT_FALSE(tok->add_bos);
  EXPECT_EQ(tok->eos_id, 151645);                // <|im_end|>
  EXPECT_TRUE(contains(tok->eos_ids, 151643));   // <|endoftext|>
  EXPECT_NE(tok->chat_template.find("im_start"), std::string::npos);
  EXPECT_TRUE(tok->is_special(151644));          // <|im_start|>
  EXPECT_FALSE(tok->is_special(151667));         // <think>: added but not special
  EXPECT_EQ(tok->encode("<think>", false), std::vector<int32_t>{151667});
}

class TempDir {
 public:
  TempDir() {
    path_ = std::filesystem::temp_directory_path() /
            ("serval_tok_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string write(const std::string& name, const std::string& content) const {
    std::ofstream(path_ / name) << content;
    return (path_ / name).string();
  }
  std::string path() const { return path_.string(); }

 private:
  std::filesystem::path path_;
};

void expect_error(const std::string& path, const std::string& fragment) {
  try {
    load_tokenizer(path);
    ADD_FAILURE() << "no error for " << path;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

TEST(TokenizerLoader, ErrorsNameTheProblem) {
  TempDir dir;
  expect_error(dir.path() + "/nope.json", "does not exist");
  expect_error(dir.path(), "no tokenizer.json");
  expect_error(dir.write("tokenizer.json", "{not json"), "not valid JSON");
  expect_error(dir.write("t2.json", R"({"model": {"type": "Unigram", "vocab": []}})"), "\"Unigram\" is not supported");
  expect_error(dir.write("t3.json", R"({"normalizer": null})"), "no \"model\"");
  expect_error(dir.write("weights.bin", "garbage"), "expected a .gguf file");
  // Valid JSON, a field of the wrong type: the file is named, not only nlohmann's message.
  expect_error(dir.write("t4.json", R"({"pre_tokenizer": {"type": "Split", "pattern": {"Regex": 5}},
                                        "model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}})"),
               "t4.json\": a field has the wrong JSON type");
  // Ids: integers of 0 .. 2^24 - 1 (a float id used to be converted with undefined behaviour).
  expect_error(dir.write("t6.json", R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 2e97}, "merges": []}})"),
               "the id of \"b\" is not an integer: 2e+97");
  expect_error(dir.write("t7.json", R"({"added_tokens": [{"id": -1, "content": "<s>"}],
                                        "model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}})"),
               "the id of \"<s>\" is out of range");
  expect_error(dir.write("t8.json", R"({"model": {"type": "BPE", "vocab": {"a": 16777216}, "merges": []}})"),
               "the id of \"a\" is out of range");
  expect_error(dir.write("t5.json", R"({"model": {"type": "BPE", "byte_fallback": 3, "vocab": {"a": 0}, "merges": []}})"),
               "t5.json\": a field has the wrong JSON type");
}

TEST(TokenizerLoader, MinimalByteLevelJson) {
  // A hand-made 6-token vocabulary: merges "a b" -> "ab", then "ab c" -> "abc".
  TempDir dir;
  std::string path = dir.write("tokenizer.json", R"({
    "added_tokens": [{"id": 5, "content": "<eos>", "special": true}],
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true},
    "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "c": 2, "ab": 3, "abc": 4},
              "merges": ["a b", ["ab", "c"]]}})");
  auto tok = load_tokenizer(path);
  EXPECT_EQ(tok->encode("abcab<eos>ca", false), (std::vector<int32_t>{4, 3, 5, 2, 0}));
  EXPECT_EQ(tok->decode({4, 3, 5}), "abcab");
  EXPECT_EQ(tok->decode({4, 3, 5}, false), "abcab<eos>");
  EXPECT_EQ(tok->eos_id, 5);  // no tokenizer_config.json: the usual names
  // Ids past the vocabulary (padded embedding rows) decode to nothing, as in
  // transformers; negative ids are an error.
  EXPECT_EQ(tok->decode({4, 6}), tok->decode({4}));
  EXPECT_THROW(tok->decode({-1}), Error);
  EXPECT_THROW(tok->token_bytes(6), Error);
}

// SmolLM's pre-tokenizer: Sequence[Digits(individual_digits), ByteLevel(use_regex)]. A
// whitespace run ends where a digit starts ("a  1" keeps "ĠĠ" whole, where the GPT-2 regex
// alone splits it as "Ġ" + " 1"), and digits stand alone.
const char* kDigitsVocab = R"("model": {"type": "BPE", "vocab": {"a": 0, "Ġ": 1, "1": 2, "ĠĠ": 3, "Ċ": 4,
                                                                  "ĊĊ": 5, "2": 6, "12": 7},
                                       "merges": ["Ġ Ġ", "Ċ Ċ", "1 2"]}})";

TEST(TokenizerLoader, DigitsThenByteLevelIsSmolLMsPreTokenizer) {
  TempDir dir;
  std::string path = dir.write("tokenizer.json", std::string(R"({"pre_tokenizer": {"type": "Sequence",
    "pretokenizers": [{"type": "Digits", "individual_digits": true},
                      {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}]},
    )") + kDigitsVocab);
  auto tok = load_tokenizer(path);
  EXPECT_EQ(tok->encode("a  1", false), (std::vector<int32_t>{0, 3, 2}));
  EXPECT_EQ(tok->encode("a\n\n12", false), (std::vector<int32_t>{0, 5, 2, 6}));
  EXPECT_EQ(tok->encode("a 1 2", false), (std::vector<int32_t>{0, 1, 2, 1, 6}));
  // The GPT-2 regex alone (ByteLevel without Digits) merges "12" and splits the spaces.
  std::string gpt2 = dir.write("gpt2.json", std::string(R"({"pre_tokenizer": {"type": "ByteLevel", "use_regex": true},
    )") + kDigitsVocab);
  EXPECT_EQ(load_tokenizer(gpt2)->encode("a  12", false), (std::vector<int32_t>{0, 1, 1, 7}));
  // Other uses of Digits are refused rather than ignored.
  expect_error(dir.write("d1.json", std::string(R"({"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
    {"type": "Digits", "individual_digits": false}, {"type": "ByteLevel", "use_regex": true}]}, )") + kDigitsVocab),
               "only supported with individual_digits");
  expect_error(dir.write("d2.json", std::string(R"({"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
    {"type": "ByteLevel", "use_regex": true}, {"type": "Digits", "individual_digits": true}]}, )") + kDigitsVocab),
               "only supported with individual_digits");
  expect_error(dir.write("d3.json", std::string(R"({"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
    {"type": "Digits", "individual_digits": true}, {"type": "ByteLevel", "use_regex": false}]}, )") + kDigitsVocab),
               "followed by ByteLevel with use_regex");
}

}  // namespace
}  // namespace serval
