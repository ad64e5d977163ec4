// quantization_config of Hugging Face folders: FP8 checkpoints of
// transformers' "fp8" and of compressed-tensors (see hf_quant.h).
#include "model/hf_quant.h"

#include <cctype>
#include <cmath>
#include <cstring>
#include <regex>
#include <set>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/hf_model.h"
#include "model/model_def.h"
#include "model/safetensors.h"
#include "model/weights.h"

namespace serval {

namespace {

using nlohmann::json;

constexpr const char* kQc = "quantization_config";

std::string field(const std::string& path) { return str_cat(kQc, ".", path); }

// A string member, or `dflt` when absent or null; throws when not a string.
std::string get_string(const json& j, const std::string& key, const std::string& path, const std::string& dflt = "") {
  if (!j.contains(key) || j[key].is_null()) return dflt;
  if (!j[key].is_string()) fail(field(path + key), " must be a string, got ", j[key].dump());
  return j[key].get<std::string>();
}

bool get_bool(const json& j, const std::string& key, const std::string& path, bool dflt) {
  if (!j.contains(key) || j[key].is_null()) return dflt;
  if (!j[key].is_boolean()) fail(field(path + key), " must be true or false, got ", j[key].dump());
  return j[key].get<bool>();
}

std::vector<std::string> get_strings(const json& j, const std::string& key, const std::string& path) {
  std::vector<std::string> out;
  if (!j.contains(key) || j[key].is_null()) return out;
  if (!j[key].is_array()) fail(field(path + key), " must be a list of strings, got ", j[key].dump());
  for (const json& s : j[key]) {
    if (!s.is_string()) fail(field(path + key), " must be a list of strings, got ", j[key].dump());
    out.push_back(s.get<std::string>());
  }
  return out;
}

// A value that must be absent, null (or an empty object / list): a feature
// Serval does not load yet.
void require_unset(const json& j, const std::string& key, const std::string& path, const char* what) {
  if (!j.contains(key) || j[key].is_null()) return;
  if ((j[key].is_object() || j[key].is_array()) && j[key].empty()) return;
  fail(field(path + key), " = ", j[key].dump(), " is not supported (", what, ")");
}

// [rows, cols] of positive integers (compressed-tensors also writes "128x128").
void block_shape(const json& v, const std::string& name, int64_t& rows, int64_t& cols) {
  std::vector<int64_t> dims;
  if (v.is_string()) {
    const std::string s = v.get<std::string>();
    const size_t x = s.find('x');
    try {
      if (x != std::string::npos) dims = {std::stoll(s.substr(0, x)), std::stoll(s.substr(x + 1))};
    } catch (const std::exception&) {
      dims.clear();
    }
  } else if (v.is_array()) {
    for (const json& d : v)
      if (d.is_number_integer()) dims.push_back(d.get<int64_t>());
    if (dims.size() != v.size()) dims.clear();
  }
  if (dims.size() != 2 || dims[0] <= 0 || dims[1] <= 0 || dims[0] > (1 << 20) || dims[1] > (1 << 20))
    fail(field(name), " = ", v.dump(), " must be [rows, cols] of positive integers");
  rows = dims[0];
  cols = dims[1];
}

std::regex make_regex(const std::string& pattern, const std::string& what) {
  // std::regex compiles and matches recursively: a long pattern could take the stack.
  if (pattern.size() > 256) fail(field(what), ": pattern of ", pattern.size(), " characters (at most 256)");
  try {
    return std::regex(pattern, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    fail(field(what), ": pattern \"", pattern, "\" is not a regular expression Serval reads (", e.what(), ")");
  }
}

// compressed-tensors: "re:PATTERN" matches from the start of the name
// (Python's re.match); "Linear" every linear layer; anything else a module
// name exactly.
bool ct_matches(const std::string& module, const std::string& target) {
  if (target == "Linear") return true;
  if (target.rfind("re:", 0) == 0)
    return std::regex_search(module, make_regex(target.substr(3), "config_groups / ignore"),
                             std::regex_constants::match_continuous);
  return module == target;
}

// transformers' modules_to_not_convert (should_convert_module): the key as a
// regex from the start of the name up to a module boundary, or as a suffix.
bool fp8_skips(const std::string& module, const std::string& key) {
  if (module.size() >= key.size() && module.compare(module.size() - key.size(), key.size(), key) == 0) return true;
  const std::regex re = make_regex("(?:" + key + ")", "modules_to_not_convert");
  std::smatch m;
  if (!std::regex_search(module, m, re, std::regex_constants::match_continuous)) return false;
  const size_t end = size_t(m.length(0));
  return end == module.size() || module[end] == '.' || (end > 0 && module[end - 1] == '.');
}

HfQuantization parse_fp8(const json& qc) {
  HfQuantization q;
  q.method = HfQuantization::Method::Fp8;
  std::string act = get_string(qc, "activation_scheme", "", "dynamic");
  for (char& ch : act) ch = char(std::tolower(static_cast<unsigned char>(ch)));  // as transformers reads it
  if (act == "dynamic") q.activations = "dynamic per token-group";
  else if (act == "static") q.activations = "static per tensor (activation_scale / input_scale)";
  else fail(field("activation_scheme"), " = \"", act, "\" is not supported (supported: dynamic, static)");
  const std::string fmt = get_string(qc, "scale_fmt", "", "float");
  if (fmt != "float") fail(field("scale_fmt"), " = \"", fmt, "\" is not supported (supported: float)");
  require_unset(qc, "modules_to_convert", "", "FP8 embedding tables");
  q.ignore = get_strings(qc, "modules_to_not_convert", "");
  if (q.ignore.empty()) q.ignore = get_strings(qc, "ignored_layers", "");
  for (const std::string& k : q.ignore) make_regex("(?:" + k + ")", "modules_to_not_convert");
  if (!qc.contains("weight_block_size")) {
    // transformers reads 128 x 128 blocks; vLLM (and AutoFP8, which wrote
    // these) one scale per tensor: the scale's shape says which.
    q.scales = HfQuantization::Scales::BlockOrTensor;
    q.block_rows = q.block_cols = 128;
    q.scale_names = {"weight_scale_inv", "weight_scale"};
    q.scheme_field = field("weight_block_size") + " (absent: 128 x 128 blocks or one scale per tensor)";
  } else if (qc["weight_block_size"].is_null()) {
    q.scales = HfQuantization::Scales::Tensor;
    q.scale_names = {"weight_scale_inv", "weight_scale"};
    q.scheme_field = field("weight_block_size") + " null (one scale per tensor)";
  } else {
    q.scales = HfQuantization::Scales::Block;
    block_shape(qc["weight_block_size"], "weight_block_size", q.block_rows, q.block_cols);
    q.scale_names = {"weight_scale_inv"};
    q.scheme_field = field("weight_block_size") + " " + qc["weight_block_size"].dump();
  }
  return q;
}

// One config group's scheme; `path` "config_groups.NAME.".
void parse_ct_group(const json& g, const std::string& path, HfQuantization& q, bool& first) {
  if (g.is_array())
    fail(field(path.substr(0, path.size() - 1)), " is a preset scheme name with targets ", g.dump(),
         "; Serval reads only written-out schemes (targets, weights, input_activations)");
  if (!g.is_object()) fail(field(path.substr(0, path.size() - 1)), " must be an object");
  for (const std::string& t : get_strings(g, "targets", path)) q.targets.push_back(t);
  const std::string fmt = get_string(g, "format", path);
  if (!fmt.empty() && fmt != "float-quantized" && fmt != "naive-quantized")
    fail(field(path + "format"), " = \"", fmt, "\" is not supported (supported: float-quantized)");
  require_unset(g, "output_activations", path, "output quantization");
  if (!g.contains("weights") || !g["weights"].is_object())
    fail(field(path + "weights"), " must be an object (Serval loads quantized weights only)");
  const json& w = g["weights"];
  const std::string wp = path + "weights.";
  const int64_t bits = w.contains("num_bits") && w["num_bits"].is_number_integer() ? w["num_bits"].get<int64_t>() : 8;
  const std::string type = get_string(w, "type", wp, "int");
  if (type != "float" || bits != 8)
    fail(field(wp + "type"), " = \"", type, "\" with ", field(wp + "num_bits"), " = ", bits,
         " is not supported (supported: float with 8 bits, FP8 e4m3)");
  if (!get_bool(w, "symmetric", wp, true))
    fail(field(wp + "symmetric"), " = false is not supported (FP8 weights with zero points)");
  if (w.contains("dynamic") && !w["dynamic"].is_null() && w["dynamic"] != false)
    fail(field(wp + "dynamic"), " = ", w["dynamic"].dump(), " is not supported (weights quantized at run time)");
  if (w.contains("actorder") && !w["actorder"].is_null() && w["actorder"] != false)
    fail(field(wp + "actorder"), " = ", w["actorder"].dump(), " is not supported");
  std::string strategy = get_string(w, "strategy", wp);
  const bool has_group = w.contains("group_size") && !w["group_size"].is_null();
  const int64_t group = has_group && w["group_size"].is_number_integer() ? w["group_size"].get<int64_t>() : 0;
  if (strategy.empty()) strategy = !has_group ? "tensor" : group == -1 ? "channel" : "group";
  HfQuantization::Scales scales;
  int64_t rows = 0, cols = 0;
  if (strategy == "tensor") {
    scales = HfQuantization::Scales::Tensor;
  } else if (strategy == "channel") {
    scales = HfQuantization::Scales::Channel;
  } else if (strategy == "block") {
    scales = HfQuantization::Scales::Block;
    if (!w.contains("block_structure")) fail(field(wp + "block_structure"), " is missing (strategy \"block\")");
    block_shape(w["block_structure"], wp + "block_structure", rows, cols);
  } else {
    fail(field(wp + "strategy"), " = \"", strategy, "\" is not supported (supported: tensor, channel, block)");
  }
  if (has_group && !(strategy == "channel" && group == -1))
    fail(field(wp + "group_size"), " = ", w["group_size"].dump(), " is not supported with strategy \"", strategy,
         "\"");
  if (g.contains("input_activations") && !g["input_activations"].is_null()) {
    const json& a = g["input_activations"];
    const std::string ap = path + "input_activations.";
    if (!a.is_object()) fail(field(ap.substr(0, ap.size() - 1)), " must be an object or null");
    const std::string at = get_string(a, "type", ap, "int");
    const int64_t abits = a.contains("num_bits") && a["num_bits"].is_number_integer() ? a["num_bits"].get<int64_t>() : 8;
    if (at != "float" || abits != 8)
      fail(field(ap + "type"), " = \"", at, "\" with num_bits ", abits,
           " is not supported (supported: float with 8 bits, or null)");
    const bool dynamic = a.contains("dynamic") && a["dynamic"].is_boolean() && a["dynamic"].get<bool>();
    const std::string as = get_string(a, "strategy", ap, "tensor");
    q.activations = str_cat(dynamic ? "dynamic per " : "static per ", as, dynamic ? "" : " (input_scale)");
  } else if (first) {
    q.activations = "none (weight-only)";
  }
  if (first) {
    q.scales = scales;
    q.block_rows = rows;
    q.block_cols = cols;
    q.scheme_field = str_cat(field(wp + "strategy"), " \"", strategy, "\"");
    first = false;
  } else if (q.scales != scales || q.block_rows != rows || q.block_cols != cols) {
    fail(field(wp + "strategy"), " = \"", strategy, "\" differs from the first group's (", q.scheme_field,
         "); Serval loads one weight scheme per checkpoint");
  }
}

HfQuantization parse_compressed_tensors(const json& qc) {
  HfQuantization q;
  q.method = HfQuantization::Method::CompressedTensors;
  const std::string fmt = get_string(qc, "format", "");
  if (fmt != "float-quantized" && fmt != "naive-quantized")
    fail(field("format"), " = \"", fmt,
         "\" is not supported (supported: float-quantized, FP8 e4m3 weights; int-quantized and pack-quantized "
         "are not loaded yet)");
  const std::string status = get_string(qc, "quantization_status", "", "compressed");
  if (status != "compressed")
    fail(field("quantization_status"), " = \"", status, "\" is not supported (supported: compressed)");
  require_unset(qc, "kv_cache_scheme", "", "a quantized KV cache");
  require_unset(qc, "sparsity_config", "", "sparse weights");
  require_unset(qc, "transform_config", "", "weight transforms");
  require_unset(qc, "moe_sparsity_config", "", "expert sparsity");
  if (!qc.contains("config_groups") || !qc["config_groups"].is_object() || qc["config_groups"].empty())
    fail(field("config_groups"), " must be a non-empty object");
  bool first = true;
  for (auto it = qc["config_groups"].begin(); it != qc["config_groups"].end(); ++it)
    parse_ct_group(it.value(), "config_groups." + it.key() + ".", q, first);
  q.ignore = get_strings(qc, "ignore", "");
  for (const auto* list : {&q.targets, &q.ignore})
    for (const std::string& t : *list)
      if (t.rfind("re:", 0) == 0) make_regex(t.substr(3), list == &q.targets ? "config_groups targets" : "ignore");
  q.scale_names = {"weight_scale"};
  return q;
}

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

}  // namespace

bool HfQuantization::quantizes(const std::string& module) const {
  switch (method) {
    case Method::None: return false;
    case Method::Fp8:
      for (const std::string& k : ignore)
        if (fp8_skips(module, k)) return false;
      return true;
    case Method::CompressedTensors: {
      bool targeted = false;
      for (const std::string& t : targets) targeted = targeted || ct_matches(module, t);
      if (!targeted) return false;
      for (const std::string& i : ignore)
        if (i != "Linear" && ct_matches(module, i)) return false;
      return true;
    }
  }
  return false;
}

std::string HfQuantization::describe() const {
  if (method == Method::None) return "none";
  std::string s = method == Method::Fp8 ? "fp8" : "compressed-tensors";
  s += " e4m3 weights, scales ";
  switch (scales) {
    case Scales::Tensor: s += "per tensor"; break;
    case Scales::Channel: s += "per output channel"; break;
    case Scales::Block: s += str_cat("per ", block_rows, "x", block_cols, " block"); break;
    case Scales::BlockOrTensor: s += str_cat("per ", block_rows, "x", block_cols, " block or per tensor"); break;
  }
  return s + "; activations " + activations + ", not emulated";
}

HfQuantization hf_quantization_from_json(const json& j) {
  if (!j.is_object() || !j.contains(kQc) || j[kQc].is_null()) return {};
  const json& qc = j[kQc];
  if (!qc.is_object()) fail(kQc, " must be an object, got ", qc.dump());
  if (!qc.contains("quant_method")) fail(kQc, " has no quant_method");
  const std::string method = get_string(qc, "quant_method", "");
  if (method == "fp8") return parse_fp8(qc);
  if (method == "compressed-tensors") return parse_compressed_tensors(qc);
  fail(field("quant_method"), " = \"", method, "\" is not supported (supported: fp8, compressed-tensors)");
}

void add_hf_quantized_scales(const HfQuantization& q, const std::map<std::string, const SafetensorsTensor*>& tensors,
                             const ModelConfig& config, WeightStore& store) {
  std::set<std::string> quantized_weights;
  for (const LinearModule& m : linear_modules(config)) {
    const std::string wname = m.hf + ".weight";
    auto it = tensors.find(wname);
    if (it == tensors.end()) continue;  // the loader names what is missing
    const SafetensorsTensor& w = *it->second;
    const bool fp8 = w.dtype == "F8_E4M3";
    const bool wanted = q.quantizes(m.hf);
    if (!fp8) {
      // transformers leaves the LM head unquantized unless it is listed.
      if (wanted && !(q.method == HfQuantization::Method::Fp8 && m.hf == "lm_head"))
        fail("tensor \"", wname, "\" is ", w.dtype, " but ", kQc, " quantizes \"", m.hf,
             "\" (expected F8_E4M3 weights with scales)");
      continue;
    }
    if (q.method == HfQuantization::Method::None)
      fail("tensor \"", wname, "\" is F8_E4M3 but config.json has no ", kQc, " to give its scales");
    if (!wanted)
      fail("tensor \"", wname, "\" is F8_E4M3 but ", kQc, " leaves \"", m.hf, "\" unquantized (",
           q.method == HfQuantization::Method::Fp8 ? "modules_to_not_convert" : "ignore / config_groups targets",
           ")");
    const SafetensorsTensor* s = nullptr;
    for (const std::string& n : q.scale_names) {
      auto si = tensors.find(m.hf + "." + n);
      if (si != tensors.end()) {
        s = si->second;
        break;
      }
    }
    if (!s) {
      std::string names;
      for (const std::string& n : q.scale_names) names += (names.empty() ? "\"" : " or \"") + m.hf + "." + n + "\"";
      fail("fp8 weight \"", wname, "\" has no scale tensor (", names, ")");
    }
    if (w.shape != std::vector<int64_t>{m.out, m.in}) continue;  // the loader names the shape mismatch
    const std::vector<int64_t> shape = scale_shape(q, *s, m.out, m.in);
    DType sd;
    try {
      sd = dtype_from_safetensors(s->dtype, s->name);
    } catch (const Error& e) {
      fail(e.what());
    }
    if (sd == DType::FP8_E4M3) fail("tensor \"", s->name, "\" is F8_E4M3; scales must be F32, BF16 or F16");
    int64_t numel = 1;
    for (int64_t d : shape) numel *= d;
    std::vector<float> f(static_cast<size_t>(numel));
    to_f32(sd, s->data, f.data(), numel);
    for (float v : f)
      if (!std::isfinite(v)) fail("tensor \"", s->name, "\" holds a scale that is not finite (", v, ")");
    if (auto zp = tensors.find(m.hf + ".weight_zero_point"); zp != tensors.end()) {
      const SafetensorsTensor& z = *zp->second;
      for (int64_t b = 0; b < z.nbytes; ++b)
        if (z.data[b] != 0) fail("tensor \"", z.name, "\" holds non-zero zero points (asymmetric FP8 is not loaded)");
    }
    std::vector<uint8_t> bytes(f.size() * sizeof(float));
    std::memcpy(bytes.data(), f.data(), bytes.size());
    store.add_owned(fp8_scale_name(gguf_name_from_hf(wname)), DType::F32, shape, std::move(bytes));
    quantized_weights.insert(wname);
  }
  // An F8 tensor anywhere else has no scheme Serval knows.
  for (const auto& [name, t] : tensors)
    if (t->dtype == "F8_E4M3" && !quantized_weights.count(name) && !gguf_name_from_hf(name).empty())
      fail("tensor \"", name, "\" is F8_E4M3, which Serval loads only for the weights of quantized linear layers");
}

}  // namespace serval
