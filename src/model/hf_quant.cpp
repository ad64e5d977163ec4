// quantization_config of Hugging Face folders read and checked: fp8,
// compressed-tensors, awq, gptq (see hf_quant.h); the tensors are
// hf_quant_weights.cpp's.
#include "model/hf_quant.h"

#include <algorithm>
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

// An integer member, or `dflt` when absent or null; throws when not an integer.
int64_t get_int(const json& j, const std::string& key, const std::string& path, int64_t dflt) {
  if (!j.contains(key) || j[key].is_null()) return dflt;
  if (!j[key].is_number_integer()) fail(field(path + key), " must be an integer, got ", j[key].dump());
  return j[key].get<int64_t>();
}

// A group size of int weights: a positive even number of at most 2^20.
int64_t group_size(const json& j, const std::string& key, const std::string& path) {
  const int64_t g = get_int(j, key, path, 0);
  if (g <= 0 || g % 2 != 0 || g > (1 << 20))
    fail(field(path + key), " = ", j[key].dump(), " is not supported (a positive even number of inputs)");
  return g;
}

// The activations a compressed-tensors group asks for, for `describe`.
std::string ct_activations(const json& g, const std::string& path) {
  if (!g.contains("input_activations") || g["input_activations"].is_null()) return "none (weight-only)";
  const json& a = g["input_activations"];
  const std::string ap = path + "input_activations.";
  if (!a.is_object()) fail(field(ap.substr(0, ap.size() - 1)), " must be an object or null");
  const std::string at = get_string(a, "type", ap, "int");
  const int64_t abits = a.contains("num_bits") && a["num_bits"].is_number_integer() ? a["num_bits"].get<int64_t>() : 8;
  if ((at != "float" && at != "int") || abits != 8)
    fail(field(ap + "type"), " = \"", at, "\" with num_bits ", abits,
         " is not supported (supported: 8-bit float or int, or null)");
  const bool dynamic = a.contains("dynamic") && a["dynamic"].is_boolean() && a["dynamic"].get<bool>();
  const std::string as = get_string(a, "strategy", ap, "tensor");
  return str_cat(at == "int" ? "int8" : "fp8", dynamic ? " dynamic per " : " static per ", as,
                 dynamic ? "" : " (input_scale)");
}

// One config group's scheme; `path` "config_groups.NAME.", `format` the
// config's format.
void parse_ct_group(const json& g, const std::string& path, const std::string& format, HfQuantization& q,
                    bool& first) {
  using S = HfQuantization::Scales;
  using St = HfQuantization::Storage;
  if (g.is_array())
    fail(field(path.substr(0, path.size() - 1)), " is a preset scheme name with targets ", g.dump(),
         "; Serval reads only written-out schemes (targets, weights, input_activations)");
  if (!g.is_object()) fail(field(path.substr(0, path.size() - 1)), " must be an object");
  for (const std::string& t : get_strings(g, "targets", path)) q.targets.push_back(t);
  const std::string fmt = get_string(g, "format", path);
  if (!fmt.empty() && fmt != format)
    fail(field(path + "format"), " = \"", fmt, "\" differs from ", field("format"), " \"", format,
         "\" (one format per checkpoint is loaded)");
  require_unset(g, "output_activations", path, "output quantization");
  if (!g.contains("weights") || !g["weights"].is_object())
    fail(field(path + "weights"), " must be an object (Serval loads quantized weights only)");
  const json& w = g["weights"];
  const std::string wp = path + "weights.";
  const int64_t bits = get_int(w, "num_bits", wp, 8);
  const std::string type = get_string(w, "type", wp, "int");
  St storage;
  if (type == "float" && bits == 8 && (format == "float-quantized" || format == "naive-quantized")) {
    storage = St::Fp8;
  } else if (type == "int" && bits == 8 && (format == "int-quantized" || format == "naive-quantized")) {
    storage = St::Int8;
  } else if (type == "int" && (bits == 4 || bits == 8) && format == "pack-quantized") {
    storage = St::CtPacked;
  } else {
    fail(field(wp + "type"), " = \"", type, "\" with ", field(wp + "num_bits"), " = ", bits, " is not supported in ",
         field("format"), " \"", format,
         "\" (supported: float-quantized with 8-bit float, int-quantized with 8-bit int, pack-quantized with 4- "
         "or 8-bit int)");
  }
  const bool symmetric = get_bool(w, "symmetric", wp, true);
  if (!symmetric && !(storage == St::CtPacked && bits == 4))
    fail(field(wp + "symmetric"), " = false is not supported with ", bits, "-bit ", type,
         " weights (zero points load for 4-bit packed weights only)");
  if (w.contains("dynamic") && !w["dynamic"].is_null() && w["dynamic"] != false)
    fail(field(wp + "dynamic"), " = ", w["dynamic"].dump(), " is not supported (weights quantized at run time)");
  bool act_order = false;
  if (w.contains("actorder") && !w["actorder"].is_null() && w["actorder"] != false) {
    const std::string ao = w["actorder"].is_string() ? w["actorder"].get<std::string>() : "";
    if (storage != St::CtPacked || (ao != "group" && ao != "weight" && ao != "static" && ao != "dynamic"))
      fail(field(wp + "actorder"), " = ", w["actorder"].dump(), " is not supported with ", type, " ", bits,
           "-bit weights (pack-quantized reads group, weight, static or dynamic)");
    act_order = ao == "group" || ao == "dynamic";
  }
  std::string strategy = get_string(w, "strategy", wp);
  const bool has_group = w.contains("group_size") && !w["group_size"].is_null();
  const int64_t group = has_group && w["group_size"].is_number_integer() ? w["group_size"].get<int64_t>() : 0;
  if (strategy.empty()) strategy = !has_group ? "tensor" : group == -1 ? "channel" : "group";
  S scales;
  int64_t rows = 0, cols = 0, gsize = 0;
  const bool int4 = storage == St::CtPacked && bits == 4;
  if (strategy == "tensor" && storage != St::CtPacked) {
    scales = S::Tensor;
  } else if (strategy == "channel") {
    scales = S::Channel;
  } else if (strategy == "block" && storage == St::Fp8) {
    scales = S::Block;
    if (!w.contains("block_structure")) fail(field(wp + "block_structure"), " is missing (strategy \"block\")");
    block_shape(w["block_structure"], wp + "block_structure", rows, cols);
  } else if (strategy == "group" && int4) {
    scales = S::Group;
    gsize = group_size(w, "group_size", wp);
  } else {
    fail(field(wp + "strategy"), " = \"", strategy, "\" is not supported with ", bits, "-bit ", type,
         " weights (supported: ",
         storage == St::Fp8 ? "tensor, channel, block" : int4 ? "group, channel" : storage == St::Int8 ? "tensor, channel"
                                                                                                       : "channel",
         ")");
  }
  if (has_group && !(strategy == "channel" && group == -1) && scales != S::Group)
    fail(field(wp + "group_size"), " = ", w["group_size"].dump(), " is not supported with strategy \"", strategy,
         "\"");
  const std::string acts = ct_activations(g, path);
  if (first) {
    q.storage = storage;
    q.scales = scales;
    q.block_rows = rows;
    q.block_cols = cols;
    q.bits = bits;
    q.group_size = gsize;
    q.symmetric = symmetric;
    q.act_order = act_order;
    q.activations = acts;
    q.scheme_field = scales == S::Group ? str_cat(field(wp + "group_size"), " ", gsize)
                                        : str_cat(field(wp + "strategy"), " \"", strategy, "\"");
    first = false;
  } else if (q.storage != storage || q.scales != scales || q.block_rows != rows || q.block_cols != cols ||
             q.bits != bits || q.group_size != gsize || q.symmetric != symmetric) {
    fail(field(wp.substr(0, wp.size() - 1)), " = ", w.dump(), " differs from the first group's (",
         q.scheme_field, "); Serval loads one weight scheme per checkpoint");
  }
}

// compressed-tensors' kv_cache_scheme: static symmetric 8-bit K/V scales
// per tensor or per head, stored as `self_attn.k_scale` / `v_scale`
// (--kv-cache-dtype reads them). Returns their codes' largest value: 448
// (fp8 e4m3) or 127 (int8); 0 without a scheme.
float parse_kv_cache_scheme(const json& qc) {
  if (!qc.contains("kv_cache_scheme") || qc["kv_cache_scheme"].is_null()) return 0;
  const json& k = qc["kv_cache_scheme"];
  const std::string path = "kv_cache_scheme.";
  if (!k.is_object()) fail(field("kv_cache_scheme"), " = ", k.dump(), " must be an object");
  const std::string type = get_string(k, "type", path, "float");
  const int64_t bits = get_int(k, "num_bits", path, 8);
  if ((type != "float" && type != "int") || bits != 8)
    fail(field(path + "type"), " = \"", type, "\" with ", field(path + "num_bits"), " = ", bits,
         " is not supported (supported: 8-bit float or int)");
  const std::string strategy = get_string(k, "strategy", path, "tensor");
  if (strategy != "tensor" && strategy != "attn_head" && strategy != "channel")
    fail(field(path + "strategy"), " = \"", strategy, "\" is not supported (supported: tensor, attn_head)");
  if (get_bool(k, "dynamic", path, false))
    fail(field(path + "dynamic"), " = true is not supported (scales computed per step)");
  if (!get_bool(k, "symmetric", path, true))
    fail(field(path + "symmetric"), " = false is not supported (KV zero points)");
  return type == "float" ? 448.0f : 127.0f;
}

HfQuantization parse_compressed_tensors(const json& qc) {
  HfQuantization q;
  q.method = HfQuantization::Method::CompressedTensors;
  const std::string fmt = get_string(qc, "format", "");
  if (fmt != "float-quantized" && fmt != "naive-quantized" && fmt != "int-quantized" && fmt != "pack-quantized")
    fail(field("format"), " = \"", fmt,
         "\" is not supported (supported: float-quantized, int-quantized, pack-quantized, naive-quantized)");
  const std::string status = get_string(qc, "quantization_status", "", "compressed");
  if (status != "compressed")
    fail(field("quantization_status"), " = \"", status, "\" is not supported (supported: compressed)");
  q.kv_code_max = parse_kv_cache_scheme(qc);
  require_unset(qc, "sparsity_config", "", "sparse weights");
  require_unset(qc, "transform_config", "", "weight transforms");
  require_unset(qc, "moe_sparsity_config", "", "expert sparsity");
  if (!qc.contains("config_groups") || !qc["config_groups"].is_object() || qc["config_groups"].empty())
    fail(field("config_groups"), " must be a non-empty object");
  bool first = true;
  for (auto it = qc["config_groups"].begin(); it != qc["config_groups"].end(); ++it)
    parse_ct_group(it.value(), "config_groups." + it.key() + ".", fmt, q, first);
  q.ignore = get_strings(qc, "ignore", "");
  for (const auto* list : {&q.targets, &q.ignore})
    for (const std::string& t : *list)
      if (t.rfind("re:", 0) == 0) make_regex(t.substr(3), list == &q.targets ? "config_groups targets" : "ignore");
  q.scale_names = {"weight_scale"};
  return q;
}

// Bits and group size of AWQ and GPTQ (group_size -1: one group per row).
void int_scheme(const json& qc, HfQuantization& q, const std::vector<int64_t>& bits_ok, const char* bits_key,
                const char* group_key) {
  q.bits = get_int(qc, bits_key, "", 4);
  if (std::find(bits_ok.begin(), bits_ok.end(), q.bits) == bits_ok.end())
    fail(field(bits_key), " = ", q.bits, " is not supported (supported: ", bits_ok.size() == 1 ? "4" : "4, 8", ")");
  if (get_int(qc, group_key, "", 128) == -1) {
    q.scales = HfQuantization::Scales::Channel;
  } else {
    q.scales = HfQuantization::Scales::Group;
    q.group_size = group_size(qc, group_key, "");
  }
  q.scheme_field = str_cat(field(group_key), " ", q.scales == HfQuantization::Scales::Channel ? -1 : q.group_size);
  q.activations = "none (weight-only)";
}

HfQuantization parse_awq(const json& qc) {
  HfQuantization q;
  q.method = HfQuantization::Method::Awq;
  q.storage = HfQuantization::Storage::Awq;
  const std::string version = get_string(qc, "version", "", "gemm");
  std::string v = version;
  for (char& ch : v) ch = char(std::tolower(static_cast<unsigned char>(ch)));  // AutoAWQ writes "GEMM" too
  if (v != "gemm")
    fail(field("version"), " = \"", version, "\" is not supported (supported: gemm; gemv, gemv_fast, exllama, marlin ",
         "and ipex pack differently)");
  const std::string backend = get_string(qc, "backend", "", "autoawq");
  if (backend != "autoawq") fail(field("backend"), " = \"", backend, "\" is not supported (supported: autoawq)");
  const bool has_bits = qc.contains("bits") && !qc["bits"].is_null();
  const bool has_group = qc.contains("group_size") && !qc["group_size"].is_null();
  int_scheme(qc, q, {4}, has_bits || !qc.contains("w_bit") ? "bits" : "w_bit",
             has_group || !qc.contains("q_group_size") ? "group_size" : "q_group_size");
  if (q.scales != HfQuantization::Scales::Group)
    fail(field("group_size"), " = -1 is not supported for awq (one group per row)");
  if (!get_bool(qc, "zero_point", "", true))
    fail(field("zero_point"), " = false is not supported (AutoAWQ's GEMM weights have zero points)");
  q.symmetric = false;
  require_unset(qc, "modules_to_fuse", "", "fused modules");
  q.ignore = get_strings(qc, "modules_to_not_convert", "");
  return q;
}

HfQuantization parse_gptq(const json& qc) {
  HfQuantization q;
  q.method = HfQuantization::Method::Gptq;
  q.storage = HfQuantization::Storage::Gptq;
  int_scheme(qc, q, {4, 8}, "bits", "group_size");
  q.symmetric = get_bool(qc, "sym", "", true);
  q.act_order = get_bool(qc, "desc_act", "", false);
  if (q.bits == 8 && (q.scales != HfQuantization::Scales::Channel || !q.symmetric))
    fail(field("bits"), " = 8 is supported with ", field("group_size"), " = -1 and ", field("sym"),
         " = true only (int8 per channel); got group_size ", q.scales == HfQuantization::Scales::Channel ? -1 : q.group_size,
         ", sym ", q.symmetric ? "true" : "false");
  // AutoGPTQ and transformers write checkpoint_format; older configs (and GPTQModel) format.
  const char* key = qc.contains("checkpoint_format") && !qc["checkpoint_format"].is_null() ? "checkpoint_format" : "format";
  const std::string fmt = get_string(qc, key, "", "gptq");
  if (fmt == "gptq") q.zeros_minus_one = true;
  else if (fmt != "gptq_v2")
    fail(field(key), " = \"", fmt, "\" is not supported (supported: gptq, gptq_v2)");
  const std::string pack = get_string(qc, "pack_dtype", "", "int32");
  if (pack != "int32") fail(field("pack_dtype"), " = \"", pack, "\" is not supported (supported: int32)");
  require_unset(qc, "dynamic", "", "per-module overrides");
  return q;
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
    case Method::Awq:
      // AutoAWQ skips a module whose name contains an entry.
      for (const std::string& k : ignore)
        if (module.find(k) != std::string::npos) return false;
      return true;
    case Method::Gptq: return true;
  }
  return false;
}

std::string HfQuantization::method_name() const {
  switch (method) {
    case Method::None: return "";
    case Method::Fp8: return "fp8";
    case Method::CompressedTensors: return "compressed-tensors";
    case Method::Awq: return "awq";
    case Method::Gptq: return "gptq";
  }
  return "";
}

std::string HfQuantization::describe() const {
  if (method == Method::None) return "none";
  std::string s = method_name();
  switch (storage) {
    case Storage::Fp8: s += ": fp8 e4m3 weights"; break;
    case Storage::Int8: s += ": int8 weights"; break;
    case Storage::CtPacked:
    case Storage::Awq:
    case Storage::Gptq:
      s += str_cat(": int", bits, " weights", bits == 4 ? (symmetric ? " (symmetric)" : " with zero points") : "",
                   zeros_minus_one ? " (v1 zero points, stored minus one)" : "");
      break;
  }
  s += ", scales ";
  switch (scales) {
    case Scales::Tensor: s += "per tensor"; break;
    case Scales::Channel: s += "per output channel"; break;
    case Scales::Block: s += str_cat("per ", block_rows, "x", block_cols, " block"); break;
    case Scales::BlockOrTensor: s += str_cat("per ", block_rows, "x", block_cols, " block or per tensor"); break;
    case Scales::Group: s += str_cat("per group of ", group_size); break;
  }
  if (act_order) s += "; act-order weights whose g_idx reorders groups are dequantized to f32 at load";
  s += "; activations " + activations;
  return activations.rfind("none", 0) == 0 ? s : s + ", not emulated";
}

HfQuantization hf_quantization_from_json(const json& j) {
  if (!j.is_object() || !j.contains(kQc) || j[kQc].is_null()) return {};
  const json& qc = j[kQc];
  if (!qc.is_object()) fail(kQc, " must be an object, got ", qc.dump());
  if (!qc.contains("quant_method")) fail(kQc, " has no quant_method");
  const std::string method = get_string(qc, "quant_method", "");
  if (method == "fp8") return parse_fp8(qc);
  if (method == "compressed-tensors") return parse_compressed_tensors(qc);
  if (method == "awq") return parse_awq(qc);
  if (method == "gptq") return parse_gptq(qc);
  fail(field("quant_method"), " = \"", method, "\" is not supported (supported: fp8, compressed-tensors, awq, gptq)");
}

}  // namespace serval
