// Paged KV cache on the CPU: writing new K/V through the slot mapping, and
// attention of each new token over its sequence's cached positions.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/cpu/cpu_backend.h"
#include "kv/kv_quant.h"

namespace serval {

void CpuBackend::kv_write(const Tensor& k, const Tensor& v, const int64_t* slot_mapping, const KvLayer& kv,
                          const KvGeometry& g) {
  const int64_t D = g.head_dim;
  const int64_t row = int64_t(g.num_kv_heads) * D;  // one slot holds all KV heads of a token
  if (kv_dtype_quantized(g.dtype)) {
    uint8_t* K = static_cast<uint8_t*>(kv.k.data());
    uint8_t* V = static_cast<uint8_t*>(kv.v.data());
    const float* scales = static_cast<const float*>(kv.scales.data());  // K's, then V's
    for (int64_t t = 0; t < k.rows; ++t) {
      const int64_t slot = slot_mapping[t];
      for (int64_t h = 0; h < g.num_kv_heads; ++h) {
        kv_quantize_row(g.dtype, f32(k) + t * row + h * D, scales[h], K + slot * row + h * D, D);
        kv_quantize_row(g.dtype, f32(v) + t * row + h * D, scales[g.num_kv_heads + h], V + slot * row + h * D, D);
      }
    }
    return;
  }
  float* K = static_cast<float*>(kv.k.data());
  float* V = static_cast<float*>(kv.v.data());
  for (int64_t t = 0; t < k.rows; ++t) {
    const int64_t slot = slot_mapping[t];
    std::memcpy(K + slot * row, f32(k) + t * row, size_t(row) * sizeof(float));
    std::memcpy(V + slot * row, f32(v) + t * row, size_t(row) * sizeof(float));
  }
}

// Blocks move as bytes, whatever their element type (quantized pools share
// one scale per head across all blocks, so a copied block reads the same).
void CpuBackend::copy_kv_block(const KvLayer& kv, const KvGeometry& g, int64_t src, int64_t dst) {
  const int64_t block = dtype_bytes(g.dtype, int64_t(g.block_size) * g.num_kv_heads * g.head_dim);
  char* K = static_cast<char*>(kv.k.data());
  char* V = static_cast<char*>(kv.v.data());
  std::memcpy(K + dst * block, K + src * block, size_t(block));
  std::memcpy(V + dst * block, V + src * block, size_t(block));
}

namespace {

// One KV head's row of one slot as f32: the pool's own floats, or its codes
// dequantized into `buf`.
const float* kv_row(const void* pool, DType dtype, int64_t offset, float scale, int64_t D, float* buf) {
  if (!kv_dtype_quantized(dtype)) return static_cast<const float*>(pool) + offset;
  kv_dequantize_row(dtype, static_cast<const uint8_t*>(pool) + offset, scale, buf, D);
  return buf;
}

}  // namespace

void CpuBackend::paged_attention(const Tensor& q, const KvLayer& kv, const KvGeometry& g, const BatchView& b,
                                 int32_t num_heads, float scale, Tensor out) {
  const int64_t D = g.head_dim;
  const int64_t kv_heads = g.num_kv_heads;
  const int64_t group = num_heads / kv_heads;  // query heads per KV head (GQA)
  const int64_t slot_stride = kv_heads * D;
  const int64_t bs = g.block_size;
  const bool quantized = kv_dtype_quantized(g.dtype);
  const float* scales = quantized ? static_cast<const float*>(kv.scales.data()) : nullptr;  // K's, then V's
  const float* Q = f32(q);
  float* O = f32(out);

  // Scores of one token for one GQA group: group x context floats per thread.
  const size_t need = size_t(group) * size_t(b.max_context_len);
  for (auto& s : scores_)
    if (s.size() < need) s.resize(need);

  const int64_t work = int64_t(b.num_tokens) * kv_heads;
  // Waking threads costs microseconds: only worth it above ~64K multiply-adds.
  const bool parallel = work > 1 && int64_t(b.num_tokens) * b.max_context_len * num_heads * D > 65536;
#pragma omp parallel for num_threads(threads_) schedule(dynamic, 1) if (parallel)
  for (int64_t item = 0; item < work; ++item) {
    const int64_t t = item / kv_heads;
    const int64_t kvh = item % kv_heads;
    // The sequence owning token t: the last s with query_start[s] <= t.
    const int32_t* qs_end = b.query_start + b.num_seqs + 1;
    const int64_t s = (std::upper_bound(b.query_start, qs_end, int32_t(t)) - b.query_start) - 1;
    const int32_t* table = b.block_table + s * b.max_blocks_per_seq;
    // Causal: positions first..p, where a sliding window starts `first` at p + 1 - window.
    const int64_t end = int64_t(b.positions[t]) + 1;
    const int64_t first = g.window > 0 ? std::max<int64_t>(0, end - g.window) : 0;
    const int64_t n_ctx = end - first;
    float* scores = scores_[omp_get_thread_num()].data();
    const float k_scale = quantized ? scales[kvh] : 1.0f, v_scale = quantized ? scales[kv_heads + kvh] : 1.0f;
    std::vector<float> row_buf(quantized ? size_t(D) : 0);  // a dequantized K or V row

    // scores[h][j] = q_h . k_(first + j) * scale
    for (int64_t j = 0; j < n_ctx; ++j) {
      const int64_t pos = first + j;
      const int64_t slot = int64_t(table[pos / bs]) * bs + pos % bs;
      const float* kj = kv_row(kv.k.data(), g.dtype, slot * slot_stride + kvh * D, k_scale, D, row_buf.data());
      for (int64_t h = 0; h < group; ++h) {
        const float* qh = Q + t * num_heads * D + (kvh * group + h) * D;
        // Fixed order: a token's scores must not depend on where its q row sits.
        scores[h * n_ctx + j] = dot_fixed_order(qh, kj, D) * scale;
      }
    }
    // softmax over j, then out_h = sum_j p_j v_j
    for (int64_t h = 0; h < group; ++h) {
      float* sc = scores + h * n_ctx;
      const float mx = *std::max_element(sc, sc + n_ctx);
      double sum = 0;
      for (int64_t j = 0; j < n_ctx; ++j) {
        sc[j] = std::exp(sc[j] - mx);
        sum += sc[j];
      }
      const float inv = float(1.0 / sum);
      for (int64_t j = 0; j < n_ctx; ++j) sc[j] *= inv;
      float* oh = O + t * num_heads * D + (kvh * group + h) * D;
      std::fill(oh, oh + D, 0.0f);
    }
    for (int64_t j = 0; j < n_ctx; ++j) {
      const int64_t pos = first + j;
      const int64_t slot = int64_t(table[pos / bs]) * bs + pos % bs;
      const float* vj = kv_row(kv.v.data(), g.dtype, slot * slot_stride + kvh * D, v_scale, D, row_buf.data());
      for (int64_t h = 0; h < group; ++h) {
        const float p = scores[h * n_ctx + j];
        float* oh = O + t * num_heads * D + (kvh * group + h) * D;
#pragma omp simd
        for (int64_t d = 0; d < D; ++d) oh[d] += p * vj[d];
      }
    }
  }
}

}  // namespace serval
