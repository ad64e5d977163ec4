#pragma once
// DeviceModel: a ModelDef's weights uploaded to one backend, layer by layer,
// with the definition's transforms applied (q/k rows permuted where the
// backend's fused rope kernels want adjacent pairs; each block's input norm
// folded into the matrices that read it where the backend folds norms), and
// the RoPE frequencies the attention blocks rotate with.
#include <memory>
#include <string>
#include <vector>

#include "model/model_def.h"
#include "runtime/backend.h"

namespace serval {

struct DeviceLayer {
  LayerDef def;
  std::unique_ptr<DeviceWeight> attn_norm, wq, wk, wv, wo, bq, bk, bv, q_norm, k_norm;
  std::unique_ptr<DeviceWeight> ffn_norm, gate, up, down;
};

class DeviceModel {
 public:
  // Throws serval::Error for missing or mis-shaped tensors.
  DeviceModel(const ModelDef& def, const WeightStore& weights, Backend& backend, RopePermute permute);

  const ModelDef& def() const { return def_; }
  const DeviceWeight& embedding() const { return *tok_embd_; }
  const DeviceWeight& final_norm() const { return *output_norm_; }
  // The LM head: output.weight, or the embedding when they are tied.
  const DeviceWeight& lm_head() const { return output_ ? *output_ : *tok_embd_; }
  const std::vector<DeviceLayer>& layers() const { return layers_; }
  // The norms the forward pass runs: ones where the backend folded their
  // weights into the matrices after them.
  const DeviceWeight& attn_norm(size_t l) const { return unit_norm_ ? *unit_norm_ : *layers_[l].attn_norm; }
  const DeviceWeight& ffn_norm(size_t l) const { return unit_norm_ ? *unit_norm_ : *layers_[l].ffn_norm; }
  const RopeParams& rope() const { return rope_; }
  // Device bytes of the uploaded weights, and of its matrices alone (the
  // linear layers and the LM head, as held: what a decode step streams).
  int64_t bytes() const { return bytes_ + matrix_bytes_; }
  int64_t matrix_bytes() const { return matrix_bytes_; }
  // The formats the backend holds each class of matrices in, for start-up:
  // "attention q4_0, MLP q4_0, LM head q4_0" (several where layers differ).
  std::string formats() const;

 private:
  void load_layers(const WeightStore& weights, Backend& be, const WeightTransforms& tf);
  void fold_norms(Backend& be);
  bool norm_readers_dense() const;
  void setup_rope(const WeightStore& weights, Backend& be, bool permuted);

  ModelDef def_;
  std::unique_ptr<DeviceWeight> tok_embd_, output_norm_, output_;  // output_ null when tied
  std::vector<DeviceLayer> layers_;
  std::unique_ptr<DeviceWeight> unit_norm_;  // ones, where norms were folded; else null
  DeviceBuffer inv_freq_;
  RopeParams rope_;
  int64_t bytes_ = 0, matrix_bytes_ = 0;
};

// Device bytes `def`'s weights will take on `backend` (DeviceModel::bytes()
// before uploading): matrices as Backend::linear_device_bytes, vectors f32.
int64_t planned_weight_bytes(const ModelDef& def, const WeightStore& weights, const Backend& backend);

}  // namespace serval
