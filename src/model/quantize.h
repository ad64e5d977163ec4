#pragma once
// `serval quantize` for the GGUF block types: a float GGUF model rewritten with
// its weight matrices in one block type (round to nearest, core/dtype.h's
// from_f32), everything else (metadata, tokenizer, norms, biases) as it was.
// The file loads in Serval and in llama.cpp.
#include <string>
#include <vector>

#include "core/dtype.h"
#include "model/awq.h"
#include "model/linear.h"

namespace serval {

struct QuantizedTensor {
  std::string name;
  DType from, to;
  std::string note;  // why `to` is not the type asked for ("" when it is)
};

// The type a matrix of `cols` columns gets when `want` is asked for: `want`
// where its blocks divide the rows, else the nearest 32-element type of at
// least as many bits (Q2_K..Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0), else F16
// (as llama-quantize falls back).
DType quantized_type_for(DType want, int64_t cols);

// Writes `out_path`: `in_path` (a GGUF model whose matrices are F32, F16 or
// BF16) with every 2-D weight, the embedding and the LM head included, in
// `to` (a GGUF block type) or its fallback. Returns what each matrix became.
// Throws serval::Error for a type that is not a block type, a matrix that is
// already quantized (quantize from the float model), or an unreadable file.
std::vector<QuantizedTensor> quantize_gguf(const std::string& in_path, const std::string& out_path, DType to);

// What `serval quantize --to int8|int4|fp8` made of one matrix.
struct LinearQuantized {
  std::string name;
  LinearFormat format;
  std::string note;    // why `format` is not the one asked for, or how the tied LM head was written
  bool fallback = false;  // `format` is wider than asked (the note says why)
};

// Writes `out_path`: `in_path` (a float GGUF model) with its linear layers'
// weight matrices, the LM head included, in `want` (Int8PerChannel,
// Int4Grouped or Fp8 per row; round to nearest, model/rtn_quantize.h), as
// Serval's own GGUF types (model/gguf_linear_formats.h). The token embedding
// keeps its float type (the embedding lookup reads it); a model whose LM head
// is tied to it gets a separate, quantized output.weight. An int4 matrix
// whose width the group size does not divide is written int8 per channel.
// `replace` (may be null) gives some tensors new f32 values (the calibrated
// scaling of model/awq.h): a matrix is quantized from them, a vector written
// as F32. Throws serval::Error for a matrix that is not f32, f16 or bf16, a
// non-finite weight, a replacement of another shape, or an unreadable file.
std::vector<LinearQuantized> quantize_gguf_linear(const std::string& in_path, const std::string& out_path,
                                                  const LinearFormat& want, const FloatWeights* replace = nullptr);

// The float tensors of the GGUF model at `path` that awq_scale_model reads
// (each layer's norms, attention and MLP matrices, attn_v.bias), in f32.
FloatWeights read_layer_tensors(const std::string& path, int64_t num_layers);

}  // namespace serval
