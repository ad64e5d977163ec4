// --kv-cache-dtype fp8|int8 on the CUDA backend: kv_write's codes equal the
// CPU backend's, byte for byte, and a block copy moves them; attention over
// the codes (attention_over_codes) matches the CPU's over the same codes;
// other pool types are refused naming the flag. Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "core/error.h"
#include "cuda_attention_harness.h"
#include "cuda_test_util.h"
#include "kv/kv_quant.h"
#include "runtime/model_runner.h"
#include "../../runtime/tiny_model.h"

namespace serval::testing {
namespace {

TEST(CudaKvQuant, TakesFp8AndInt8PoolsAndRefusesOthersNamingTheFlag) {
  SERVAL_CUDA_OR_SKIP(be);
  for (DType t : {be->act_dtype(), DType::FP8_E4M3, DType::I8}) {
    be->set_kv_dtype(t);
    EXPECT_EQ(be->kv_dtype(), t);
  }
  try {
    be->set_kv_dtype(DType::Q4_0);
    FAIL() << "q4_0 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--kv-cache-dtype"), std::string::npos) << e.what();
  }
  // A runner calibrates its scales on the GPU and runs a step on the codes.
  TinySpec spec;  // a shape every CUDA kernel takes
  spec.vocab = 512, spec.hidden = 256, spec.inter = 512, spec.layers = 2, spec.heads = 4, spec.kv_heads = 2;
  spec.head_dim = 64;
  spec.matrix_dtype = DType::BF16;
  const ModelConfig cfg = tiny_config(spec);
  const WeightStore w = tiny_weights(cfg, spec);
  RunnerOptions o;
  o.device = "cuda";
  o.kv_cache_tokens = 256;
  o.kv_cache_dtype = "fp8";
  for (int32_t i = 0; i < 40; ++i) o.kv_calibration_tokens.push_back(1 + (i * 7) % int32_t(cfg.vocab_size - 1));
  auto runner = ModelRunner::create(cfg, w, o);
  EXPECT_NE(runner->kv_cache_note().find("calibrated at start-up on 40 tokens"), std::string::npos)
      << runner->kv_cache_note();
  Batch b;
  b.token_ids = {3, 5, 7, 9};
  b.positions = {0, 1, 2, 3};
  b.query_start = {0, 4};
  b.context_len = {4};
  b.block_table = {0};
  b.max_blocks_per_seq = 1;
  b.slot_mapping = {0, 1, 2, 3};
  b.logits_rows = {0, 1, 2, 3};
  std::vector<float> logits;
  runner->forward(b, logits);
  ASSERT_EQ(logits.size(), size_t(4 * cfg.vocab_size));
  for (float x : logits) ASSERT_TRUE(std::isfinite(x));
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

// A case's world on `be` with pools of `t` codes: every slot written through
// kv_write (random bf16 values, head h around 4^h, per-head scales from
// their amax), so both backends hold the same codes.
attn::AttnWorld quant_world(Backend& be, const attn::AttnCase& c, DType t, uint32_t seed) {
  attn::AttnWorld w = attn::make_world(be, c, seed, /*fill=*/false);
  w.geom.dtype = t;
  w.kv = be.alloc_kv_layer(w.geom);
  const int64_t n = w.geom.num_blocks * w.geom.block_size, row = int64_t(c.kv_heads) * c.head_dim;
  std::vector<float> k = random_bf16(size_t(n * row), seed + 1), v = random_bf16(size_t(n * row), seed + 2);
  std::vector<float> scales(size_t(2 * c.kv_heads));
  for (int64_t i = 0; i < n * row; ++i) {
    const int h = int((i / c.head_dim) % c.kv_heads);
    k[size_t(i)] *= float(1 << (2 * h)), v[size_t(i)] *= float(1 << (2 * h));
  }
  for (int h = 0; h < c.kv_heads; ++h)
    scales[size_t(h)] = scales[size_t(c.kv_heads + h)] = kv_scale_for_amax(t, float(1 << (2 * h)));
  be.copy_to_device(w.kv.scales.data(), scales.data(), int64_t(scales.size() * 4));
  std::vector<int64_t> slots(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) slots[size_t(i)] = i;
  const DevTensor dk = upload(be, k, n, row), dv = upload(be, v, n, row);
  const DeviceBuffer ds = upload_ints(be, slots);
  be.kv_write(dk.t, dv.t, static_cast<const int64_t*>(ds.data()), w.kv, w.geom);
  return w;
}

TEST(CudaKvQuant, AttentionOverCodesMatchesTheCpuOnTheSameCodes) {
  SERVAL_CUDA_OR_SKIP(gpu);
  auto cpu = create_backend("cpu", 0);
  using attn::AttnCase;
  const std::vector<AttnCase> cases = {
      {"decodes d64 g4", 2, 4, 64, 16, attn::decodes({1, 17, 300, 1000})},
      {"decodes d128 g8", 1, 8, 128, 16, attn::decodes({5, 64, 513})},
      {"prefill chunk + decode", 2, 2, 64, 16, {{40, 5}, {90, 1}, {7, 7}}},
      {"window 32", 2, 4, 64, 16, {{200, 3}, {50, 1}}, 0, 32},
  };
  for (DType t : {DType::FP8_E4M3, DType::I8}) {
    uint32_t seed = 900;
    for (const AttnCase& c : cases) {
      SCOPED_TRACE(c.name + " " + std::string(dtype_name(t)));
      std::vector<float> got, want;
      for (Backend* be : {gpu.get(), cpu.get()}) {
        attn::AttnWorld w = quant_world(*be, c, t, seed);
        attn::set_step(*be, w, c.seqs, 0);
        attn::poison(*be, w.out.t);
        attn::enqueue_attention(*be, w);
        be->synchronize();
        (be == gpu.get() ? got : want) = download(*be, w.out.t);
      }
      const double err = worst_head_error(got, want, c.head_dim);
      std::printf("[kv attn] %-24s %s: worst head rel err %.2e\n", c.name.c_str(), std::string(dtype_name(t)).c_str(),
                  err);
      EXPECT_LT(err, 1e-2);
      seed += 10;
    }
  }
}

}  // namespace
}  // namespace serval::testing
