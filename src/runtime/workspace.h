#pragma once
// Workspace: the activation buffers of one forward pass, for up to
// `capacity` tokens and `row_capacity` logits rows per step, reused across
// steps. x (the residual stream), rows and logits are f32; the rest is in the
// backend's activation dtype.
#include <cstdint>

#include "model/model_config.h"
#include "runtime/backend.h"

namespace serval {

struct Workspace {
  int64_t capacity = 0, row_capacity = 0;
  DeviceBuffer x, xn, q, k, v, attn, proj, gate, up, rows, logits;
  int64_t bytes = 0;

  // Whether a step of `tokens` tokens and `rows` logits rows fits.
  bool fits(int64_t tokens, int64_t rows) const { return tokens <= capacity && rows <= row_capacity; }
  // Reallocates for at least `tokens` and `rows`, growing by half at least;
  // the old buffers are freed first, so the device never holds both.
  void grow(const ModelConfig& cfg, Backend& be, int64_t tokens, int64_t rows);
};

}  // namespace serval
