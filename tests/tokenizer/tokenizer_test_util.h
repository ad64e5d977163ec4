#pragma once
// Helpers for the tokenizer tests: where the shared models are, and tokenizers
// loaded once per test binary (loading Llama 3's tokenizer.json takes ~0.5 s).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "model/model_loader.h"
#include "tokenizer/tokenizer.h"

namespace serval::testing {

inline std::string models_root() { return models_dir(); }

inline std::string model_path(const std::string& rel) { return models_root() + "/" + rel; }

inline std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// The tokenizer at models_root()/rel, loaded once; nullptr (with a test
// failure naming the path) when the file is missing.
inline const Tokenizer* shared_tokenizer(const std::string& rel) {
  static std::mutex mu;
  static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(rel);
  if (it != cache.end()) return it->second.get();
  std::string path = model_path(rel);
  if (!std::filesystem::exists(path)) {
    ADD_FAILURE() << "test model missing: " << path << " (set SERVAL_MODELS to the shared models folder)";
    return nullptr;
  }
  auto tok = load_tokenizer(path);
  const Tokenizer* raw = tok.get();
  cache.emplace(rel, std::move(tok));
  return raw;
}

inline const char* kLlama2Gguf = "llama-2-tiny-random/llama-2-tiny-random.gguf";
inline const char* kStoriesGguf = "stories260K/stories260K.gguf";
inline const char* kLlama3Json = "tokenizers/llama3/tokenizer.json";
inline const char* kQwen3Json = "tokenizers/qwen3/tokenizer.json";
inline const char* kLlama3Dir = "tokenizers/llama3";
inline const char* kQwen3Dir = "tokenizers/qwen3";

// llama.cpp's test vectors models/NAME.inp/.out (tokenizer-tests/).
struct Vector {
  std::string text;
  std::vector<int32_t> ids;
};

inline std::vector<Vector> read_vectors(const std::string& name) {
  std::string inp = read_file(model_path("tokenizer-tests/" + name + ".inp"));
  std::string out = read_file(model_path("tokenizer-tests/" + name + ".out"));
  EXPECT_FALSE(inp.empty()) << "missing " << model_path("tokenizer-tests/" + name + ".inp");
  std::vector<std::string> texts;
  const std::string sep = "\n__ggml_vocab_test__\n";
  size_t pos = 0;
  while (true) {
    size_t next = inp.find(sep, pos);
    if (next == std::string::npos) break;
    texts.push_back(inp.substr(pos, next - pos));
    pos = next + sep.size();
  }
  std::vector<Vector> vs;
  std::istringstream lines(out);
  std::string line;
  for (const auto& t : texts) {
    std::getline(lines, line);
    Vector v{t, {}};
    std::istringstream nums(line);
    int32_t id;
    while (nums >> id) v.ids.push_back(id);
    vs.push_back(std::move(v));
  }
  return vs;
}

}  // namespace serval::testing
