#pragma once
// `serval quantize` for the GGUF block types: a float GGUF model rewritten with
// its weight matrices in one block type (round to nearest, core/dtype.h's
// from_f32), everything else (metadata, tokenizer, norms, biases) as it was.
// The file loads in Serval and in llama.cpp.
#include <string>
#include <vector>

#include "core/dtype.h"

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

}  // namespace serval
