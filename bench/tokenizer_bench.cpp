// Encoding time of long texts of a few shapes, at 100 KB and 400 KB, for the
// SentencePiece (Llama 2) and byte-level (Llama 3, Qwen 3) tokenizers: the
// times behind tests/tokenizer/tokenizer_growth_test.cpp, which checks the
// growth by counting work instead. Run:
//   SERVAL_MODELS=/path/to/models build/bench/tokenizer_bench
#include <benchmark/benchmark.h>

#include <map>
#include <memory>
#include <random>
#include <string>

#include "model/model_loader.h"
#include "tokenizer/tokenizer.h"

namespace {

// Loaded once per path; null when the models folder lacks it.
const serval::Tokenizer* tokenizer(const std::string& rel) {
  static std::map<std::string, std::unique_ptr<serval::Tokenizer>> loaded;
  auto it = loaded.find(rel);
  if (it == loaded.end()) {
    std::unique_ptr<serval::Tokenizer> tok;
    try {
      tok = serval::load_tokenizer(serval::models_dir() + "/" + rel);
    } catch (const std::exception&) {
    }
    it = loaded.emplace(rel, std::move(tok)).first;
  }
  return it->second.get();
}

std::string text_of(const std::string& shape, size_t n) {
  if (shape == "letters") return std::string(n, 'a');
  if (shape == "spaces") return std::string(n, ' ');
  std::string words;  // "mixed": words, digits, newlines, CJK, emoji
  std::mt19937 rng(1);
  const char* pool[] = {"the ", "quick ", "brown ", "fox's ", "123 ", "\n", "中文", "🙂 ", "  ", "naïve "};
  while (words.size() < n) words += pool[rng() % 10];
  return words;
}

void encode(benchmark::State& state, const char* rel, const char* shape) {
  const serval::Tokenizer* tok = tokenizer(rel);
  if (!tok) {
    state.SkipWithError("tokenizer missing: set SERVAL_MODELS");
    return;
  }
  const std::string text = text_of(shape, size_t(state.range(0)));
  for (auto _ : state) benchmark::DoNotOptimize(tok->encode(text, false));
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(text.size()));
}

constexpr const char* kLlama2 = "llama-2-tiny-random/llama-2-tiny-random.gguf";
constexpr const char* kLlama3 = "tokenizers/llama3/tokenizer.json";
constexpr const char* kQwen3 = "tokenizers/qwen3/tokenizer.json";

#define SIZES ->Arg(100 << 10)->Arg(400 << 10)->Unit(benchmark::kMillisecond)
BENCHMARK_CAPTURE(encode, llama2_letters, kLlama2, "letters") SIZES;
BENCHMARK_CAPTURE(encode, llama2_spaces, kLlama2, "spaces") SIZES;
BENCHMARK_CAPTURE(encode, llama2_mixed, kLlama2, "mixed") SIZES;
BENCHMARK_CAPTURE(encode, llama3_letters, kLlama3, "letters") SIZES;
BENCHMARK_CAPTURE(encode, llama3_spaces, kLlama3, "spaces") SIZES;
BENCHMARK_CAPTURE(encode, llama3_mixed, kLlama3, "mixed") SIZES;
BENCHMARK_CAPTURE(encode, qwen3_letters, kQwen3, "letters") SIZES;
BENCHMARK_CAPTURE(encode, qwen3_spaces, kQwen3, "spaces") SIZES;
BENCHMARK_CAPTURE(encode, qwen3_mixed, kQwen3, "mixed") SIZES;

}  // namespace

BENCHMARK_MAIN();
