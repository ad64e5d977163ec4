#pragma once
// ModelConfig: the hyperparameters of a Llama-family decoder, read from GGUF
// metadata or a Hugging Face config.json. Everything the forward pass needs to
// know about the architecture is here; the forward pass has no per-model code.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "model/linear.h"

namespace serval {

// How RoPE pairs the dimensions of a head.
//  Interleaved: (x[2i], x[2i+1]) rotate together (llama2.c, llama.cpp's GGUF "llama").
//  Neox:        (x[i], x[i + d/2]) rotate together (Hugging Face, GGUF qwen2/qwen3).
enum class RopeStyle { Interleaved, Neox };

struct RopeScaling {
  enum class Type { None, Linear, Llama3 } type = Type::None;
  float factor = 1.0f;
  // Llama 3.1 "llama3" scaling.
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  int64_t original_max_position = 8192;
};

struct ModelConfig {
  std::string architecture;  // "llama", "mistral", "qwen2", "qwen3" (model_def.h's families)
  std::string name;          // human-readable, may be empty
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;        // may differ from hidden_size / num_heads (qwen3)
  int64_t rope_dim = 0;        // rotated dimensions per head (== head_dim for these archs)
  int64_t max_position = 0;    // context length
  float rms_eps = 1e-5f;
  float rope_theta = 10000.0f;
  RopeStyle rope_style = RopeStyle::Neox;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // q/k/v projections have a bias (qwen2)
  bool qk_norm = false;         // per-head RMSNorm on q and k before RoPE (qwen3)
  // Sliding-window attention (mistral; qwen2/qwen3 with use_sliding_window):
  // a query attends to the `sliding_window` latest positions; 0: no window.
  int64_t sliding_window = 0;
  // Which layers slide: those from this index on (qwen2's max_window_layers),
  // unless `sliding_layers` lists every layer (config.json's layer_types; 1: sliding).
  int64_t sliding_window_from_layer = 0;
  std::vector<uint8_t> sliding_layers;
  // A quantized Hugging Face checkpoint (model/hf_quant.h): its
  // quantization_config's quant_method ("fp8", "compressed-tensors", "awq",
  // "gptq"; empty: none), what it asks for in words (announced at start-up),
  // and the [rows, cols] of its FP8 weights' scale blocks (0: scales per
  // tensor or per output row).
  std::string quant_method, quant_summary;
  int64_t fp8_block_rows = 0, fp8_block_cols = 0;
  // KV scales in the checkpoint (model/kv_checkpoint_scales.h) are for codes
  // up to this: 448 (fp8, also when no kv_cache_scheme says, as vLLM reads
  // them) or 127 (an int8 kv_cache_scheme).
  float kv_scale_code_max = 448.0f;
  // Serval's own quantized GGUF (model/gguf_linear_formats.h): the format of
  // each weight stored in one (int8, int4, fp8), by tensor name.
  std::map<std::string, LinearFormat> linear_formats;

  int64_t q_dim() const { return num_heads * head_dim; }
  int64_t kv_dim() const { return num_kv_heads * head_dim; }
  // Throws serval::Error naming the first inconsistent field.
  void validate() const;
};

// The architectures the forward pass implements.
inline constexpr const char* kSupportedArchitectures = "llama, mistral, qwen2, qwen3";
// Throws `architecture "NAME" is not supported (supported: llama, mistral, qwen2, qwen3)`.
void check_architecture_supported(const std::string& name);

}  // namespace serval
