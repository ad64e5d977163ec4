// The Backend interface's shared parts on the CPU backend: DeviceBuffer
// slices, the default upload_weight_group (one upload per weight, same
// values as upload_weight), and which head sizes each device takes.
#include "runtime/backend.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "core/error.h"
#include "model/model_def.h"

namespace serval {
namespace {

TEST(DeviceBuffer, SliceSharesMemoryAndKeepsTheWholeAlive) {
  auto be = create_backend("cpu", 1);
  DeviceBuffer part;
  {
    const DeviceBuffer whole = be->alloc(64);
    std::memset(whole.data(), 7, 64);
    part = whole.slice(16, 32);
    EXPECT_EQ(part.data(), static_cast<char*>(whole.data()) + 16);
    EXPECT_EQ(part.bytes(), 32);
  }
  // `whole` is gone; the slice still owns the memory.
  EXPECT_EQ(static_cast<const char*>(part.data())[31], 7);
}

TEST(DeviceBuffer, SliceOutsideTheBufferFailsWithItsRange) {
  auto be = create_backend("cpu", 1);
  const DeviceBuffer whole = be->alloc(64);
  try {
    (void)whole.slice(48, 32);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[48, 80) of a buffer of 64 bytes"), std::string::npos) << e.what();
  }
  EXPECT_THROW((void)whole.slice(-1, 4), Error);
}

TEST(Backend, UploadWeightGroupKeepsOrderNamesAndValues) {
  auto be = create_backend("cpu", 1);
  const std::vector<float> a = {1, 2, 3, 4, 5, 6}, b = {-1, -2, -3};
  const std::vector<TensorView> views = {TensorView{"a", DType::F32, {2, 3}, a.data(), 24},
                                         TensorView{"b", DType::F32, {1, 3}, b.data(), 12}};
  const auto group = be->upload_weight_group(views);
  ASSERT_EQ(group.size(), 2u);
  EXPECT_EQ(group[0]->name(), "a");
  EXPECT_EQ(group[1]->name(), "b");
  EXPECT_EQ(group[0]->shape(), (std::vector<int64_t>{2, 3}));
  // Through an op: y = x @ W^T with x = [1, 0, 0] picks W's first column.
  const float one_hot[3] = {1, 0, 0};
  DeviceBuffer xb = be->alloc(12), yb = be->alloc(8);
  be->copy_to_device(xb.data(), one_hot, 12);
  be->matmul(Tensor{xb.data(), DType::F32, 1, 3}, *group[0], nullptr, Tensor{yb.data(), DType::F32, 1, 2});
  float y[2] = {0, 0};
  be->copy_to_host(y, yb.data(), 8);
  EXPECT_EQ(y[0], 1.0f);
  EXPECT_EQ(y[1], 4.0f);
}

// A model whose heads no attention kernel of a device takes must fail when
// its runner is made (or, with --device auto, run on the CPU), not at every
// request's first step. No GPU is needed to ask.
ModelDef def_with(int64_t head_dim, int64_t window) {
  ModelConfig c;
  c.architecture = window > 0 ? "mistral" : "llama";
  c.vocab_size = 32;
  c.num_heads = 2;
  c.hidden_size = 2 * head_dim;
  c.intermediate_size = 8;
  c.num_layers = 2;
  c.num_kv_heads = 1;
  c.head_dim = c.rope_dim = head_dim;
  c.max_position = 4096;
  c.sliding_window = window;
  return ModelDef::of(c);
}

TEST(Backend, DeviceCannotRunNamesTheKernelADeviceLacks) {
  for (int64_t d : {4, 8, 12, 64, 128, 200, 256}) EXPECT_EQ(device_cannot_run("cpu", def_with(d, 0)), "") << d;
  EXPECT_EQ(device_cannot_run("cpu", def_with(64, 128)), "");
#ifdef SERVAL_WITH_CUDA
  for (int64_t d : {8, 16, 32, 64, 80, 96, 128, 256}) EXPECT_EQ(device_cannot_run("cuda", def_with(d, 0)), "") << d;
  for (int64_t d : {4, 12, 48, 112, 192, 512})
    EXPECT_EQ(device_cannot_run("cuda", def_with(d, 0)), str_cat("no attention kernel for its head_dim of ", d));
  // Sliding windows run on CUDA too.
  for (int64_t d : {64, 128, 80}) EXPECT_EQ(device_cannot_run("cuda", def_with(d, 128)), "") << d;
#endif
}

// "cuda:N" names GPU N wherever "cuda" is accepted; a malformed index is
// refused with the form expected, and a GPU that is not there (or a build
// without CUDA) fails when the backend is made, naming the device.
TEST(Backend, CudaDeviceNamesTakeAnIndex) {
  for (const char* gpu : {"cuda", "cuda:0", "cuda:1", "cuda:15"}) EXPECT_TRUE(is_cuda_device(gpu)) << gpu;
  for (const char* other : {"cpu", "auto", "cudax", "gpu", ""}) EXPECT_FALSE(is_cuda_device(other)) << other;
  for (const char* bad : {"cuda:", "cuda:a", "cuda:-1", "cuda:1x", "cuda:99999"}) {
    try {
      (void)is_cuda_device(bad);
      ADD_FAILURE() << bad << ": no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("expected cuda:N"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(compute_dtype("cuda:1", "auto"), DType::BF16);
  EXPECT_EQ(device_cannot_run("cuda:0", def_with(64, 0)), device_cannot_run("cuda", def_with(64, 0)));
  try {
    (void)create_backend("cuda:63", 1);
    FAIL() << "a 64th GPU";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_TRUE(msg.find("cuda:63") != std::string::npos || msg.find("device 63") != std::string::npos ||
                msg.find("no CUDA device") != std::string::npos)
        << msg;
  }
}

// A backend that never defers a norm (the CPU's) refuses deferred rows in
// the ops that take NormedRows, and finish_norm leaves rows as they are.
TEST(Backend, DeferredNormsAreRefusedWhereNothingDefersThem) {
  auto be = create_backend("cpu", 1);
  std::vector<float> x(8, 1.0f), out(8, 0.0f);
  const Tensor xt{x.data(), DType::F32, 2, 4}, out_t{out.data(), DType::F32, 2, 4};
  const std::vector<float> w(16, 0.5f);
  auto gate = be->upload_weight(TensorView{"gate", DType::F32, {4, 4}, w.data(), 64});
  auto up = be->upload_weight(TensorView{"up", DType::F32, {4, 4}, w.data(), 64});
  NormedRows plain = xt;
  EXPECT_EQ(be->finish_norm(plain).data, x.data());
  const NormedRows deferred(xt, 1e-5f, true);
  try {
    be->gated_mlp_up(deferred, *gate, *up, out_t, out_t, out_t);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("gated_mlp_up: the rows' norm was left deferred"), std::string::npos)
        << e.what();
  }
}

// A fed token goes onto the output of a penalized spec only (nothing else
// reads the output); every fed_source is cleared; a source the start before
// did not have is refused.
TEST(FedOutputs, AppendTheFedTokenWherePenaltiesReadIt) {
  SamplingParams plain, penalized;
  penalized.frequency_penalty = 0.5f;
  const std::vector<int32_t> out_a = {4, 5}, out_b = {6};
  const std::vector<int32_t> latest = {70, 71, 72};
  std::vector<SampleSpec> specs(3);
  specs[0].params = &penalized, specs[0].output_ids = out_a, specs[0].fed_source = 2;
  specs[1].params = &plain, specs[1].output_ids = out_b, specs[1].fed_source = 0;
  specs[2].params = &penalized, specs[2].output_ids = out_b;  // not fed
  const FedOutputs fed(specs, latest);
  const std::span<const SampleSpec> got = fed.specs();
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(std::vector<int32_t>(got[0].output_ids.begin(), got[0].output_ids.end()), (std::vector<int32_t>{4, 5, 72}));
  EXPECT_EQ(got[1].output_ids.data(), out_b.data()) << "no copy for a row without penalties";
  EXPECT_EQ(got[2].output_ids.data(), out_b.data());
  for (const SampleSpec& s : got) EXPECT_EQ(s.fed_source, -1);

  const FedOutputs none(std::span<const SampleSpec>(specs).last(1), latest);
  EXPECT_EQ(none.specs().data(), specs.data() + 2) << "nothing fed: the specs given";
  specs[1].fed_source = 3;
  EXPECT_THROW(FedOutputs(specs, latest), Error);
}

}  // namespace
}  // namespace serval
