#include "model/gguf_linear_formats.h"

#include "core/error.h"

namespace serval {

namespace {

constexpr const char* kPrefix = "serval.quantization.";
constexpr const char* kFormat = "serval.quantization.format.";
constexpr const char* kGroup = "serval.quantization.group_size.";
constexpr const char* kSymmetric = "serval.quantization.symmetric.";

using Kind = LinearFormat::Kind;

const char* format_name(Kind k) {
  switch (k) {
    case Kind::Int8PerChannel: return "int8";
    case Kind::Int4Grouped: return "int4";
    case Kind::Fp8: return "fp8";
    default: return nullptr;
  }
}

}  // namespace

std::string linear_scale_name(const std::string& weight) { return weight + ".scale"; }
std::string linear_zero_name(const std::string& weight) { return weight + ".zero"; }

void write_linear_format(GgufWriter& w, const std::string& weight, const LinearFormat& f) {
  const char* name = format_name(f.kind);
  SERVAL_CHECK(name != nullptr && (f.kind != Kind::Fp8 || f.block_rows == 0), "GGUF: \"", weight, "\" is ",
               f.describe(), ", which Serval's GGUF types do not hold (int8 per channel, int4 grouped, fp8 per row)");
  w.set_u32(kServalQuantVersionKey, uint32_t(kServalQuantVersion));
  w.set_string(kFormat + weight, name);
  if (f.kind == Kind::Int4Grouped) {
    w.set_u32(kGroup + weight, uint32_t(f.group_size));
    w.set_bool(kSymmetric + weight, f.symmetric);
  }
}

std::map<std::string, LinearFormat> read_linear_formats(const GgufFile& f) {
  std::map<std::string, LinearFormat> out;
  bool any = false;
  for (const auto& [key, value] : f.metadata()) {
    if (!key.starts_with(kPrefix)) continue;
    any = true;
    if (key == kServalQuantVersionKey || key.starts_with(kGroup) || key.starts_with(kSymmetric)) continue;
    SERVAL_CHECK(key.starts_with(kFormat), "metadata key \"", key, "\" is not one Serval writes (",
                 kFormat, "W, ", kGroup, "W, ", kSymmetric, "W, ", kServalQuantVersionKey, ")");
    const std::string weight = key.substr(std::string(kFormat).size());
    const std::string name = f.get_string(key);
    LinearFormat fmt;
    if (name == "int8") {
      fmt = {Kind::Int8PerChannel, DType::I8, 0, true};
    } else if (name == "fp8") {
      fmt = {Kind::Fp8, DType::FP8_E4M3, 0, true};
    } else if (name == "int4") {
      const int64_t g = f.get_int(kGroup + weight);
      SERVAL_CHECK(g >= 2 && g <= (1 << 20) && g % 2 == 0, "metadata ", kGroup, weight, " = ", g,
                   " is not an even group size");
      fmt = {Kind::Int4Grouped, DType::I8, int32_t(g), f.get_bool(kSymmetric + weight, false)};
      SERVAL_CHECK(f.find(kSymmetric + weight) != nullptr, "metadata ", kSymmetric, weight, " is missing");
    } else {
      fail("metadata ", key, " = \"", name, "\" is not a format Serval knows (int8, int4, fp8)");
    }
    const GgufTensorInfo* t = f.find_tensor(weight);
    SERVAL_CHECK(t != nullptr, "metadata ", key, " names tensor \"", weight, "\", which the file does not hold");
    SERVAL_CHECK(t->ggml_type == uint32_t(GgmlType::I8), "tensor \"", weight, "\" (", name, ") has type ",
                 ggml_type_name(t->ggml_type), ", expected I8");
    out[weight] = fmt;
  }
  if (any) {
    const int64_t v = f.get_int(kServalQuantVersionKey);
    SERVAL_CHECK(v == kServalQuantVersion, "metadata ", kServalQuantVersionKey, " = ", v,
                 " is not a version this Serval reads (", kServalQuantVersion, ")");
  }
  for (const auto& [key, value] : f.metadata()) {  // group sizes and symmetry of no int4 weight
    for (const char* p : {kGroup, kSymmetric}) {
      if (!key.starts_with(p)) continue;
      const auto it = out.find(key.substr(std::string(p).size()));
      SERVAL_CHECK(it != out.end() && it->second.kind == Kind::Int4Grouped, "metadata key \"", key,
                   "\" names no int4 weight");
    }
  }
  return out;
}

Linear load_stored_linear(const WeightStore& store, const std::string& name, const LinearFormat& f, int64_t out,
                          int64_t in) {
  Linear w;
  w.name = name;
  w.out = out;
  w.in = in;
  w.format = f;
  w.shard = ShardSpec::whole(out, in);
  w.weight = store.get(name);
  SERVAL_CHECK(f.kind != Kind::Int4Grouped || (f.group_size > 0 && in % f.group_size == 0), "tensor \"", name,
               "\": int4 group size ", f.group_size, " does not divide its ", in, " inputs");
  const TensorView* scales = store.find(linear_scale_name(name));
  SERVAL_CHECK(scales != nullptr, "tensor \"", name, "\" (", f.describe(), ") has no scales: missing tensor \"",
               linear_scale_name(name), "\"");
  w.scales = *scales;
  if (f.kind == Kind::Int4Grouped && !f.symmetric) {
    const TensorView* zeros = store.find(linear_zero_name(name));
    SERVAL_CHECK(zeros != nullptr, "tensor \"", name, "\" (", f.describe(), ") has no zero points: missing tensor \"",
                 linear_zero_name(name), "\"");
    w.zeros = *zeros;
  }
  // Fp8's validate takes a [1] per-tensor scale too; these files hold one per row.
  SERVAL_CHECK(f.kind != Kind::Fp8 || w.scales->shape == std::vector<int64_t>{out}, "tensor \"",
               linear_scale_name(name), "\" has shape ", w.scales->shape_str(), ", expected [", out, "]");
  w.validate();
  return w;
}

}  // namespace serval
