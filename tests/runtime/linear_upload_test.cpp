// A format a backend has no kernel for runs through the reference
// composition: the CPU backend multiplies by an int8 per-channel Linear as
// by its dequantized matrix.
#include "runtime/linear_upload.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

namespace serval {
namespace {

TEST(LinearUpload, CpuRunsInt8PerChannelThroughTheReferenceComposition) {
  auto be = create_backend("cpu", 1);
  constexpr int64_t kOut = 24, kIn = 40, kRows = 3;
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> qd(-127, 127);
  std::uniform_real_distribution<float> xd(-1.0f, 1.0f);
  std::vector<int8_t> q(kOut * kIn);
  for (int8_t& v : q) v = int8_t(qd(rng));
  std::vector<float> scale(kOut);
  for (int64_t r = 0; r < kOut; ++r) scale[size_t(r)] = 0.001f * float(r + 1);
  Linear w;
  w.name = "blk.0.attn_output.weight";
  w.out = kOut;
  w.in = kIn;
  w.format = {LinearFormat::Kind::Int8PerChannel, DType::I8, 0, true};
  w.weight = TensorView{"q", DType::I8, {kOut, kIn}, q.data(), kOut * kIn};
  w.scales = TensorView{"s", DType::F32, {kOut}, scale.data(), kOut * 4};
  w.shard = ShardSpec::whole(kOut, kIn);
  ASSERT_FALSE(be->runs_linear_format(w.format));

  int64_t bytes = 0;
  const auto dw = upload_linear(*be, w, bytes);
  EXPECT_EQ(bytes, kOut * kIn * 4);  // held dense in f32
  EXPECT_EQ(dw->format(), LinearFormat::dense(DType::F32));
  EXPECT_EQ(dw->shape(), (std::vector<int64_t>{kOut, kIn}));

  std::vector<float> x(kRows * kIn);
  for (float& v : x) v = xd(rng);
  DeviceBuffer xb = be->alloc(int64_t(x.size() * 4)), yb = be->alloc(kRows * kOut * 4);
  be->copy_to_device(xb.data(), x.data(), int64_t(x.size() * 4));
  be->matmul(Tensor{xb.data(), DType::F32, kRows, kIn}, *dw, nullptr, Tensor{yb.data(), DType::F32, kRows, kOut});
  std::vector<float> y(kRows * kOut);
  be->copy_to_host(y.data(), yb.data(), int64_t(y.size() * 4));
  for (int64_t t = 0; t < kRows; ++t)
    for (int64_t o = 0; o < kOut; ++o) {
      double ref = 0;
      for (int64_t i = 0; i < kIn; ++i) ref += double(q[size_t(o * kIn + i)]) * scale[size_t(o)] * x[size_t(t * kIn + i)];
      EXPECT_NEAR(y[size_t(t * kOut + o)], ref, 1e-4 * (1 + std::fabs(ref))) << t << ", " << o;
    }
}

}  // namespace
}  // namespace serval
