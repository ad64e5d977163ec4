#pragma once
// The CPU backend: f32 activations, weights and KV cache; OpenBLAS for matmuls,
// OpenMP for everything else. It is the reference backend: its math follows
// Hugging Face transformers in f32.
#include <vector>

#include "model/linear.h"
#include "runtime/backend.h"

namespace serval {

// A weight converted to f32, row-major in its outermost-first shape.
class CpuWeight : public DeviceWeight {
 public:
  CpuWeight(std::string name, std::vector<int64_t> shape, std::vector<float> values);
  // A matrix kept in GGUF blocks of `dtype` (CpuBackend::keeps_linear_format).
  CpuWeight(std::string name, std::vector<int64_t> shape, DType dtype, std::vector<uint8_t> blocks);
  // The f32 values; null for a matrix kept in blocks.
  const float* data() const { return blocks_.empty() ? values_.data() : nullptr; }
  bool kept() const { return !blocks_.empty(); }
  DType block_dtype() const { return block_dtype_; }
  const uint8_t* blocks() const { return blocks_.data(); }

 private:
  std::vector<float> values_;
  DType block_dtype_ = DType::F32;
  std::vector<uint8_t> blocks_;
};

class CpuBackend : public Backend {
 public:
  // threads 0: all cores.
  explicit CpuBackend(int threads);

  std::string name() const override { return "cpu"; }
  DType act_dtype() const override { return DType::F32; }
  DType kv_dtype() const override { return kv_dtype_; }
  // F32, or FP8_E4M3 / I8 codes with per-head scales (kv/kv_quant.h).
  void set_kv_dtype(DType t) override;
  int threads() const override { return threads_; }
  // Batch-invariant mode: every matmul row is one fixed-order dot product
  // (dot_fixed_order) instead of the streaming kernel or sgemm by batch size.
  void set_batch_invariant(bool on) override { batch_invariant_ = on; }
  void set_matmul_observer(MatmulObserver* observer) override { observer_ = observer; }

  DeviceBuffer alloc(int64_t bytes) override;
  void copy_to_device(void* dst, const void* src, int64_t bytes) override;
  void copy_to_host(void* dst, const void* src, int64_t bytes) override;
  void tensor_to_host(const Tensor& t, float* dst) override;
  void synchronize() override {}
  void memory_info(int64_t& free_bytes, int64_t& total_bytes) override;

  std::unique_ptr<DeviceWeight> upload_weight(const TensorView& view) override;
  // GGUF block matrices stay in their blocks where the runner asks for it
  // (the f32 weights would take over half the memory): each matmul then
  // decodes the matrix into scratch and multiplies as the f32 path does, the
  // same bits, for a model several times the size the host could hold in f32.
  bool keeps_linear_format(const LinearFormat& format) const override {
    return keep_blocks_ && format.kind == LinearFormat::Kind::GgufBlock;
  }
  bool chooses_kept_formats() const override { return true; }
  void keep_linear_formats(bool on) override { keep_blocks_ = on; }
  std::unique_ptr<DeviceWeight> upload_kept_linear(const Linear& w) override;
  int64_t linear_device_bytes(const Linear& w) const override {
    return keeps_linear_format(w.format) ? w.weight.nbytes : Backend::linear_device_bytes(w);
  }
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
  // The f32 values of `w`: its own, or a kept matrix decoded into scratch_.
  const float* matrix_values(const CpuWeight& w);

  int threads_;
  DType kv_dtype_ = DType::F32;
  bool batch_invariant_ = false;
  bool keep_blocks_ = false;
  MatmulObserver* observer_ = nullptr;
  std::vector<float> scratch_;  // matrix_values' decoded matrix
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
