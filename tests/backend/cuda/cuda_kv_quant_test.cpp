// --kv-cache-dtype fp8|int8 on the CUDA backend: until its attention
// kernels read 1-byte pools, it refuses them at start-up with a message
// naming the flag, rather than run wrong; its own dtype stays accepted. Its
// kv_write already writes such pools (for a geometry of fp8 / int8): the
// codes equal the CPU backend's, byte for byte, and a block copy moves them.
// Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "core/error.h"
#include "kv/kv_quant.h"
#include "cuda_test_util.h"
#include "runtime/model_runner.h"
#include "../../runtime/tiny_model.h"

namespace serval::testing {
namespace {

TEST(CudaKvQuant, QuantizedPoolsAreRefusedNamingTheFlag) {
  SERVAL_CUDA_OR_SKIP(be);
  be->set_kv_dtype(be->act_dtype());
  for (DType t : {DType::FP8_E4M3, DType::I8}) {
    try {
      be->set_kv_dtype(t);
      FAIL() << dtype_name(t) << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--kv-cache-dtype"), std::string::npos) << e.what();
    }
  }
  TinySpec spec;
  const ModelConfig cfg = tiny_config(spec);
  const WeightStore w = tiny_weights(cfg, spec);
  RunnerOptions o;
  o.device = "cuda";
  o.kv_cache_tokens = 64;
  o.kv_cache_dtype = "fp8";
  o.kv_calibration_tokens = {1, 2, 3};
  EXPECT_THROW(ModelRunner::create(cfg, w, o), Error);
}

TEST(CudaKvQuant, KvWriteCodesEqualTheCpuBackends) {
  SERVAL_CUDA_OR_SKIP(gpu);
  auto cpu = create_backend("cpu", 1);
  const int32_t heads = 2, dim = 64, block = 16;
  const int64_t rows = 40, row = heads * dim;
  const std::vector<int64_t> slots = [&] {
    std::vector<int64_t> s;
    for (int64_t i = 0; i < rows; ++i) s.push_back((i * 37) % (6 * block));  // scattered, all distinct
    return s;
  }();
  for (DType t : {DType::FP8_E4M3, DType::I8}) {
    SCOPED_TRACE(std::string(dtype_name(t)));
    const KvGeometry g{6, block, heads, dim, t, 0};
    // bf16-exact inputs (both backends see the same values), head 1 ten times
    // head 0, a few beyond the range (saturating), ties of int8 included.
    std::vector<float> k = random_bf16(size_t(rows * row), 3, 1.0f), v = random_bf16(size_t(rows * row), 4, 1.0f);
    for (int64_t i = 0; i < rows * row; ++i)
      if ((i / dim) % heads == 1) k[size_t(i)] *= 8.0f, v[size_t(i)] *= 8.0f;
    k[5] = 1000.0f, v[130] = -1000.0f, k[7] = 2.5f * 0.0625f;
    const std::vector<float> scales = {0.0625f, 0.07f, kv_scale_for_amax(t, 0.9f), kv_scale_for_amax(t, 7.0f)};
    KvLayer c = cpu->alloc_kv_layer(g), d = gpu->alloc_kv_layer(g);
    ASSERT_EQ(d.scales.bytes(), int64_t(scales.size() * 4));
    std::memcpy(c.scales.data(), scales.data(), scales.size() * 4);
    gpu->copy_to_device(d.scales.data(), scales.data(), int64_t(scales.size() * 4));
    const int64_t pool = g.num_blocks * block * row;
    std::vector<uint8_t> zero(size_t(pool), 0);
    std::memcpy(c.k.data(), zero.data(), zero.size()), std::memcpy(c.v.data(), zero.data(), zero.size());
    gpu->copy_to_device(d.k.data(), zero.data(), pool), gpu->copy_to_device(d.v.data(), zero.data(), pool);
    cpu->kv_write(Tensor{k.data(), DType::F32, rows, row}, Tensor{v.data(), DType::F32, rows, row}, slots.data(), c, g);
    const DevTensor dk = upload(*gpu, k, rows, row), dv = upload(*gpu, v, rows, row);
    const DeviceBuffer dslots = upload_ints(*gpu, slots);
    gpu->kv_write(dk.t, dv.t, static_cast<const int64_t*>(dslots.data()), d, g);
    gpu->copy_kv_block(d, g, 1, 5);
    cpu->copy_kv_block(c, g, 1, 5);
    gpu->synchronize();
    std::vector<uint8_t> got(static_cast<size_t>(pool));
    for (bool value : {false, true}) {
      gpu->copy_to_host(got.data(), (value ? d.v : d.k).data(), pool);
      const uint8_t* want = static_cast<const uint8_t*>((value ? c.v : c.k).data());
      int64_t differ = 0;
      for (int64_t i = 0; i < pool; ++i) differ += got[size_t(i)] != want[i];
      EXPECT_EQ(differ, 0) << (value ? "V" : "K") << " codes differ";
    }
  }
}

}  // namespace
}  // namespace serval::testing
