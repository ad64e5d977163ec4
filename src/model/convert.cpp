// serval convert: llama2.c checkpoints and Hugging Face folders to GGUF.
#include "model/convert.h"

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "model/gguf_model.h"
#include "model/hf_model.h"
#include "model/model_def.h"
#include "model/qk_permute.h"
#include "model/rope_factors.h"
#include "tokenizer/tokenizer_gguf.h"

namespace serval {

namespace fs = std::filesystem;

void set_gguf_model_metadata(GgufWriter& w, const ModelConfig& c) {
  const std::string& a = c.architecture;
  w.set_string("general.architecture", a);
  if (!c.name.empty()) w.set_string("general.name", c.name);
  w.set_u32(a + ".context_length", uint32_t(c.max_position));
  w.set_u32(a + ".embedding_length", uint32_t(c.hidden_size));
  w.set_u32(a + ".feed_forward_length", uint32_t(c.intermediate_size));
  w.set_u32(a + ".block_count", uint32_t(c.num_layers));
  w.set_u32(a + ".attention.head_count", uint32_t(c.num_heads));
  w.set_u32(a + ".attention.head_count_kv", uint32_t(c.num_kv_heads));
  w.set_u32(a + ".attention.key_length", uint32_t(c.head_dim));
  w.set_u32(a + ".attention.value_length", uint32_t(c.head_dim));
  w.set_u32(a + ".rope.dimension_count", uint32_t(c.rope_dim));
  w.set_f32(a + ".attention.layer_norm_rms_epsilon", c.rms_eps);
  w.set_f32(a + ".rope.freq_base", c.rope_theta);
  switch (c.rope_scaling.type) {
    case RopeScaling::Type::None: break;
    case RopeScaling::Type::Linear:
      w.set_string(a + ".rope.scaling.type", "linear");
      w.set_f32(a + ".rope.scaling.factor", c.rope_scaling.factor);
      break;
    case RopeScaling::Type::Llama3:
      // llama.cpp keeps only the rope_freqs.weight tensor; the factors that made it
      // go into our own keys so that the config round-trips.
      w.set_f32(a + ".rope.scaling.factor", c.rope_scaling.factor);
      w.set_u32(a + ".rope.scaling.original_context_length", uint32_t(c.rope_scaling.original_max_position));
      w.set_f32(kLowFreqFactorKey, c.rope_scaling.low_freq_factor);
      w.set_f32(kHighFreqFactorKey, c.rope_scaling.high_freq_factor);
      break;
  }
}

uint32_t gguf_file_type_of(DType t) {
  switch (t) {
    case DType::F32: return 0;
    case DType::F16: return 1;
    case DType::Q4_0: return 2;
    case DType::Q4_1: return 3;
    case DType::Q8_0: return 7;
    case DType::Q5_0: return 8;
    case DType::Q5_1: return 9;
    case DType::Q2_K: return 10;
    case DType::Q3_K: return 11;  // the _S variants: every matrix of the one type
    case DType::Q4_K: return 14;
    case DType::Q5_K: return 16;
    case DType::Q6_K: return 18;
    case DType::BF16: return 32;
    default: return 0;
  }
}

namespace {

// Token pieces of llama2.c are raw text; GGUF "llama" vocabularies use SentencePiece's
// "▁" for spaces and bare <s>/</s> for the control tokens.
std::string gguf_piece_from_llama2c(const std::string& p) {
  if (p == "\n<s>\n") return "<s>";
  if (p == "\n</s>\n") return "</s>";
  std::string out;
  for (char ch : p) {
    if (ch == ' ') out += "\xe2\x96\x81";
    else out += ch;
  }
  return out;
}

bool is_byte_piece(const std::string& p) {
  return p.size() == 6 && p.compare(0, 3, "<0x") == 0 && p[5] == '>' && std::isxdigit(uint8_t(p[3])) &&
         std::isxdigit(uint8_t(p[4]));
}

}  // namespace

void set_gguf_tokenizer_from_llama2c(GgufWriter& w, const Llama2cVocab& vocab) {
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  for (size_t i = 0; i < vocab.pieces.size(); ++i) {
    const std::string piece = gguf_piece_from_llama2c(vocab.pieces[i]);
    GgufTokenType t = GgufTokenType::Normal;
    if (i == 0) t = GgufTokenType::Unknown;
    else if (i == 1 || i == 2) t = GgufTokenType::Control;
    else if (is_byte_piece(piece)) t = GgufTokenType::Byte;
    tokens.push_back(piece);
    types.push_back(int32_t(t));
  }
  w.set_string("tokenizer.ggml.model", "llama");
  w.set_string_array("tokenizer.ggml.tokens", tokens);
  w.set_f32_array("tokenizer.ggml.scores", vocab.scores);
  w.set_i32_array("tokenizer.ggml.token_type", types);
  w.set_u32("tokenizer.ggml.unknown_token_id", 0);
  w.set_u32("tokenizer.ggml.bos_token_id", 1);
  w.set_u32("tokenizer.ggml.eos_token_id", 2);
  w.set_bool("tokenizer.ggml.add_bos_token", true);
  w.set_bool("tokenizer.ggml.add_eos_token", false);
}

void convert_llama2c_to_gguf(const std::string& bin_path, const std::string& tokenizer_path,
                             const std::string& out_path) {
  LoadedModel m = load_llama2c_model(bin_path);
  const Llama2cVocab vocab = read_llama2c_tokenizer(tokenizer_path);
  if (int64_t(vocab.pieces.size()) != m.config.vocab_size)
    fail("llama2.c tokenizer \"", tokenizer_path, "\" has ", vocab.pieces.size(), " tokens but the checkpoint \"",
         bin_path, "\" has a vocabulary of ", m.config.vocab_size);
  GgufWriter w;
  ModelConfig c = m.config;
  c.name = "llama";
  set_gguf_model_metadata(w, c);
  w.set_u32("general.file_type", 0);
  set_gguf_tokenizer_from_llama2c(w, vocab);
  // Like llama.cpp's convert-llama2c-to-ggml: weights copied unpermuted (llama2.c
  // already rotates adjacent pairs), and the tied classifier written out as
  // output.weight. Tensor order follows that converter.
  auto add = [&](const std::string& name, const std::string& from) {
    const TensorView& t = m.weights.get(from);
    w.add_tensor(name, t.dtype, t.shape, t.data, t.nbytes);
  };
  add("token_embd.weight", "token_embd.weight");
  add("output_norm.weight", "output_norm.weight");
  add("output.weight", m.weights.find("output.weight") ? "output.weight" : "token_embd.weight");
  for (int64_t l = 0; l < c.num_layers; ++l) {
    for (const char* n : {"attn_q", "attn_k", "attn_v", "attn_output", "attn_norm", "ffn_gate", "ffn_down", "ffn_up",
                          "ffn_norm"}) {
      const std::string name = str_cat("blk.", l, ".", n, ".weight");
      add(name, name);
    }
  }
  w.write(out_path);
}

void convert_hf_to_gguf(const std::string& dir, const std::string& out_path) {
  LoadedModel m = load_hf_model(dir);
  SERVAL_CHECK(m.config.quant_method.empty(), "convert: \"", dir, "\" is a quantized checkpoint (quantization_config ",
               "quant_method \"", m.config.quant_method, "\"), which GGUF has no types for; serve the folder as it is");
  // Mistral is llama.cpp's "llama", its window in the sliding_window key
  // (which llama.cpp reads for other families; our reader makes it mistral again).
  ModelConfig c = m.config;
  if (c.architecture == "mistral") c.architecture = "llama";
  SERVAL_CHECK(c.sliding_window == 0 || m.config.architecture == "mistral", "convert: \"", dir, "\" has ",
               m.config.architecture, " sliding-window layers, which GGUF has no keys for; serve the folder as it is");
  GgufWriter w;
  set_gguf_model_metadata(w, c);
  if (c.sliding_window > 0) w.set_u32("llama.attention.sliding_window", uint32_t(c.sliding_window));
  const TensorView& embd = m.weights.get("token_embd.weight");
  w.set_u32("general.file_type", gguf_file_type_of(embd.dtype));
  add_tokenizer_metadata(dir, w);

  // llama: Hugging Face rows are in rotate_half order; llama.cpp's "llama" GGUF
  // has them interleaved, so q/k (and their biases) are permuted per head.
  const bool permute = c.architecture == "llama";
  for (const TensorSpec& e : ModelDef::of(m.config).tensors()) {
    const TensorView& t = m.weights.get(e.name);
    int64_t n_head = 0;
    if (permute && (e.name.find(".attn_q.") != std::string::npos)) n_head = c.num_heads;
    if (permute && (e.name.find(".attn_k.") != std::string::npos)) n_head = c.num_kv_heads;
    if (n_head == 0) {
      w.add_tensor(t.name, t.dtype, t.shape, t.data, t.nbytes);
      continue;
    }
    const int64_t rows = t.shape[0];
    const int64_t row_bytes = t.nbytes / rows;
    w.add_tensor_generated(t.name, t.dtype, t.shape, [&t, n_head, row_bytes, hd = c.head_dim](void* dst, int64_t) {
      permute_qk_rows(t.data, dst, n_head, hd, row_bytes);
    });
  }
  // llama3 scaling as llama.cpp stores it (the HF loader computed the factors).
  if (const TensorView* f = m.weights.find(kRopeFreqsTensor)) w.add_tensor(f->name, f->dtype, f->shape, f->data, f->nbytes);
  w.write(out_path);
}

void convert_to_gguf(const std::string& input, const std::string& tokenizer, const std::string& out_path) {
  std::error_code ec;
  if (!fs::exists(input, ec)) fail("convert: input \"", input, "\" does not exist");
  if (fs::is_directory(input, ec)) {
    if (!fs::exists(fs::path(input) / "config.json"))
      fail("convert: folder \"", input, "\" has no config.json (expected a Hugging Face model folder)");
    convert_hf_to_gguf(input, out_path);
    return;
  }
  {
    char magic[4] = {};
    std::ifstream(input, std::ios::binary).read(magic, 4);
    if (std::memcmp(magic, "GGUF", 4) == 0) fail("convert: \"", input, "\" is already a GGUF file");
  }
  std::string tok = tokenizer;
  if (tok.empty()) {
    tok = (fs::path(input).parent_path() / "tokenizer.bin").string();
    if (!fs::exists(tok))
      fail("convert: \"", input, "\" is a llama2.c checkpoint and needs its tokenizer: pass --tokenizer tokenizer.bin");
  }
  convert_llama2c_to_gguf(input, tok, out_path);
}

}  // namespace serval
