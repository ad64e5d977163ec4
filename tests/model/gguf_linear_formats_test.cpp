// Serval's own quantized GGUF (model/gguf_linear_formats.h): a tiny model
// quantized to int8, int4 and fp8 loads as Linears of those formats whose
// dequantization equals quantize_matrix_rtn's; broken files (a missing or
// mis-shaped companion, an unknown format or version, a group size that does
// not divide the width, a stray key, truncated data) are refused naming the
// problem. The broken files are also the gguf fuzzer's seeds
// (tests/fuzz/corpus/gguf/serval_quant_*.gguf).
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <set>

#include "model/gguf.h"
#include "model/gguf_linear_formats.h"
#include "model/model_def.h"
#include "model/model_loader.h"
#include "model/quantize.h"
#include "model/rtn_quantize.h"
#include "test_models.h"

namespace serval {
namespace {

using Kind = LinearFormat::Kind;

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("serval_glf_" + name)).string();
}

// Copies `src` to `dst`, without the tensors and keys in `drop`, then lets
// `edit` add or override.
void rewrite(const std::string& src, const std::string& dst, const std::set<std::string>& drop,
             const std::function<void(GgufWriter&)>& edit = nullptr) {
  const auto in = GgufFile::open(src);
  GgufWriter w;
  for (const auto& [key, value] : in->metadata())
    if (!drop.contains(key)) w.set_value(key, value);
  for (const GgufTensorInfo& t : in->tensors())
    if (!drop.contains(t.name)) w.add_tensor_raw(t.name, t.ggml_type, t.shape(), t.data, t.nbytes);
  if (edit) edit(w);
  w.write(dst);
}

std::string quantized(const std::string& tag, const LinearFormat& f) {
  const std::string src = temp_path("f32.gguf"), dst = temp_path(tag + ".gguf");
  testing::write_tiny_gguf(src, testing::tiny_config());
  quantize_gguf_linear(src, dst, f);
  return dst;
}

const LinearFormat kInt4{Kind::Int4Grouped, DType::I8, 16, false};

TEST(GgufLinearFormats, QuantizedModelLoadsAsTheFormatsAndDequantizesAsRtn) {
  const std::string src = temp_path("f32.gguf");
  testing::write_tiny_gguf(src, testing::tiny_config());
  const LoadedModel f32 = load_model(src);
  for (const LinearFormat& f : {LinearFormat{Kind::Int8PerChannel, DType::I8, 0, true}, kInt4,
                                LinearFormat{Kind::Int4Grouped, DType::I8, 32, true},
                                LinearFormat{Kind::Fp8, DType::FP8_E4M3, 0, true}}) {
    const std::string path = quantized("ok", f);
    const LoadedModel m = load_model(path);
    const ModelDef def = ModelDef::of(m.config);
    for (const std::string name : {"blk.0.attn_q.weight", "blk.1.ffn_down.weight", "output.weight"}) {
      const TensorView& v = f32.weights.get(name);
      const int64_t out = v.shape[0], in = v.shape[1];
      const Linear w = load_linear(m.weights, m.config, name, out, in);
      EXPECT_EQ(w.format, f) << name;
      const std::vector<float> want = dequantize_linear(linear_of(v));
      const RtnMatrix rtn = quantize_matrix_rtn(f, name, want.data(), out, in);
      EXPECT_EQ(dequantize_linear(w), dequantize_linear(rtn.linear)) << name << " " << f.describe();
    }
    EXPECT_NE(def.stored_formats(m.weights).find(f.describe()), std::string::npos);
  }
}

TEST(GgufLinearFormats, AWidthTheGroupDoesNotDivideFallsBackToInt8) {
  const LinearFormat g32{Kind::Int4Grouped, DType::I8, 32, false};
  std::string why;
  EXPECT_EQ(rtn_format_for(g32, 64, why).kind, Kind::Int4Grouped);
  EXPECT_EQ(rtn_format_for(g32, 172, why).kind, Kind::Int8PerChannel);
  EXPECT_NE(why.find("172 columns are not whole groups of 32"), std::string::npos) << why;
}

TEST(GgufLinearFormats, BrokenFilesAreRefusedNamingTheProblem) {
  const std::string ok = quantized("int4", kInt4);
  const std::string q = "blk.0.attn_q.weight";
  struct Case {
    std::string tag;
    std::set<std::string> drop;
    std::function<void(GgufWriter&)> edit;
    std::vector<std::string> pieces;
  };
  std::vector<float> short_scale(32, 1.0f);
  const std::vector<Case> cases = {
      {"no_scale", {q + ".scale"}, nullptr, {q, "has no scales", q + ".scale"}},
      {"no_zero", {q + ".zero"}, nullptr, {q, "has no zero points", q + ".zero"}},
      {"bad_scale_shape", {q + ".scale"},
       [&](GgufWriter& w) { w.add_tensor(q + ".scale", DType::F32, {32, 1}, short_scale.data(), 32 * 4); },
       {q + ".scale", "[32, 1]", "expected f32 [32, 2]"}},
      {"unknown_format", {}, [&](GgufWriter& w) { w.set_string("serval.quantization.format." + q, "int3"); },
       {"serval.quantization.format." + q, "int3", "not a format Serval knows"}},
      {"group_48", {}, [&](GgufWriter& w) { w.set_u32("serval.quantization.group_size." + q, 48); },
       {q, "group size 48", "does not divide"}},
      {"version_2", {}, [&](GgufWriter& w) { w.set_u32(kServalQuantVersionKey, 2); },
       {kServalQuantVersionKey, "= 2", "not a version"}},
      {"stray_key", {}, [&](GgufWriter& w) { w.set_u32("serval.quantization.bits", 4); },
       {"serval.quantization.bits", "not one Serval writes"}},
      {"no_symmetric", {"serval.quantization.symmetric." + q}, nullptr,
       {"serval.quantization.symmetric." + q, "missing"}},
      {"missing_weight", {q, q + ".scale", q + ".zero"}, nullptr, {"names tensor \"" + q + "\"", "does not hold"}},
  };
  for (const Case& c : cases) {
    const std::string path = temp_path("serval_quant_" + c.tag + ".gguf");
    rewrite(ok, path, c.drop, c.edit);
    std::vector<std::string> pieces = c.pieces;
    pieces.push_back(path);
    testing::expect_error([&] { load_model(path); }, std::initializer_list<std::string>{});
    try {
      load_model(path);
    } catch (const Error& e) {
      for (const std::string& p : pieces)
        EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << c.tag << ": " << e.what() << "\nmissing " << p;
    }
  }
  // Truncated: the reader refuses the file before the formats are read.
  const std::string trunc = temp_path("serval_quant_trunc.gguf");
  {
    std::filesystem::copy_file(ok, trunc, std::filesystem::copy_options::overwrite_existing);
    std::filesystem::resize_file(trunc, std::filesystem::file_size(ok) - 100);
  }
  testing::expect_error([&] { load_model(trunc); }, {trunc});
}

}  // namespace
}  // namespace serval
