// The compute dtype option (RunnerOptions::dtype, --dtype): what each value
// means per device, the CPU refusing bfloat16, unknown names refused with the
// accepted ones listed, and float32 on the CPU being exactly the default.
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "runtime/backend.h"
#include "runtime/model_runner.h"
#include "tiny_model.h"

namespace serval::testing {
namespace {

// The message of the serval::Error that `f` throws ("" if none).
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

TEST(BackendDtype, MeaningPerDevice) {
  EXPECT_EQ(compute_dtype("cpu", "auto"), DType::F32);
  EXPECT_EQ(compute_dtype("cpu", "float32"), DType::F32);
  // No GPU is needed to say what a GPU would compute in.
  EXPECT_EQ(compute_dtype("cuda", "auto"), DType::BF16);
  EXPECT_EQ(compute_dtype("cuda", "bfloat16"), DType::BF16);
  EXPECT_EQ(compute_dtype("cuda", "float32"), DType::F32);
}

TEST(BackendDtype, CpuRefusesBfloat16) {
  const std::string msg = error_of([] { compute_dtype("cpu", "bfloat16"); });
  EXPECT_TRUE(contains(msg, "bfloat16") && contains(msg, "float32")) << "message: " << msg;
  EXPECT_NE(error_of([] { create_backend("cpu", 1, "bfloat16"); }), "");

  TinySpec spec;
  const ModelConfig cfg = tiny_config(spec);
  const WeightStore w = tiny_weights(cfg, spec);
  RunnerOptions opts;
  opts.device = "cpu";
  opts.dtype = "bfloat16";
  const std::string runner_msg = error_of([&] { ModelRunner::create(cfg, w, opts); });
  EXPECT_TRUE(contains(runner_msg, "bfloat16")) << "message: " << runner_msg;
}

TEST(BackendDtype, UnknownDtypesNameTheAcceptedOnes) {
  for (const char* bad : {"fp16", "bf16", "float", "", "Float32"}) {
    for (const char* device : {"cpu", "cuda"}) {
      const std::string msg = error_of([&] { compute_dtype(device, bad); });
      EXPECT_TRUE(contains(msg, "unknown dtype") && contains(msg, "auto, bfloat16 or float32"))
          << device << " / \"" << bad << "\": " << msg;
    }
    EXPECT_NE(error_of([&] { create_backend("cpu", 1, bad); }), "") << bad;
  }
}

TEST(BackendDtype, Float32OnTheCpuIsTheDefault) {
  auto be = create_backend("cpu", 1, "float32");
  EXPECT_EQ(be->act_dtype(), DType::F32);
  EXPECT_EQ(be->kv_dtype(), DType::F32);

  TinySpec spec;
  const ModelConfig cfg = tiny_config(spec);
  const WeightStore w = tiny_weights(cfg, spec);
  std::vector<float> logits[2];
  int i = 0;
  for (const char* dtype : {"auto", "float32"}) {
    RunnerOptions opts;
    opts.device = "cpu";
    opts.dtype = dtype;
    opts.threads = 1;
    auto runner = ModelRunner::create(cfg, w, opts);
    PagedSeqs seqs(runner->block_size(), {0, 1, 2}, 3);
    const int s = seqs.add_sequence();
    runner->forward(seqs.step({s}, {{1, 5, 9, 2}}, true), logits[i++]);
  }
  ASSERT_FALSE(logits[0].empty());
  EXPECT_EQ(logits[0], logits[1]);
}

}  // namespace
}  // namespace serval::testing
