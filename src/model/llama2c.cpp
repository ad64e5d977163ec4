#include "model/llama2c.h"

#include <cstring>

#include "core/error.h"
#include "model/mapped_file.h"
#include "model/model_def.h"

namespace serval {

LoadedModel load_llama2c_model(const std::string& path) {
  auto file = MappedFile::open_read(path);
  auto bad = [&](const auto&... args) { fail("llama2.c checkpoint \"", path, "\": ", args...); };
  if (file->size() < 28) bad("file is truncated: ", file->size(), " bytes, the header alone takes 28");
  int32_t h[7];
  std::memcpy(h, file->data(), sizeof(h));
  const int64_t dim = h[0], hidden = h[1], layers = h[2], heads = h[3], kv_heads = h[4], seq_len = h[6];
  const bool shared_classifier = h[5] > 0;
  const int64_t vocab = h[5] < 0 ? -int64_t(h[5]) : h[5];
  for (int i = 0; i < 7; ++i)
    if (h[i] == 0 || (i != 5 && h[i] < 0) || std::abs(int64_t(h[i])) > (1 << 20))
      bad("header field ", i, " = ", h[i], " is out of range (is this a llama2.c checkpoint?)");
  if (dim % heads != 0) bad("dim ", dim, " is not a multiple of n_heads ", heads);
  if (heads % kv_heads != 0) bad("n_heads ", heads, " is not a multiple of n_kv_heads ", kv_heads);
  const int64_t head_size = dim / heads;
  const int64_t kv_dim = kv_heads * head_size;

  LoadedModel m;
  ModelConfig& c = m.config;
  c.architecture = "llama";
  c.name = "llama2.c";
  c.vocab_size = vocab;
  c.hidden_size = dim;
  c.intermediate_size = hidden;
  c.num_layers = layers;
  c.num_heads = heads;
  c.num_kv_heads = kv_heads;
  c.head_dim = head_size;
  c.rope_dim = head_size;
  c.max_position = seq_len;
  c.rms_eps = 1e-5f;
  c.rope_theta = 10000.0f;
  c.rope_style = RopeStyle::Interleaved;
  c.tie_word_embeddings = shared_classifier;
  c.validate();
  m.path = path;
  m.format = "llama2c";

  // Walk the float arrays in file order, handing out per-layer views.
  uint64_t pos = 28;
  auto take = [&](int64_t count) -> const uint8_t* {
    const uint64_t bytes = uint64_t(count) * 4;
    if (bytes > file->size() - pos)
      bad("file is truncated: needs ", pos + bytes, " bytes, has ", file->size());
    const uint8_t* p = file->data() + pos;
    pos += bytes;
    return p;
  };
  auto add = [&](const std::string& name, std::vector<int64_t> shape, const uint8_t* data) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    m.weights.add({name, DType::F32, std::move(shape), data, n * 4});
  };
  auto per_layer = [&](const char* name, std::vector<int64_t> shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    const uint8_t* base = take(layers * n);
    for (int64_t l = 0; l < layers; ++l) add(str_cat("blk.", l, ".", name), shape, base + l * n * 4);
  };
  add("token_embd.weight", {vocab, dim}, take(vocab * dim));
  per_layer("attn_norm.weight", {dim});
  per_layer("attn_q.weight", {dim, dim});
  per_layer("attn_k.weight", {kv_dim, dim});
  per_layer("attn_v.weight", {kv_dim, dim});
  per_layer("attn_output.weight", {dim, dim});
  per_layer("ffn_norm.weight", {dim});
  per_layer("ffn_gate.weight", {hidden, dim});  // w1
  per_layer("ffn_down.weight", {dim, hidden});  // w2
  per_layer("ffn_up.weight", {hidden, dim});    // w3
  add("output_norm.weight", {dim}, take(dim));
  take(seq_len * head_size / 2);  // freq_cis_real: RoPE tables, recomputed at run time
  take(seq_len * head_size / 2);  // freq_cis_imag
  if (!shared_classifier) add("output.weight", {vocab, dim}, take(vocab * dim));
  m.weights.keep_alive(file);
  ModelDef::of(c).check_weights(m.weights);
  return m;
}

Llama2cVocab read_llama2c_tokenizer(const std::string& path) {
  const std::string bytes = read_text_file(path);
  auto bad = [&](const auto&... args) { fail("llama2.c tokenizer \"", path, "\": ", args...); };
  Llama2cVocab v;
  size_t pos = 0;
  auto read = [&](void* dst, size_t n, const char* what) {
    if (n > bytes.size() - pos) bad("file is truncated in ", what, " of token ", v.pieces.size());
    std::memcpy(dst, bytes.data() + pos, n);
    pos += n;
  };
  read(&v.max_token_length, 4, "the header");
  if (v.max_token_length <= 0) bad("max_token_length ", v.max_token_length, " must be positive");
  while (pos < bytes.size()) {
    float score;
    int32_t len;
    read(&score, 4, "the score");
    read(&len, 4, "the length");
    if (len < 0 || len > v.max_token_length)
      bad("token ", v.pieces.size(), " has length ", len, " (max_token_length ", v.max_token_length, ")");
    std::string piece(size_t(len), '\0');
    read(piece.data(), size_t(len), "the bytes");
    v.pieces.push_back(std::move(piece));
    v.scores.push_back(score);
  }
  if (v.pieces.empty()) bad("no tokens");
  return v;
}

}  // namespace serval
