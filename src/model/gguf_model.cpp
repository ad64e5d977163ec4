#include "model/gguf_model.h"

#include "core/error.h"
#include "model/gguf_linear_formats.h"
#include "model/model_def.h"

namespace serval {

namespace {

// Dimensions above this are not a real model and would overflow shape arithmetic.
constexpr int64_t kMaxDim = int64_t(1) << 26;

int64_t get_dim(const GgufFile& f, const std::string& key, int64_t dflt = -1) {
  const int64_t v = dflt < 0 ? f.get_int(key) : f.get_int(key, dflt);
  if (v <= 0 || v > kMaxDim) fail("GGUF \"", f.path(), "\": ", key, " = ", v, " is out of range (1..", kMaxDim, ")");
  return v;
}

RopeScaling read_rope_scaling(const GgufFile& f, const std::string& arch) {
  RopeScaling rs;
  const std::string p = arch + ".rope.scaling.";
  const std::string type = f.get_string(p + "type", "none");
  rs.factor = float(f.get_float(p + "factor", 1.0));
  rs.original_max_position = f.get_int(p + "original_context_length", rs.original_max_position);
  rs.low_freq_factor = float(f.get_float(kLowFreqFactorKey, rs.low_freq_factor));
  rs.high_freq_factor = float(f.get_float(kHighFreqFactorKey, rs.high_freq_factor));
  if (f.find_tensor(kRopeFreqsTensor)) {
    // llama.cpp stores llama3 scaling only as per-frequency divisors.
    rs.type = RopeScaling::Type::Llama3;
  } else if (type == "linear") {
    rs.type = RopeScaling::Type::Linear;
  } else if (type == "none" || (type.empty())) {
    // Older files use rope.scale_linear instead of rope.scaling.*.
    const double lin = f.get_float(arch + ".rope.scale_linear", 1.0);
    if (lin != 1.0) {
      rs.type = RopeScaling::Type::Linear;
      rs.factor = float(lin);
    }
  } else {
    fail("GGUF \"", f.path(), "\": rope scaling type \"", type, "\" is not supported (supported: none, linear, llama3)");
  }
  if (rs.type != RopeScaling::Type::None && !(rs.factor > 0))
    fail("GGUF \"", f.path(), "\": rope scaling factor must be positive, got ", rs.factor);
  return rs;
}

}  // namespace

ModelConfig config_from_gguf(const GgufFile& f) {
  ModelConfig c;
  c.architecture = f.get_string("general.architecture");
  check_architecture_supported(c.architecture);
  const std::string& a = c.architecture;
  c.name = f.get_string("general.name", "");
  c.hidden_size = get_dim(f, a + ".embedding_length");
  c.intermediate_size = get_dim(f, a + ".feed_forward_length");
  c.num_layers = get_dim(f, a + ".block_count");
  c.num_heads = get_dim(f, a + ".attention.head_count");
  c.num_kv_heads = get_dim(f, a + ".attention.head_count_kv", c.num_heads);
  c.head_dim = get_dim(f, a + ".attention.key_length", std::max<int64_t>(1, c.hidden_size / c.num_heads));
  c.rope_dim = get_dim(f, a + ".rope.dimension_count", c.head_dim);
  c.max_position = get_dim(f, a + ".context_length");
  c.rms_eps = float(f.get_float(a + ".attention.layer_norm_rms_epsilon", 1e-5));
  c.rope_theta = float(f.get_float(a + ".rope.freq_base", 10000.0));
  c.rope_scaling = read_rope_scaling(f, a);
  // llama.cpp permutes Hugging Face q/k rows for "llama" so that RoPE rotates
  // adjacent pairs; qwen2/qwen3 are stored unpermuted.
  c.rope_style = a == "llama" ? RopeStyle::Interleaved : RopeStyle::Neox;
  // Mistral's GGUF is llama's; a sliding_window key (ours, or a converter's) makes it mistral.
  if (a == "llama" && f.get_int("llama.attention.sliding_window", 0) > 0) {
    c.sliding_window = get_dim(f, "llama.attention.sliding_window");
    c.architecture = "mistral";
  }

  const GgufTensorInfo* embd = f.find_tensor("token_embd.weight");
  if (!embd) fail("GGUF \"", f.path(), "\": missing tensor \"token_embd.weight\"");
  if (embd->ne.size() != 2)
    fail("GGUF \"", f.path(), "\": tensor \"token_embd.weight\" must have 2 dimensions, has ", embd->ne.size());
  c.vocab_size = embd->ne[1];
  c.tie_word_embeddings = f.find_tensor("output.weight") == nullptr;
  c.attention_bias = f.find_tensor("blk.0.attn_q.bias") != nullptr;
  c.qk_norm = f.find_tensor("blk.0.attn_q_norm.weight") != nullptr;
  try {
    c.validate();
  } catch (const Error& e) {
    fail("GGUF \"", f.path(), "\": ", e.what());
  }
  return c;
}

LoadedModel load_gguf_model(std::shared_ptr<GgufFile> file) {
  LoadedModel m;
  m.config = config_from_gguf(*file);
  m.path = file->path();
  m.format = "gguf";
  auto add = [&](const GgufTensorInfo& t) {
    TensorView v;
    v.name = t.name;
    // Serval's quantized weights are I8 in the file, a type no other tensor may
    // have (model/gguf_linear_formats.h); fp8's bytes are e4m3.
    if (const auto it = m.config.linear_formats.find(t.name); it != m.config.linear_formats.end())
      v.dtype = it->second.kind == LinearFormat::Kind::Fp8 ? DType::FP8_E4M3 : DType::I8;
    else
      v.dtype = dtype_from_ggml(t.ggml_type, t.name);
    v.shape = t.shape();
    v.data = t.data;
    v.nbytes = t.nbytes;
    m.weights.add(std::move(v));
  };
  try {
    m.config.linear_formats = read_linear_formats(*file);
    // Tensors the model needs must have a supported type; others are kept when we
    // can describe them and skipped otherwise.
    ModelDef::of(m.config).for_each_tensor([&](const TensorSpec& e) {
      const GgufTensorInfo* t = file->find_tensor(e.name);
      if (!t) fail("missing tensor \"", e.name, "\"");
      add(*t);
    });
    for (const GgufTensorInfo& t : file->tensors()) {
      if (m.weights.find(t.name)) continue;
      if (t.name == kRopeFreqsTensor) {
        add(t);
        continue;
      }
      if (supported_dtype_of_ggml(t.ggml_type)) add(t);
    }
    ModelDef::of(m.config).check_weights(m.weights);
  } catch (const Error& e) {
    fail("GGUF \"", file->path(), "\": ", e.what());
  }
  m.weights.keep_alive(file);
  return m;
}

LoadedModel load_gguf_model(const std::string& path) { return load_gguf_model(GgufFile::open(path)); }

}  // namespace serval
