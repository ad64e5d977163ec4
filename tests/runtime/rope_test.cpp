// RoPE inverse frequencies against values printed by Hugging Face transformers
// 5.24 (CPU torch), f32:
//   llama3: ROPE_INIT_FUNCTIONS["llama3"](LlamaConfig(hidden_size=2048,
//     num_attention_heads=32, head_dim=64, rope_theta=500000.0, rope_scaling={
//     "rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
//     "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}), "cpu")
//   default: 1.0 / (1e6 ** (torch.arange(0, 16, 2).float() / 16))
//   linear:  ROPE_INIT_FUNCTIONS["linear"](Qwen2Config(hidden_size=64,
//     num_attention_heads=4, rope_theta=1e6, rope_scaling={"rope_type": "linear",
//     "factor": 4.0}), "cpu")
#include "runtime/rope.h"

#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"

namespace serval {
namespace {

ModelConfig rope_config(int64_t head_dim, float theta) {
  ModelConfig c;
  c.head_dim = c.rope_dim = head_dim;
  c.rope_theta = theta;
  return c;
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want, double rel) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], want[i], rel * std::abs(want[i])) << "inv_freq[" << i << "]";
}

TEST(RopeInvFreq, DefaultMatchesTransformers) {
  const std::vector<float> hf = {1.0f, 0.17782793939113617f, 0.03162277862429619f, 0.005623413249850273f,
                                 0.0010000000474974513f, 0.00017782794020604342f, 3.162277425872162e-05f,
                                 5.62341347176698e-06f};
  expect_close(rope_inv_freq(rope_config(16, 1e6f), {}), hf, 1e-6);
}

TEST(RopeInvFreq, LinearMatchesTransformers) {
  ModelConfig c = rope_config(16, 1e6f);
  c.rope_scaling.type = RopeScaling::Type::Linear;
  c.rope_scaling.factor = 4;
  const std::vector<float> hf = {0.25f, 0.04445698484778404f, 0.007905694656074047f, 0.0014058533124625683f,
                                 0.0002500000118743628f, 4.4456985051510856e-05f, 7.905693564680405e-06f,
                                 1.405853367941745e-06f};
  expect_close(rope_inv_freq(c, {}), hf, 1e-6);
}

TEST(RopeInvFreq, Llama3MatchesTransformers) {
  ModelConfig c = rope_config(64, 500000.0f);
  c.rope_scaling.type = RopeScaling::Type::Llama3;
  c.rope_scaling.factor = 32;
  c.rope_scaling.low_freq_factor = 1;
  c.rope_scaling.high_freq_factor = 4;
  c.rope_scaling.original_max_position = 8192;
  const std::vector<float> hf = {
      1.0f, 0.663601279258728f, 0.44036662578582764f, 0.2922278344631195f, 0.193922758102417f,
      0.12868738174438477f, 0.08539710193872452f, 0.05666961893439293f, 0.03760603070259094f,
      0.02495540864765644f, 0.016560440883040428f, 0.010989529080688953f, 0.00729266507551074f,
      0.00483942124992609f, 0.0032114461064338684f, 0.0012905480107292533f, 0.000429556705057621f,
      9.708286233944818e-05f, 1.9461638657958247e-05f, 1.291476746700937e-05f, 8.570255886297673e-06f,
      5.687232260243036e-06f, 3.7740544485131977e-06f, 2.504467147446121e-06f, 1.6619674170215148e-06f,
      1.1028836297555245e-06f, 7.318749339901842e-07f, 4.856731266045244e-07f, 3.2229328894572973e-07f,
      2.1387423032592778e-07f, 1.4192720243499934e-07f, 9.418306490260875e-08f};
  expect_close(rope_inv_freq(c, {}), hf, 1e-6);
}

TEST(RopeInvFreq, FreqDivisorsReplaceLlama3Scaling) {
  // GGUF stores Llama 3.1 scaling as rope_freqs.weight; it must not be applied twice.
  ModelConfig c = rope_config(8, 10000.0f);
  const std::vector<float> plain = rope_inv_freq(c, {});
  c.rope_scaling.type = RopeScaling::Type::Llama3;
  c.rope_scaling.factor = 8;
  const std::vector<float> divided = rope_inv_freq(c, {1.0f, 2.0f, 4.0f, 8.0f});
  for (size_t i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(divided[i], plain[i] / float(1 << i));
  EXPECT_THROW(rope_inv_freq(c, {1.0f, 2.0f}), Error);        // wrong count
  EXPECT_THROW(rope_inv_freq(c, {1.0f, 0.0f, 1.0f, 1.0f}), Error);  // not positive
}

}  // namespace
}  // namespace serval
