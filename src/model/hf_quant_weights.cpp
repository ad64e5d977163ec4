// The tensors of quantized Hugging Face checkpoints (model/hf_quant.h): each
// quantized linear layer's weight, scales and zero points checked against the
// config's scheme and brought to a Linear format's tensors in the WeightStore.
#include <cmath>
#include <cstring>
#include <set>

#include "core/error.h"
#include "model/hf_model.h"
#include "model/hf_quant.h"
#include "model/int_unpack.h"
#include "model/model_def.h"
#include "model/safetensors.h"
#include "model/weights.h"

namespace serval {

namespace {

using St = HfQuantization::Storage;
using Tensors = std::map<std::string, const SafetensorsTensor*>;

constexpr const char* kQc = "quantization_config";

// The shape of a module's scale tensor, checked against its scheme, as
// stored in the WeightStore.
std::vector<int64_t> scale_shape(const HfQuantization& q, const SafetensorsTensor& s, int64_t out, int64_t in) {
  int64_t numel = 1;
  for (int64_t d : s.shape) numel *= d;
  const int64_t br = q.block_rows, bc = q.block_cols;
  const std::vector<int64_t> blocks = br > 0 ? std::vector<int64_t>{(out + br - 1) / br, (in + bc - 1) / bc}
                                             : std::vector<int64_t>{};
  std::string expected;
  switch (q.scales) {
    case HfQuantization::Scales::Tensor:
      if (numel == 1 && s.shape.size() <= 2) return {1};
      expected = "[] or [1]";
      break;
    case HfQuantization::Scales::Channel:
      if (s.shape == std::vector<int64_t>{out, 1} || s.shape == std::vector<int64_t>{out}) return {out};
      expected = str_cat("[", out, ", 1]");
      break;
    case HfQuantization::Scales::Block:
      if (s.shape == blocks) return blocks;
      expected = shape_string(blocks);
      break;
    case HfQuantization::Scales::BlockOrTensor:
      if (numel == 1 && s.shape.size() <= 1) return {1};
      if (s.shape == blocks) return blocks;
      expected = str_cat("[] or ", shape_string(blocks));
      break;
    case HfQuantization::Scales::Group: expected = "per group"; break;  // packed weights: read_packed
  }
  fail("tensor \"", s.name, "\" has shape ", shape_string(s.shape), ", expected ", expected, " for the [", out, ", ",
       in, "] weight (", q.scheme_field, ")");
}

struct LinearModule {
  std::string hf;    // "model.layers.0.self_attn.q_proj"
  int64_t out, in;
};

std::vector<LinearModule> linear_modules(const ModelConfig& c) {
  std::vector<LinearModule> mods;
  const int64_t h = c.hidden_size, q = c.q_dim(), kv = c.kv_dim(), i = c.intermediate_size;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const std::string p = str_cat("model.layers.", l, ".");
    mods.push_back({p + "self_attn.q_proj", q, h});
    mods.push_back({p + "self_attn.k_proj", kv, h});
    mods.push_back({p + "self_attn.v_proj", kv, h});
    mods.push_back({p + "self_attn.o_proj", h, q});
    mods.push_back({p + "mlp.gate_proj", i, h});
    mods.push_back({p + "mlp.up_proj", i, h});
    mods.push_back({p + "mlp.down_proj", h, i});
  }
  if (!c.tie_word_embeddings) mods.push_back({"lm_head", c.vocab_size, h});
  return mods;
}

const SafetensorsTensor* find(const Tensors& t, const std::string& name) {
  auto it = t.find(name);
  return it == t.end() ? nullptr : it->second;
}

// A float tensor (F32, BF16, F16) as f32, every value finite.
std::vector<float> read_floats(const SafetensorsTensor& s) {
  DType sd;
  try {
    sd = dtype_from_safetensors(s.dtype, s.name);
  } catch (const Error& e) {
    fail(e.what());
  }
  if (sd != DType::F32 && sd != DType::BF16 && sd != DType::F16)
    fail("tensor \"", s.name, "\" is ", s.dtype, "; scales must be F32, BF16 or F16");
  const int64_t n = s.nbytes / int64_t(dtype_bytes(sd, 1));
  std::vector<float> f(static_cast<size_t>(n));
  to_f32(sd, s.data, f.data(), n);
  for (float v : f)
    if (!std::isfinite(v)) fail("tensor \"", s.name, "\" holds a scale that is not finite (", v, ")");
  return f;
}

void add_floats(WeightStore& store, const std::string& name, std::vector<int64_t> shape, const std::vector<float>& f) {
  std::vector<uint8_t> bytes(f.size() * sizeof(float));
  std::memcpy(bytes.data(), f.data(), bytes.size());
  store.add_owned(name, DType::F32, std::move(shape), std::move(bytes));
}

// A zero-point tensor that must hold zeros only (symmetric schemes).
void check_zero(const Tensors& tensors, const std::string& name, const char* what) {
  if (const SafetensorsTensor* z = find(tensors, name))
    for (int64_t b = 0; b < z->nbytes; ++b)
      if (z->data[b] != 0) fail("tensor \"", z->name, "\" holds non-zero zero points (", what, ")");
}

// FP8 and int8 weights: `weight` [out, in] stays where the loader put it;
// its scales are added in f32. Returns whether the module is quantized.
bool add_scaled(const HfQuantization& q, const Tensors& tensors, const LinearModule& m, WeightStore& store) {
  const std::string wname = m.hf + ".weight";
  const SafetensorsTensor* wt = find(tensors, wname);
  if (!wt) return false;  // the loader names what is missing
  const SafetensorsTensor& w = *wt;
  const bool int8 = q.storage == St::Int8;
  const char* qdtype = int8 ? "I8" : "F8_E4M3";
  const char* kind = int8 ? "int8" : "fp8";
  const bool quant = w.dtype == qdtype;
  const bool wanted = q.quantizes(m.hf);
  if (!quant) {
    // transformers leaves the LM head unquantized unless it is listed.
    if (wanted && !(q.method == HfQuantization::Method::Fp8 && m.hf == "lm_head"))
      fail("tensor \"", wname, "\" is ", w.dtype, " but ", kQc, " quantizes \"", m.hf, "\" (expected ", qdtype,
           " weights with scales)");
    return false;
  }
  if (!wanted)
    fail("tensor \"", wname, "\" is ", qdtype, " but ", kQc, " leaves \"", m.hf, "\" unquantized (",
         q.method == HfQuantization::Method::Fp8 ? "modules_to_not_convert" : "ignore / config_groups targets", ")");
  const SafetensorsTensor* s = nullptr;
  for (const std::string& n : q.scale_names)
    if ((s = find(tensors, m.hf + "." + n))) break;
  if (!s) {
    std::string names;
    for (const std::string& n : q.scale_names) names += (names.empty() ? "\"" : " or \"") + m.hf + "." + n + "\"";
    fail(kind, " weight \"", wname, "\" has no scale tensor (", names, ")");
  }
  if (w.shape != std::vector<int64_t>{m.out, m.in}) return true;  // the loader names the shape mismatch
  std::vector<int64_t> shape = scale_shape(q, *s, m.out, m.in);
  std::vector<float> f = read_floats(*s);
  // Int8PerChannel holds a scale per row: a per-tensor scale repeats.
  if (int8 && shape == std::vector<int64_t>{1}) {
    f.assign(size_t(m.out), f[0]);
    shape = {m.out};
  }
  check_zero(tensors, m.hf + ".weight_zero_point", int8 ? "asymmetric int8 is not loaded" : "asymmetric FP8 is not loaded");
  add_floats(store, quant_scale_name(gguf_name_from_hf(wname)), shape, f);
  return true;
}

// A packed tensor of `dtype` and `shape`, or an error naming both.
const SafetensorsTensor& need(const Tensors& tensors, const std::string& name, const std::vector<std::string>& dtypes,
                              const std::vector<int64_t>& shape, const std::string& why) {
  const SafetensorsTensor* t = find(tensors, name);
  if (!t) fail("tensor \"", name, "\" is missing (", why, ")");
  bool dtype_ok = false;
  for (const std::string& d : dtypes) dtype_ok = dtype_ok || t->dtype == d;
  if (!dtype_ok) fail("tensor \"", name, "\" is ", t->dtype, ", expected ", dtypes[0], " (", why, ")");
  if (t->shape != shape)
    fail("tensor \"", name, "\" has shape ", shape_string(t->shape), ", expected ", shape_string(shape), " (", why, ")");
  return *t;
}

const std::vector<std::string> kFloat = {"F16", "BF16", "F32"};

// The group index of each input column (g_idx) when the checkpoint has one.
void read_g_idx(const Tensors& tensors, const std::string& name, UnpackedInt& u) {
  const SafetensorsTensor* t = find(tensors, name);
  if (!t) return;
  need(tensors, name, {"I32"}, {u.in}, "the group of each input");
  u.g_idx.resize(size_t(u.in));
  std::memcpy(u.g_idx.data(), t->data, size_t(u.in) * 4);
  for (int32_t g : u.g_idx)
    if (g < 0 || g >= u.groups) fail("tensor \"", name, "\" holds group ", g, ", outside 0 .. ", u.groups - 1);
}

// The module's int weight unpacked from the tool's packing; `used` gets the
// tensors read.
UnpackedInt read_packed(const HfQuantization& q, const Tensors& tensors, const LinearModule& m,
                        std::set<std::string>& used) {
  UnpackedInt u;
  u.out = m.out;
  u.in = m.in;
  u.bits = int(q.bits);
  const int64_t per = 32 / q.bits;
  const std::string p = m.hf + ".";
  if (q.scales == HfQuantization::Scales::Group && m.in % q.group_size != 0)
    fail("linear \"", m.hf, "\": ", q.scheme_field, " does not divide its ", m.in, " inputs");
  u.groups = q.scales == HfQuantization::Scales::Group ? m.in / q.group_size : 1;
  const std::string scheme = str_cat(q.bits, "-bit, ", q.scheme_field);
  std::vector<float> scale;
  switch (q.storage) {
    case St::CtPacked: {
      const SafetensorsTensor& w =
          need(tensors, p + "weight_packed", {"I32"}, {m.out, (m.in + per - 1) / per}, "packed " + scheme);
      const SafetensorsTensor& shape = need(tensors, p + "weight_shape", {"I64", "I32"}, {2}, "the weight's shape");
      int64_t dims[2];
      for (int i = 0; i < 2; ++i) {
        if (shape.dtype == "I64") std::memcpy(&dims[i], shape.data + i * 8, 8);
        else { int32_t d; std::memcpy(&d, shape.data + i * 4, 4); dims[i] = d; }
      }
      if (dims[0] != m.out || dims[1] != m.in)
        fail("tensor \"", shape.name, "\" holds [", dims[0], ", ", dims[1], "], expected [", m.out, ", ", m.in, "]");
      u.q = unpack_int32_rows(w.data, m.out, w.shape[1], u.bits, m.in);
      scale = read_floats(need(tensors, p + "weight_scale", kFloat, {m.out, u.groups}, "scales, " + scheme));
      if (q.symmetric) {
        check_zero(tensors, p + "weight_zero_point", "symmetric weights");
      } else {
        // compressed-tensors packs (zero + 2^(bits-1)) down the output rows, as it does the weights.
        const SafetensorsTensor& z = need(tensors, p + "weight_zero_point", {"I32"},
                                          {(m.out + per - 1) / per, u.groups}, "packed zero points, " + scheme);
        const std::vector<uint8_t> zq = unpack_int32_cols(z.data, m.out, u.groups, u.bits);
        u.zero.assign(zq.begin(), zq.end());
      }
      u.scale = scale;
      read_g_idx(tensors, p + "weight_g_idx", u);
      for (const char* n : {"weight_packed", "weight_shape", "weight_scale", "weight_zero_point", "weight_g_idx"})
        used.insert(p + n);
      break;
    }
    case St::Awq: {
      const SafetensorsTensor& w = need(tensors, p + "qweight", {"I32"}, {m.in, m.out / 8}, "AWQ GEMM " + scheme);
      if (m.out % 8 != 0) fail("linear \"", m.hf, "\": AWQ packs 8 outputs to a word; it has ", m.out);
      u.q = transpose_bytes(unpack_int32_rows(w.data, m.in, m.out / 8, 4, m.out, kAwqNibble), m.in, m.out);
      const SafetensorsTensor& z = need(tensors, p + "qzeros", {"I32"}, {u.groups, m.out / 8}, "AWQ zero points");
      const std::vector<uint8_t> zq = unpack_int32_rows(z.data, u.groups, m.out / 8, 4, m.out, kAwqNibble);
      u.zero = transpose_floats(std::vector<float>(zq.begin(), zq.end()), u.groups, m.out);
      u.scale = transpose_floats(read_floats(need(tensors, p + "scales", kFloat, {u.groups, m.out}, "AWQ scales")),
                                 u.groups, m.out);
      for (const char* n : {"qweight", "qzeros", "scales"}) used.insert(p + n);
      break;
    }
    case St::Gptq: {
      if (m.in % per != 0) fail("linear \"", m.hf, "\": GPTQ packs ", per, " inputs to a word; it has ", m.in);
      const SafetensorsTensor& w = need(tensors, p + "qweight", {"I32"}, {m.in / per, m.out}, "GPTQ " + scheme);
      u.q = transpose_bytes(unpack_int32_cols(w.data, m.in, m.out, u.bits), m.in, m.out);
      const int64_t zw = (m.out + per - 1) / per;
      const SafetensorsTensor& z = need(tensors, p + "qzeros", {"I32"}, {u.groups, zw}, "GPTQ zero points");
      std::vector<float> zero(size_t(u.groups * m.out));
      const std::vector<uint8_t> zq = unpack_int32_rows(z.data, u.groups, zw, u.bits, m.out);
      // v1 (AutoGPTQ) stores zero - 1; it reads the field back plus one (a stored 2^bits - 1 reads 2^bits).
      for (size_t i = 0; i < zero.size(); ++i) zero[i] = float(zq[i]) + (q.zeros_minus_one ? 1.0f : 0.0f);
      u.zero = transpose_floats(zero, u.groups, m.out);
      u.scale = transpose_floats(read_floats(need(tensors, p + "scales", kFloat, {u.groups, m.out}, "GPTQ scales")),
                                 u.groups, m.out);
      read_g_idx(tensors, p + "g_idx", u);
      for (const char* n : {"qweight", "qzeros", "scales", "g_idx"}) used.insert(p + n);
      break;
    }
    case St::Fp8:
    case St::Int8: break;
  }
  return u;
}

// A packed module: Int8PerChannel, Int4Grouped, or dense f32 where the
// formats cannot hold its groups. Returns whether the module is quantized.
bool add_packed(const HfQuantization& q, const Tensors& tensors, const LinearModule& m, WeightStore& store,
                std::set<std::string>& used) {
  const std::string main = q.storage == St::CtPacked ? "weight_packed" : "qweight";
  const SafetensorsTensor* packed = find(tensors, m.hf + "." + main);
  const bool wanted = q.quantizes(m.hf);
  if (!packed) {
    // AWQ and GPTQ leave the LM head (and AWQ its modules_to_not_convert) as plain weights.
    const bool optional = q.method != HfQuantization::Method::CompressedTensors && m.hf == "lm_head";
    if (wanted && !optional)
      fail("tensor \"", m.hf, ".", main, "\" is missing: ", kQc, " quantizes \"", m.hf, "\"");
    return false;
  }
  if (!wanted)
    fail("tensor \"", packed->name, "\" is a packed weight but ", kQc, " leaves \"", m.hf,
         "\" unquantized (ignore / modules_to_not_convert)");
  if (find(tensors, m.hf + ".weight"))
    fail("linear \"", m.hf, "\" has both a plain \"weight\" and a packed \"", main, "\"");
  const UnpackedInt u = read_packed(q, tensors, m, used);
  const std::string name = gguf_name_from_hf(m.hf + ".weight");
  if (u.bits == 8) {
    // Int8PerChannel: a scale per row and the symmetric grid (zero 128).
    if (u.groups != 1 || !u.zeros_are_midpoint())
      fail("linear \"", m.hf, "\": 8-bit weights load per channel with zero points of 128; its zero points differ");
    std::vector<uint8_t> q8(u.q.size());
    for (size_t i = 0; i < q8.size(); ++i) q8[i] = uint8_t(int8_t(int(u.q[i]) - 128));
    store.add_owned(name, DType::I8, {m.out, m.in}, std::move(q8));
    add_floats(store, quant_scale_name(name), {m.out}, u.scale);
    return true;
  }
  if (u.contiguous_groups() && (m.in / u.groups) % 2 == 0) {
    store.add_owned(int4_weight_name(name), DType::I8, {m.out, m.in / 2}, u.int4_bytes());
    add_floats(store, quant_scale_name(name), {m.out, u.groups}, u.scale);
    if (!u.zeros_are_midpoint()) add_floats(store, int4_zero_name(name), {m.out, u.groups}, u.zero);
  } else {
    add_floats(store, name, {m.out, m.in}, u.dequantize());  // act-order groups: dense, exact
  }
  return true;
}

}  // namespace

void add_hf_quantized_weights(const HfQuantization& q, const Tensors& tensors, const ModelConfig& config,
                              WeightStore& store) {
  std::set<std::string> used;
  const bool packed = q.storage == St::CtPacked || q.storage == St::Awq || q.storage == St::Gptq;
  for (const LinearModule& m : linear_modules(config)) {
    if (q.method == HfQuantization::Method::None) continue;
    const bool quantized = packed ? add_packed(q, tensors, m, store, used) : add_scaled(q, tensors, m, store);
    if (quantized) used.insert(m.hf + ".weight");
  }
  // A quantized tensor anywhere else has no scheme Serval knows.
  for (const auto& [name, t] : tensors) {
    if (used.count(name)) continue;
    if ((t->dtype == "F8_E4M3" || t->dtype == "I8") && !gguf_name_from_hf(name).empty()) {
      if (q.method == HfQuantization::Method::None)
        fail("tensor \"", name, "\" is ", t->dtype, " but config.json has no ", kQc, " to give its scales");
      fail("tensor \"", name, "\" is ", t->dtype,
           ", which Serval loads only for the weights of linear layers the quantization_config quantizes");
    }
    for (const char* suffix : {".qweight", ".weight_packed"}) {
      const std::string s = suffix;
      if (name.size() > s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0)
        fail("tensor \"", name, "\" is a packed quantized weight ",
             q.method == HfQuantization::Method::None ? "but config.json has no quantization_config"
                                                      : "of no linear layer the quantization_config quantizes");
    }
  }
}

}  // namespace serval
