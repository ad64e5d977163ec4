#include "model/random_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "model/convert.h"
#include "model/gguf.h"
#include "model/hf_model.h"
#include "model/mapped_file.h"
#include "model/model_def.h"
#include "model/rope_factors.h"

namespace serval {

namespace {

struct Preset {
  const char* name;
  const char* arch;
  int64_t vocab, hidden, inter, layers, heads, kv_heads, head_dim, max_pos;
  float theta, eps;
  bool tied;
  float llama3_factor;  // 0: no rope scaling
};

// From the models' published config.json files.
constexpr Preset kPresets[] = {
    {"llama-3.1-8b", "llama", 128256, 4096, 14336, 32, 32, 8, 128, 131072, 500000.0f, 1e-5f, false, 8.0f},
    {"llama-3.2-1b", "llama", 128256, 2048, 8192, 16, 32, 8, 64, 131072, 500000.0f, 1e-5f, true, 32.0f},
    {"llama-2-7b", "llama", 32000, 4096, 11008, 32, 32, 32, 128, 4096, 10000.0f, 1e-5f, false, 0.0f},
    {"qwen2.5-7b", "qwen2", 152064, 3584, 18944, 28, 28, 4, 128, 32768, 1000000.0f, 1e-6f, false, 0.0f},
};

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t hash_name(const std::string& s) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

// Element i of a tensor: a sum of four 16-bit uniforms (Irwin-Hall, close to a
// normal), scaled to `std` around `mean`. Depends only on (key, i).
inline float random_value(uint64_t key, uint64_t i, float mean, float std) {
  const uint64_t r = splitmix64(key ^ (i * 0xd1b54a32d192ed03ull));
  const float s = float(r & 0xffff) + float((r >> 16) & 0xffff) + float((r >> 32) & 0xffff) + float(r >> 48);
  // Mean of the sum is 2 * 65535, standard deviation 65535 * sqrt(4 / 12).
  constexpr float kCenter = 2.0f * 65535.0f;
  constexpr float kScale = 1.0f / (65535.0f * 0.57735027f);
  return mean + std * (s - kCenter) * kScale;
}

// Fills a tensor of `dtype` with random values, chunk by chunk (chunks are whole
// quantization blocks, so any dtype works).
void fill_random(void* dst, DType dtype, int64_t numel, uint64_t key, float mean, float std) {
  constexpr int64_t kChunk = 1 << 14;  // a multiple of every block size
  auto* out = static_cast<uint8_t*>(dst);
  // Each value depends only on (key, index): chunks are independent, so a 7B
  // model is written on all cores with the same bytes as on one.
#pragma omp parallel if (numel > 4 * kChunk)
  {
    std::vector<float> buf(size_t(std::min(kChunk, numel)));
#pragma omp for schedule(static)
    for (int64_t start = 0; start < numel; start += kChunk) {
      const int64_t n = std::min(kChunk, numel - start);
      for (int64_t i = 0; i < n; ++i) buf[size_t(i)] = random_value(key, uint64_t(start + i), mean, std);
      from_f32(dtype, buf.data(), out + dtype_bytes(dtype, start), n);
    }
  }
}

// GPT-2's printable stand-ins for the 256 byte values (byte-level BPE symbols).
std::vector<std::string> byte_level_symbols() {
  std::vector<std::string> out(256);
  int extra = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    const uint32_t cp = printable ? uint32_t(b) : uint32_t(256 + extra++);
    std::string s;
    if (cp < 0x80) {
      s += char(cp);
    } else {
      s += char(0xc0 | (cp >> 6));
      s += char(0x80 | (cp & 0x3f));
    }
    out[size_t(b)] = s;
  }
  return out;
}

void set_synthetic_tokenizer(GgufWriter& w, const ModelConfig& c) {
  const int64_t n = c.vocab_size;
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  tokens.reserve(size_t(n));
  const bool spm = c.architecture == "llama" && n <= 65536;  // Llama 2 style
  if (spm) {
    SERVAL_CHECK(n >= 259 + 1, "random model: vocab_size ", n, " is too small for a SentencePiece vocabulary");
    std::vector<float> scores;
    tokens = {"<unk>", "<s>", "</s>"};
    types = {int32_t(GgufTokenType::Unknown), int32_t(GgufTokenType::Control), int32_t(GgufTokenType::Control)};
    for (int b = 0; b < 256; ++b) {
      char hex[8];
      std::snprintf(hex, sizeof(hex), "<0x%02X>", b);
      tokens.push_back(hex);
      types.push_back(int32_t(GgufTokenType::Byte));
    }
    for (int64_t i = int64_t(tokens.size()); i < n; ++i) {
      tokens.push_back("\xe2\x96\x81tok_" + std::to_string(i));
      types.push_back(int32_t(GgufTokenType::Normal));
    }
    for (int64_t i = 0; i < n; ++i) scores.push_back(i < 259 ? 0.0f : -float(i - 259));
    w.set_string("tokenizer.ggml.model", "llama");
    w.set_string_array("tokenizer.ggml.tokens", tokens);
    w.set_f32_array("tokenizer.ggml.scores", scores);
    w.set_i32_array("tokenizer.ggml.token_type", types);
    w.set_u32("tokenizer.ggml.unknown_token_id", 0);
    w.set_u32("tokenizer.ggml.bos_token_id", 1);
    w.set_u32("tokenizer.ggml.eos_token_id", 2);
    w.set_bool("tokenizer.ggml.add_bos_token", true);
    return;
  }
  // Byte-level BPE: the 256 byte symbols, "tok_N" fillers, and special tokens at
  // the end (as in Llama 3 and Qwen2 vocabularies). No merges: text encodes byte
  // by byte, which is all a benchmark needs.
  const int64_t n_special = std::min<int64_t>(256, n - 256);
  SERVAL_CHECK(n_special > 2, "random model: vocab_size ", n, " is too small for a byte-level vocabulary");
  for (const std::string& s : byte_level_symbols()) {
    tokens.push_back(s);
    types.push_back(int32_t(GgufTokenType::Normal));
  }
  const int64_t first_special = n - n_special;
  for (int64_t i = 256; i < first_special; ++i) {
    tokens.push_back("tok_" + std::to_string(i));
    types.push_back(int32_t(GgufTokenType::Normal));
  }
  const bool llama = c.architecture == "llama";
  for (int64_t i = first_special; i < n; ++i) {
    std::string t = "<|reserved_special_token_" + std::to_string(i - first_special) + "|>";
    if (i == first_special) t = llama ? "<|begin_of_text|>" : "<|endoftext|>";
    if (i == first_special + 1) t = llama ? "<|end_of_text|>" : "<|im_start|>";
    if (i == first_special + 2 && !llama) t = "<|im_end|>";
    tokens.push_back(t);
    types.push_back(int32_t(GgufTokenType::Control));
  }
  w.set_string("tokenizer.ggml.model", "gpt2");
  w.set_string("tokenizer.ggml.pre", llama ? "llama-bpe" : "qwen2");
  w.set_string_array("tokenizer.ggml.tokens", tokens);
  w.set_i32_array("tokenizer.ggml.token_type", types);
  w.set_string_array("tokenizer.ggml.merges", {});
  if (llama) w.set_u32("tokenizer.ggml.bos_token_id", uint32_t(first_special));
  w.set_u32("tokenizer.ggml.eos_token_id", uint32_t(first_special + (llama ? 1 : 2)));
  w.set_bool("tokenizer.ggml.add_bos_token", llama);
}

}  // namespace

std::vector<std::string> random_model_names() {
  std::vector<std::string> out;
  for (const Preset& p : kPresets) out.push_back(p.name);
  return out;
}

ModelConfig random_model_config(const std::string& like) {
  for (const Preset& p : kPresets) {
    if (like != p.name) continue;
    ModelConfig c;
    c.architecture = p.arch;
    c.name = std::string("random ") + p.name;
    c.vocab_size = p.vocab;
    c.hidden_size = p.hidden;
    c.intermediate_size = p.inter;
    c.num_layers = p.layers;
    c.num_heads = p.heads;
    c.num_kv_heads = p.kv_heads;
    c.head_dim = p.head_dim;
    c.rope_dim = p.head_dim;
    c.max_position = p.max_pos;
    c.rope_theta = p.theta;
    c.rms_eps = p.eps;
    c.tie_word_embeddings = p.tied;
    c.attention_bias = std::string(p.arch) == "qwen2";
    c.rope_style = std::string(p.arch) == "llama" ? RopeStyle::Interleaved : RopeStyle::Neox;
    if (p.llama3_factor > 0) {
      c.rope_scaling.type = RopeScaling::Type::Llama3;
      c.rope_scaling.factor = p.llama3_factor;
      c.rope_scaling.low_freq_factor = 1.0f;
      c.rope_scaling.high_freq_factor = 4.0f;
      c.rope_scaling.original_max_position = 8192;
    }
    c.validate();
    return c;
  }
  if (std::filesystem::exists(like) && !std::filesystem::is_directory(like)) {
    ModelConfig c = config_from_hf_json(read_text_file(like), like);
    c.rope_style = c.architecture == "llama" ? RopeStyle::Interleaved : RopeStyle::Neox;  // as written to GGUF
    return c;
  }
  std::string names;
  for (const Preset& p : kPresets) names += std::string(names.empty() ? "" : ", ") + p.name;
  fail("random model: \"", like, "\" is neither a known shape (", names, ") nor a config.json file");
}

void write_random_model(const std::string& like, DType dtype, const std::string& out_path, uint64_t seed) {
  write_random_model(random_model_config(like), dtype, out_path, seed);
}

void write_random_model(const ModelConfig& c, DType dtype, const std::string& out_path, uint64_t seed) {
  GgufWriter w;
  set_gguf_model_metadata(w, c);
  set_synthetic_tokenizer(w, c);
  for (const TensorSpec& e : ModelDef::of(c).tensors()) {
    const bool vector = e.shape.size() == 1;
    const bool norm = e.name.find("norm") != std::string::npos;
    const float mean = norm ? 1.0f : 0.0f;
    const float std = 0.02f;
    const DType t = vector ? DType::F32 : dtype;
    int64_t numel = 1;
    for (int64_t d : e.shape) numel *= d;
    const uint64_t key = splitmix64(seed ^ hash_name(e.name));
    w.add_tensor_generated(e.name, t, e.shape, [=](void* dst, int64_t) { fill_random(dst, t, numel, key, mean, std); });
  }
  if (c.rope_scaling.type == RopeScaling::Type::Llama3) {
    const std::vector<float> f = llama3_rope_factors(c);
    w.add_tensor_generated("rope_freqs.weight", DType::F32, {int64_t(f.size())},
                           [f](void* dst, int64_t nbytes) { std::memcpy(dst, f.data(), size_t(nbytes)); });
  }
  w.write(out_path);
}

}  // namespace serval
