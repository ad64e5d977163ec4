#pragma once
// ModelDef: what a model family is made of, block by block. One definition
// per family (llama, mistral, qwen2, qwen3); the forward pass
// (runtime/forward_pass.h) is written once against it. It owns the tensor
// names and shapes, which attention each layer runs (full or a sliding
// window) and so what its KV cache holds, and the host-side transforms of
// loading (the q/k row permutation; which norms fold into which matrices).
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "model/kv_spec.h"
#include "model/linear.h"
#include "model/model_config.h"
#include "model/weights.h"

namespace serval {

// llama.cpp's tensor of per-frequency RoPE divisors (llama3 scaling), which
// the runtime divides the frequencies by.
inline constexpr const char* kRopeFreqsTensor = "rope_freqs.weight";

// Self-attention with rotary positions. Room for other kinds (latent attention).
struct AttentionDef {
  int64_t num_heads = 0, num_kv_heads = 0, head_dim = 0;
  // A query attends to the `window` latest positions, itself included (a
  // sliding window, Mistral's and Qwen2's); 0: to every position before it.
  int64_t window = 0;
  bool qkv_bias = false;  // q/k/v projections add a bias (qwen2)
  bool qk_norm = false;   // per-head RMSNorm of q and k before RoPE (qwen3)
};

// The feed-forward block. Room for routed experts (MoE).
struct MlpDef {
  enum class Kind : uint8_t { GatedSilu };  // down(silu(gate(x)) * up(x))
  Kind kind = Kind::GatedSilu;
  int64_t intermediate = 0;
};

// One decoder layer: x += attention(norm(x)); x += mlp(norm(x)).
struct LayerDef {
  AttentionDef attention;
  MlpDef mlp;
};

struct TensorSpec {
  std::string name;            // GGUF name (weights.h)
  std::vector<int64_t> shape;  // outermost first
};

// One layer's weights as loaded on the host, transforms applied: views of
// the WeightStore, or of copies this object owns (permuted q/k rows).
struct LayerWeights {
  TensorView attn_norm, ffn_norm;
  Linear q, k, v, o, gate, up, down;
  std::optional<TensorView> q_bias, k_bias, v_bias;  // AttentionDef::qkv_bias
  std::optional<TensorView> q_norm, k_norm;          // AttentionDef::qk_norm
  std::vector<std::vector<uint8_t>> owned;
};

// The names under which a loader stores a quantized weight's tensors beside
// "blk.0.attn_q.weight": its f32 scales under quant_scale_name ("..._scale"):
// FP8 [1] per tensor, [out] per output row, or one per block of
// ModelConfig::fp8_block_rows x fp8_block_cols; int8 [out]; int4 [out, in / g].
// An int4 weight (Int4Grouped) is not under the weight's own name: its packed
// nibbles [out, in / 2] (I8) are under int4_weight_name ("..._int4"), its f32
// zero points [out, in / g], when asymmetric, under int4_zero_name ("..._zero").
std::string quant_scale_name(const std::string& weight_name);
std::string int4_weight_name(const std::string& weight_name);
std::string int4_zero_name(const std::string& weight_name);
// The Linear of the [out, in] matrix `name` in `store`: its tensor's own
// format; Fp8 or Int8PerChannel with its scales where the tensor is FP8 e4m3
// or I8; Int4Grouped where int4_weight_name is present.
Linear load_linear(const WeightStore& store, const ModelConfig& config, const std::string& name, int64_t out,
                   int64_t in);

// Whether to load a Neox model's q/k rows permuted to adjacent pairs
// (WeightTransforms::permute_rope). Auto: where the backend prefers them.
enum class RopePermute : uint8_t { Auto, On, Off };

// What loading does to the checkpoint's tensors.
struct WeightTransforms {
  // Load a Neox model's q/k rows (weights, biases, q/k norms) in adjacent-pair
  // order (model/qk_permute.h): the layout fused rope kernels take. Every
  // head permuted alike leaves attention's scores unchanged.
  bool permute_rope = false;
};

class ModelDef {
 public:
  // The definition of config.architecture's family; throws serval::Error
  // naming an unsupported one.
  static ModelDef of(const ModelConfig& config);

  const ModelConfig& config() const { return cfg_; }
  const std::string& family() const { return cfg_.architecture; }
  int64_t num_layers() const { return cfg_.num_layers; }
  LayerDef layer(int64_t l) const;

  // Every tensor the forward pass reads, with its shape: the globals first,
  // then layer by layer (so that a check stopping at the first missing
  // tensor stays cheap when a hostile config claims millions of layers).
  void for_each_tensor(const std::function<void(const TensorSpec&)>& fn) const;
  std::vector<TensorSpec> tensors() const;
  // Throws `missing tensor "NAME"` or `tensor "NAME" has shape [..], expected
  // [..]`; an optional rope_freqs.weight must have rope_dim / 2 elements.
  void check_weights(const WeightStore& weights) const;

  // What layer l's KV cache holds, its elements in `dtype`.
  KvLayerSpec kv_spec(int64_t l, DType dtype) const;
  // K and V of one token in every layer, elements in `dtype`.
  int64_t kv_bytes_per_token(DType dtype) const;
  // The widest window of any layer, 0 when a layer attends to everything:
  // KV blocks older than it are read by no layer.
  int64_t widest_window() const;

  // Layer l's weights from `store`, as the transforms ask.
  LayerWeights load_layer(const WeightStore& store, int64_t l, const WeightTransforms& tf) const;
  // The token embedding [vocab, hidden] and the final norm [hidden].
  TensorView embedding(const WeightStore& store) const;
  TensorView final_norm(const WeightStore& store) const;
  // The LM head; none when the embeddings are tied (the embedding serves).
  std::optional<Linear> lm_head(const WeightStore& store) const;
  // The formats the checkpoint stores each class of weight matrix in:
  // "attention int4 g128 asym, MLP int4 g128 asym + int8 per channel, LM head int8 per channel".
  std::string stored_formats(const WeightStore& store) const;

 private:
  explicit ModelDef(const ModelConfig& config) : cfg_(config) {}
  ModelConfig cfg_;
};

}  // namespace serval
