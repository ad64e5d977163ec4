// CudaBackend: weight upload, KV pools, and the ops its parts serve.

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_gate_up_layout.cuh"
#include "kv/kv_quant.h"

namespace serval::cuda {

CudaWeight::CudaWeight(std::string name, std::vector<int64_t> shape, DType dtype, DeviceBuffer buf,
                       const void* group)
    : dtype_(dtype), buf_(std::move(buf)), group_(group) {
  name_ = std::move(name);
  shape_ = std::move(shape);
}

const CudaWeight& as_cuda(const DeviceWeight& w) {
  auto* cw = dynamic_cast<const CudaWeight*>(&w);
  SERVAL_CHECK(cw != nullptr, "weight \"", w.name(), "\" was not uploaded to the CUDA backend");
  return *cw;
}

CudaBackend::CudaBackend(int device, DType act_dtype, const CudaTuning& tuning)
    : cfg_{act_dtype, tuning, false},
      keep_blocks_(tuning.packed_blocks == CudaTuning::PackedBlocks::kOn),
      dev_(device), matmul_(dev_, cfg_), attention_(dev_, cfg_), sampler_(dev_) {
  SERVAL_CHECK(act_dtype == DType::BF16 || act_dtype == DType::F32, "cuda backend: computes in bf16 or f32, not ",
               dtype_name(act_dtype));
  cfg_.tuning.cutlass_gemm = tuning.cutlass_gemm && cutlass_gemm_built();
}

// Queued work may still read the buffers the parts free (no throwing from a destructor).
CudaBackend::~CudaBackend() {
  cudaSetDevice(dev_.index());
  cudaStreamSynchronize(dev_.stream());
}

void CudaBackend::set_batch_invariant(bool on) {
  SERVAL_CHECK(!on || cfg_.act_dtype == DType::BF16, "--batch-invariant on the GPU needs bfloat16 activations (in ",
               "float32 every matmul goes through cuBLASLt, whose kernels change with the batch size)");
  cfg_.batch_invariant = on;
}

// The backend's dtype of a weight (matrices in the activation dtype, vectors
// f32) and its element count, after checking the view.
DType CudaBackend::weight_target(const TensorView& view, int64_t& n) const {
  SERVAL_CHECK(view.shape.size() == 1 || view.shape.size() == 2, "tensor \"", view.name, "\" has ",
               view.shape.size(), " dimensions; the CUDA backend takes vectors and matrices");
  n = 1;
  for (int64_t d : view.shape) n *= d;
  SERVAL_CHECK(view.data != nullptr || n == 0, "tensor \"", view.name, "\" has no data");
  return view.shape.size() == 2 ? cfg_.act_dtype : DType::F32;
}

// Writes `view`, converted to `target`, to device memory at dst.
void CudaBackend::upload_into(const TensorView& view, DType target, int64_t n, void* dst_mem) {
  if (view.dtype == target) {
    dev_.copy_to_device(dst_mem, view.data, dtype_bytes(target, n));
    return;
  }
  // Convert on the host in block-aligned chunks, through f32.
  const int64_t block = dtype_block_elems(view.dtype);
  const int64_t chunk = std::max<int64_t>(block, (int64_t(1) << 22) / block * block);
  std::vector<float> f(size_t(std::min(chunk, n)));
  std::vector<uint16_t> h(target == DType::BF16 ? f.size() : 0);
  const auto* src = static_cast<const uint8_t*>(view.data);
  char* dst = static_cast<char*>(dst_mem);
  for (int64_t start = 0; start < n; start += chunk) {
    const int64_t len = std::min(chunk, n - start);
    to_f32(view.dtype, src + dtype_bytes(view.dtype, start), f.data(), len);
    if (target == DType::BF16) {
#pragma omp parallel for schedule(static) if (len > (1 << 16))
      for (int64_t i = 0; i < len; ++i) h[size_t(i)] = f32_to_bf16(f[size_t(i)]);
      dev_.copy_to_device(dst + start * 2, h.data(), len * 2);
    } else {
      dev_.copy_to_device(dst + start * 4, f.data(), len * 4);
    }
  }
}

std::unique_ptr<DeviceWeight> CudaBackend::upload_weight(const TensorView& view) {
  int64_t n = 0;
  const DType target = weight_target(view, n);
  DeviceBuffer buf = dev_.alloc(dtype_bytes(target, n));
  upload_into(view, target, n, buf.data());
  auto w = std::make_unique<CudaWeight>(view.name, view.shape, target, std::move(buf));
  if (view.shape.size() == 1) {  // a norm of ones (the runner's, after folding) changes nothing
    std::vector<float> f(static_cast<size_t>(n));
    to_f32(view.dtype, view.data, f.data(), n);
    w->set_unit(n > 0 && std::all_of(f.begin(), f.end(), [](float v) { return v == 1.0f; }));
  }
  return w;
}

// auto (the runner's keep_linear_formats) packs only the forms measured on a
// GPU so far, GGUF Q4_0 and Q8_0; the others (Q4_1, Q4_K, Q5_K, int4, int8)
// go packed where packed_blocks is on.
bool CudaBackend::keeps_linear_format(const LinearFormat& f) const {
  const bool measured = f.kind == LinearFormat::Kind::GgufBlock && (f.dtype == DType::Q4_0 || f.dtype == DType::Q8_0);
  return keep_blocks_ && cfg_.act_dtype == DType::BF16 && GpuBlockPack::packs(f) &&
         (measured || cfg_.tuning.packed_blocks == CudaTuning::PackedBlocks::kOn);
}

namespace {

// An int8 per channel matrix whose width is not whole groups of 32 columns
// (stories260K's FFN, 172 wide) has no packed layout: it goes up dense.
bool packs_shape(const Linear& w) {
  return w.format.kind != LinearFormat::Kind::Int8PerChannel || w.in % GpuBlockPack::kGroup == 0;
}

}  // namespace

std::unique_ptr<DeviceWeight> CudaBackend::upload_kept_linear(const Linear& w) {
  SERVAL_CHECK(keeps_linear_format(w.format) && w.shard.is_whole(), "cuda backend: \"", w.name, "\" (",
               w.format.describe(), ") is not a format it keeps");
  w.validate();
  if (!packs_shape(w)) {
    std::vector<float> dense = dequantize_linear(w);
    return upload_weight(TensorView{w.name, DType::F32, {w.out, w.in}, dense.data(), int64_t(dense.size() * 4)});
  }
  const GpuBlockPack pack = GpuBlockPack::of(w.format, w.out, w.in);
  const std::vector<uint8_t> host = pack_linear(pack, w);
  DeviceBuffer buf = dev_.alloc(pack.total_bytes());
  dev_.copy_to_device(buf.data(), host.data(), pack.total_bytes());
  // The dtype of GGUF blocks; I8 for Serval's int4 and int8 (packed() says which form).
  const DType dtype = w.format.kind == LinearFormat::Kind::GgufBlock ? w.format.dtype : DType::I8;
  auto out = std::make_unique<CudaWeight>(w.name, std::vector<int64_t>{w.out, w.in}, dtype, std::move(buf));
  out->set_packed(pack);
  return out;
}

int64_t CudaBackend::linear_device_bytes(const Linear& w) const {
  if (keeps_linear_format(w.format) && packs_shape(w)) return GpuBlockPack::of(w.format, w.out, w.in).total_bytes();
  return Backend::linear_device_bytes(w);
}

// One allocation, each weight at a 256-byte boundary after the one before:
// weights of one shape then lie at one stride, which matmul_multi reads as a
// strided batch.
std::vector<std::unique_ptr<DeviceWeight>> CudaBackend::upload_weight_group(const std::vector<TensorView>& views) {
  struct Part {
    DType target;
    int64_t n, offset;
  };
  std::vector<Part> parts;
  int64_t total = 0;
  for (const TensorView& v : views) {
    Part part{};
    part.target = weight_target(v, part.n);
    part.offset = total;
    total += (dtype_bytes(part.target, part.n) + 255) / 256 * 256;
    parts.push_back(part);
  }
  const DeviceBuffer whole = dev_.alloc(total);
  std::vector<std::unique_ptr<DeviceWeight>> out;
  for (size_t i = 0; i < views.size(); ++i) {
    const Part& part = parts[i];
    DeviceBuffer mem = whole.slice(part.offset, dtype_bytes(part.target, part.n));
    upload_into(views[i], part.target, part.n, mem.data());
    out.push_back(
        std::make_unique<CudaWeight>(views[i].name, views[i].shape, part.target, std::move(mem), whole.data()));
  }
  return out;
}

// Each matrix goes up as it is, into staging, then into its rows of the pair
// (one strided device copy: 8 rows at a stride of 16).
std::vector<std::unique_ptr<DeviceWeight>> CudaBackend::upload_gated_pair(const TensorView& gate,
                                                                          const TensorView& up) {
  int64_t n = 0, n_up = 0;
  const bool fits = cfg_.tuning.gate_up_interleaved && weight_target(gate, n) == DType::BF16 &&
                    weight_target(up, n_up) == DType::BF16 && gate.shape.size() == 2 && up.shape == gate.shape &&
                    gate.shape[0] % kGateUpGroupRows == 0;
  if (!fits) return upload_weight_group({gate, up});
  const int64_t rows = gate.shape[0], cols = gate.shape[1], bytes = n * 2;
  const size_t group = size_t(kGateUpGroupRows * cols * 2);
  const DeviceBuffer whole = dev_.alloc(2 * bytes);
  {
    DeviceBuffer staging = dev_.alloc(bytes);
    for (int i = 0; i < 2; ++i) {
      upload_into(i == 0 ? gate : up, DType::BF16, n, staging.data());
      SERVAL_CUDA_CHECK(cudaMemcpy2DAsync(static_cast<char*>(whole.data()) + i * group, 2 * group, staging.data(),
                                          group, group, size_t(rows / kGateUpGroupRows), cudaMemcpyDeviceToDevice,
                                          dev_.stream()));
      dev_.synchronize();  // before staging is written again (or freed)
    }
  }
  std::vector<std::unique_ptr<DeviceWeight>> out;
  for (int i = 0; i < 2; ++i) {
    const TensorView& v = i == 0 ? gate : up;
    auto w = std::make_unique<CudaWeight>(v.name, v.shape, DType::BF16,
                                          whole.slice(int64_t(i * group), 2 * bytes - int64_t(i * group)),
                                          whole.data());
    w->set_interleaved();
    out.push_back(std::move(w));
  }
  return out;
}

void CudaBackend::set_kv_dtype(DType t) {
  SERVAL_CHECK(t == cfg_.act_dtype || kv_dtype_quantized(t), "the cuda backend keeps its KV cache in ",
               dtype_name(cfg_.act_dtype), ", fp8_e4m3 or i8, not ", dtype_name(t), " (--kv-cache-dtype)");
  kv_dtype_ = t;
}

// Pools of the activation dtype, or of 1-byte codes with their scales (ones
// until the runner sets them) where the geometry asks for fp8 / int8.
KvLayer CudaBackend::alloc_kv_layer(const KvGeometry& g) {
  const DType elem = kv_dtype_quantized(g.dtype) ? g.dtype : cfg_.act_dtype;
  const int64_t bytes = dtype_bytes(elem, g.num_blocks * g.block_size * g.num_kv_heads * g.head_dim);
  KvLayer kv{dev_.alloc(bytes), dev_.alloc(bytes), {}};
  if (kv_dtype_quantized(g.dtype)) {
    const std::vector<float> ones(size_t(2 * g.num_kv_heads), 1.0f);
    kv.scales = dev_.alloc(int64_t(ones.size() * sizeof(float)));
    copy_to_device(kv.scales.data(), ones.data(), int64_t(ones.size() * sizeof(float)));
  }
  return kv;
}

void CudaBackend::copy_kv_block(const KvLayer& kv, const KvGeometry& g, int64_t src, int64_t dst) {
  dev_.bind();
  const DType elem = kv_dtype_quantized(g.dtype) ? g.dtype : cfg_.act_dtype;
  const int64_t block = dtype_bytes(elem, int64_t(g.block_size) * g.num_kv_heads * g.head_dim);
  for (const DeviceBuffer* pool : {&kv.k, &kv.v}) {
    char* base = static_cast<char*>(pool->data());
    SERVAL_CUDA_CHECK(cudaMemcpyAsync(base + dst * block, base + src * block, size_t(block),
                                      cudaMemcpyDeviceToDevice, dev_.stream()));
  }
}

void CudaBackend::matmul(const Tensor& x, const DeviceWeight& w, const DeviceWeight* bias, Tensor y) {
  dev_.bind();
  matmul_.matmul(x, as_cuda(w), bias ? &as_cuda(*bias) : nullptr, y);
}

void CudaBackend::matmul_multi(const Tensor& x, const std::vector<const DeviceWeight*>& ws,
                               const std::vector<Tensor>& ys) {
  dev_.bind();
  matmul_.matmul_multi(x, ws, ys);
}

NormedRows CudaBackend::matmul_add_rmsnorm(const Tensor& x, const DeviceWeight& w, Tensor proj, Tensor residual,
                                           const DeviceWeight& norm, float eps, Tensor out) {
  dev_.bind();
  if (auto fused = matmul_.matmul_add_rmsnorm(x, as_cuda(w), residual, as_cuda(norm), eps, out)) return *fused;
  return Backend::matmul_add_rmsnorm(x, w, proj, residual, norm, eps, out);
}

Tensor CudaBackend::finish_norm(NormedRows& x) {
  dev_.bind();
  return matmul_.finish_norm(x);
}

void CudaBackend::prepare_rope_angles(const int32_t* positions, int64_t tokens, const RopeParams& rope) {
  dev_.bind();
  matmul_.prepare_rope_angles(positions, tokens, rope);
}

void CudaBackend::qkv_rope_kv_write(const NormedRows& x, const DeviceWeight& wq, const DeviceWeight& wk,
                                    const DeviceWeight& wv, Tensor q, Tensor k, Tensor v, const int32_t* positions,
                                    const RopeParams& rope, const int64_t* slot_mapping, const KvLayer& kv,
                                    const KvGeometry& geom) {
  dev_.bind();
  // A quantized pool: the product, rope and kv_write apart (the fused epilogues write the activation dtype).
  if (!kv_dtype_quantized(geom.dtype) &&
      matmul_.qkv_rope_kv_write(x, as_cuda(wq), as_cuda(wk), as_cuda(wv), q, k, v, positions, rope, slot_mapping, kv,
                                geom))
    return;
  Backend::qkv_rope_kv_write(matmul_.normalized(x), wq, wk, wv, q, k, v, positions, rope, slot_mapping, kv, geom);
}

void CudaBackend::gated_mlp_up(const NormedRows& x, const DeviceWeight& gate, const DeviceWeight& up, Tensor gate_buf,
                               Tensor up_buf, Tensor out) {
  dev_.bind();
  if (matmul_.gated_mlp_up(x, as_cuda(gate), as_cuda(up), up_buf, out)) return;
  Backend::gated_mlp_up(matmul_.normalized(x), gate, up, gate_buf, up_buf, out);
}

}  // namespace serval::cuda

namespace serval {

std::unique_ptr<Backend> make_cuda_backend(int device, DType act_dtype, const CudaTuning& tuning) {
  return std::make_unique<cuda::CudaBackend>(device, act_dtype, tuning);
}

bool cuda_device_present() {
  int count = 0;
  const bool ok = cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
  cudaGetLastError();  // no device is not an error to keep
  return ok;
}

}  // namespace serval
