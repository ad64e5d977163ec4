#pragma once
// The CPU backend: f32 activations, weights and KV cache; OpenBLAS for matmuls,
// OpenMP for everything else. It is the reference backend: its math follows
// Hugging Face transformers in f32.
#include <vector>

#include "runtime/backend.h"

namespace serval {

// A weight converted to f32, row-major in its outermost-first shape.
class CpuWeight : public DeviceWeight {
 public:
  CpuWeight(std::string name, std::vector<int64_t> shape, std::vector<float> values);
  const float* data() const { return values_.data(); }

 private:
  std::vector<float> values_;
};

class CpuBackend : public Backend {
 public:
  // threads 0: all cores.
  explicit CpuBackend(int threads);

  std::string name() const override { return "cpu"; }
  DType act_dtype() const override { return DType::F32; }
  DType kv_dtype() const override { return DType::F32; }
  int threads() const override { return threads_; }
  // Batch-invariant mode: every matmul row is one fixed-order dot product
  // (dot_fixed_order) instead of the streaming kernel or sgemm by batch size.
  void set_batch_invariant(bool on) override { batch_invariant_ = on; }

  DeviceBuffer alloc(int64_t bytes) override;
  void copy_to_device(void* dst, const void* src, int64_t bytes) override;
  void copy_to_host(void* dst, const void* src, int64_t bytes) override;
  void tensor_to_host(const Tensor& t, float* dst) override;
  void synchronize() override {}
  void memory_info(int64_t& free_bytes, int64_t& total_bytes) override;

  std::unique_ptr<DeviceWeight> upload_weight(const TensorView& view) override;
  KvLayer alloc_kv_layer(const KvGeometry& geom) override;

  void embedding(const DeviceWeight& table, const int32_t* ids, const TokenFeed& feed, Tensor out) override;
  void matmul(const Tensor& x, const DeviceWeight& w, const DeviceWeight* bias, Tensor y) override;
  void rmsnorm(const Tensor& x, const DeviceWeight& w, float eps, Tensor out) override;
  void add_rmsnorm(Tensor residual, const Tensor& delta, const DeviceWeight& w, float eps, Tensor out) override;
  void add(Tensor x, const Tensor& delta) override;
  void rope(Tensor q, Tensor k, const int32_t* positions, const RopeParams& rope) override;
  void copy_kv_block(const KvLayer& kv, const KvGeometry& geom, int64_t src, int64_t dst) override;
  void kv_write(const Tensor& k, const Tensor& v, const int64_t* slot_mapping, const KvLayer& kv,
                const KvGeometry& geom) override;
  void paged_attention(const Tensor& q, const KvLayer& kv, const KvGeometry& geom, const BatchView& batch,
                       int32_t num_heads, float scale, Tensor out) override;
  void silu_mul(const Tensor& gate, const Tensor& up, Tensor out) override;
  void gather_rows(const Tensor& x, const int32_t* rows, Tensor out) override;
  // The host Sampler over each row (the logits are already host memory).
  void sample(const Tensor& logits, std::span<const SampleSpec> specs, std::vector<SampleResult>& out) override;

 private:
  int threads_;
  bool batch_invariant_ = false;
  Sampler sampler_;
  // Per-thread attention scores, grown to the longest context seen.
  std::vector<std::vector<float>> scores_;
};

// sum_i a[i] * b[i] in an order fixed by n alone (16 running sums, then a
// fixed tree), whatever the pointers' alignment: the same bits for the same
// values wherever they sit in memory.
float dot_fixed_order(const float* a, const float* b, int64_t n);

// Checked downcasts (a weight of another backend is a programming error).
const CpuWeight& as_cpu(const DeviceWeight& w);
inline float* f32(const Tensor& t) { return static_cast<float*>(t.data); }

}  // namespace serval
