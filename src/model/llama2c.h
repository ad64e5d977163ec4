#pragma once
// llama2.c legacy checkpoints (Karpathy's run.c format, e.g. stories260K.bin):
//   7 x int32: dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len
//   (vocab_size < 0 means the classifier is stored separately, not tied),
//   then float32 weights: token_embedding [vocab, dim], rms_att [L, dim],
//   wq [L, dim, dim], wk [L, kv_dim, dim], wv [L, kv_dim, dim], wo [L, dim, dim],
//   rms_ffn [L, dim], w1 [L, hidden, dim], w2 [L, dim, hidden], w3 [L, hidden, dim],
//   rms_final [dim], freq_cis_real/imag [seq_len, head_size / 2] (skipped),
//   wcls [vocab, dim] when not tied.
// and its tokenizer.bin: int32 max_token_length, then per token
//   float32 score, int32 length, bytes.
#include <string>
#include <vector>

#include "model/model_loader.h"

namespace serval {

// Weights are views into the mmap'd file under GGUF names; RoPE is Interleaved
// (llama2.c rotates adjacent pairs), arch "llama", theta 10000, eps 1e-5.
LoadedModel load_llama2c_model(const std::string& path);

struct Llama2cVocab {
  int32_t max_token_length = 0;
  std::vector<std::string> pieces;  // raw bytes as stored (" t", "\n<s>\n", "<0x0A>")
  std::vector<float> scores;
};
Llama2cVocab read_llama2c_tokenizer(const std::string& path);

}  // namespace serval
