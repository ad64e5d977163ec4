#include "model/model_config.h"

#include "core/error.h"

namespace serval {

void check_architecture_supported(const std::string& name) {
  if (name == "llama" || name == "mistral" || name == "qwen2" || name == "qwen3") return;
  fail("architecture \"", name, "\" is not supported (supported: ", kSupportedArchitectures, ")");
}

void ModelConfig::validate() const {
  check_architecture_supported(architecture);
  auto positive = [](int64_t v, const char* field) {
    SERVAL_CHECK(v > 0, "model config: ", field, " must be positive, got ", v);
  };
  positive(vocab_size, "vocab_size");
  positive(hidden_size, "hidden_size");
  positive(intermediate_size, "intermediate_size");
  positive(num_layers, "num_layers");
  positive(num_heads, "num_heads");
  positive(num_kv_heads, "num_kv_heads");
  positive(head_dim, "head_dim");
  positive(max_position, "max_position");
  SERVAL_CHECK(num_heads % num_kv_heads == 0, "model config: num_heads (", num_heads,
               ") must be a multiple of num_kv_heads (", num_kv_heads, ")");
  SERVAL_CHECK(rope_dim > 0 && rope_dim <= head_dim && rope_dim % 2 == 0,
               "model config: rope_dim ", rope_dim, " must be even and at most head_dim ", head_dim);
  SERVAL_CHECK(rms_eps > 0, "model config: rms_eps must be positive");
  SERVAL_CHECK(rope_theta > 0, "model config: rope_theta must be positive");
  SERVAL_CHECK(sliding_window >= 0 && sliding_window_from_layer >= 0, "model config: sliding_window (",
               sliding_window, ") and its first layer (", sliding_window_from_layer, ") must not be negative");
  SERVAL_CHECK(sliding_layers.empty() || int64_t(sliding_layers.size()) == num_layers, "model config: ",
               sliding_layers.size(), " layer types for ", num_layers, " layers");
}

}  // namespace serval
