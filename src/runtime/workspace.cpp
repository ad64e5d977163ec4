#include "runtime/workspace.h"

#include <algorithm>

namespace serval {

void Workspace::grow(const ModelConfig& cfg, Backend& be, int64_t tokens, int64_t rows) {
  const int64_t T = std::max(tokens, capacity * 3 / 2);
  const int64_t R = std::max({rows, row_capacity * 3 / 2, int64_t(1)});
  const DType a = be.act_dtype();
  Workspace& ws = *this;
  ws = Workspace{};  // free the old buffers first
  int64_t bytes = 0;
  auto buf_bytes = [&](int64_t b) {
    bytes += b;
    return be.alloc(b);
  };
  auto buf = [&](int64_t n, DType dt) { return buf_bytes(dtype_bytes(dt, n)); };
  ws.x = buf(T * cfg.hidden_size, DType::F32);
  ws.xn = buf(T * cfg.hidden_size, a);
  // q, k, v back to back, and gate, up: with weights laid out alike
  // (upload_weight_group) a backend may write several in one batched product.
  // Each part starts at a 256-byte boundary, as an allocation of its own would
  // (cuBLASLt assumes that alignment).
  auto aligned = [](int64_t b) { return (b + 255) / 256 * 256; };
  const int64_t q_bytes = dtype_bytes(a, T * cfg.q_dim()), kv_bytes = dtype_bytes(a, T * cfg.kv_dim());
  const DeviceBuffer qkv = buf_bytes(aligned(q_bytes) + 2 * aligned(kv_bytes));
  ws.q = qkv.slice(0, q_bytes);
  ws.k = qkv.slice(aligned(q_bytes), kv_bytes);
  ws.v = qkv.slice(aligned(q_bytes) + aligned(kv_bytes), kv_bytes);
  ws.attn = buf(T * cfg.q_dim(), a);
  ws.proj = buf(T * cfg.hidden_size, a);
  const int64_t ffn_bytes = dtype_bytes(a, T * cfg.intermediate_size);
  const DeviceBuffer gate_up = buf_bytes(2 * aligned(ffn_bytes));
  ws.gate = gate_up.slice(0, ffn_bytes);
  ws.up = gate_up.slice(aligned(ffn_bytes), ffn_bytes);
  ws.rows = buf(R * cfg.hidden_size, DType::F32);
  // Logits are f32 on every backend: the LM head accumulates in f32 and
  // rounding them to a bf16 activation would only lose precision.
  ws.logits = buf(R * cfg.vocab_size, DType::F32);
  ws.capacity = T;
  ws.row_capacity = R;
  ws.bytes = bytes;
}

}  // namespace serval
