// --cuda-tuning's parser (runtime/cuda_tuning.h): the defaults when nothing
// is given, each kind of value, and the errors that name what is wrong.
// Plain C++: runs without a GPU and in builds without CUDA.
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "runtime/cuda_tuning.h"

namespace serval::testing {
namespace {

std::string error_of(const std::string& spec) {
  try {
    parse_cuda_tuning(spec);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(CudaTuning, NothingGivenKeepsTheDefaults) {
  const CudaTuning t = parse_cuda_tuning("");
  EXPECT_EQ(t, CudaTuning{});
  EXPECT_TRUE(t.pdl && t.cutlass_gemm && t.cutlass_swap && t.cutlass_swap_gated && t.cutlass_two_ctas &&
              t.gate_up_interleaved && t.gemv_rope && t.stacked_qkv && t.split_k && t.norm_fold &&
              t.norm_elision && t.attn_direct_split && t.attn_trigger && t.fed_penalties);
  EXPECT_EQ(t.cutlass_rope_rows, 32);
  EXPECT_EQ(t.cutlass_w_prefetch, 4);
  EXPECT_EQ(t.gemv_sms, 0);
  EXPECT_EQ(t.attn_stream, CudaTuning::AttnStream::kAuto);
  EXPECT_EQ(t.rope_in_attn, CudaTuning::RopeInAttn::kAuto);
  EXPECT_EQ(t.packed_blocks, CudaTuning::PackedBlocks::kAuto);
}

TEST(CudaTuning, SetsEachKindOfValue) {
  const CudaTuning t = parse_cuda_tuning(
      "pdl=0,cutlass_swap=off,split_k=false,norm_fold=1,cutlass_rope_rows=64,gemv_sms=94,cutlass_w_prefetch=0,"
      "attn_stream=always,rope_in_attn=on");
  EXPECT_FALSE(t.pdl);
  EXPECT_FALSE(t.cutlass_swap);
  EXPECT_FALSE(t.split_k);
  EXPECT_TRUE(t.norm_fold);
  EXPECT_EQ(t.cutlass_rope_rows, 64);
  EXPECT_EQ(t.gemv_sms, 94);
  EXPECT_EQ(t.cutlass_w_prefetch, 0);
  EXPECT_EQ(t.attn_stream, CudaTuning::AttnStream::kAlways);
  EXPECT_EQ(t.rope_in_attn, CudaTuning::RopeInAttn::kOn);
  EXPECT_TRUE(t.cutlass_gemm);  // untouched keys keep their defaults
  EXPECT_EQ(parse_cuda_tuning("attn_stream=off").attn_stream, CudaTuning::AttnStream::kOff);
  EXPECT_EQ(parse_cuda_tuning("rope_in_attn=0").rope_in_attn, CudaTuning::RopeInAttn::kOff);
  EXPECT_EQ(parse_cuda_tuning("packed_blocks=on").packed_blocks, CudaTuning::PackedBlocks::kOn);
  EXPECT_EQ(parse_cuda_tuning("packed_blocks=0").packed_blocks, CudaTuning::PackedBlocks::kOff);
  EXPECT_FALSE(parse_cuda_tuning("fed_penalties=on,fed_penalties=0").fed_penalties);  // the last one counts
}

TEST(CudaTuning, EveryListedKeyParses) {
  for (const char* k : {"pdl", "cutlass_gemm", "cutlass_swap", "cutlass_swap_gated", "cutlass_two_ctas",
                        "gate_up_interleaved", "gemv_rope", "stacked_qkv", "split_k", "norm_fold", "norm_elision",
                        "attn_direct_split", "attn_trigger", "fed_penalties"}) {
    EXPECT_TRUE(contains(cuda_tuning_keys(), k)) << k;
    EXPECT_EQ(error_of(std::string(k) + "=0"), "") << k;
  }
}

TEST(CudaTuning, UnknownKeyIsRefusedWithTheValidKeysListed) {
  const std::string e = error_of("pdl=1,no_such_knob=1");
  EXPECT_TRUE(contains(e, "unknown key \"no_such_knob\"")) << e;
  EXPECT_TRUE(contains(e, "cutlass_swap_gated")) << e;
  EXPECT_TRUE(contains(e, "--cuda-tuning")) << e;
}

TEST(CudaTuning, BadValuesAreRefusedNamingTheKey) {
  for (const char* spec : {"pdl=2", "pdl=", "split_k=yes", "cutlass_rope_rows=65", "cutlass_rope_rows=-1",
                           "gemv_sms=ten", "cutlass_w_prefetch=99999999999", "attn_stream=on", "rope_in_attn=always",
                           "packed_blocks=maybe"}) {
    const std::string e = error_of(spec);
    const std::string key(spec, std::string(spec).find('='));
    EXPECT_TRUE(contains(e, "bad value") && contains(e, key)) << spec << ": " << e;
  }
}

TEST(CudaTuning, EntriesThatAreNotKeyValueAreRefused) {
  for (const char* spec : {"pdl", "pdl=1,", ",pdl=1", "=1", "pdl=1,,split_k=0"})
    EXPECT_TRUE(contains(error_of(spec), "is not key=value")) << spec << ": " << error_of(spec);
}

}  // namespace
}  // namespace serval::testing
