#pragma once
// Serval's own quantized tensor types inside a GGUF file, for the Linear
// formats GGUF has no type for (int8 per channel, int4 grouped, fp8 e4m3 per
// row; docs/QUANTIZED_CHECKPOINTS.md). A quantized weight W keeps its GGUF
// name and is stored as GGML type I8:
//   int8: [out, in] int8 codes;  int4: [out, in / 2] codes, two per byte, low
//   nibble first;  fp8: [out, in] raw e4m3fn bytes.
// beside F32 companions "W.scale" ([out] for int8 and fp8, [out, in / group]
// for int4) and, for asymmetric int4, "W.zero" ([out, in / group], integers
// 0..15 as f32): w = q * scale, or (q - zero) * scale (zero 8 when symmetric).
// Metadata names every quantized weight's format, so the loader never guesses:
//   serval.quantization.version          u32   1
//   serval.quantization.format.W         str   "int8" | "int4" | "fp8"
//   serval.quantization.group_size.W     u32   int4 only: 32, 64, 128, ...
//   serval.quantization.symmetric.W      bool  int4 only
#include <map>
#include <string>

#include "model/gguf.h"
#include "model/linear.h"

namespace serval {

inline constexpr const char* kServalQuantVersionKey = "serval.quantization.version";
inline constexpr int64_t kServalQuantVersion = 1;

// The companion tensors' names.
std::string linear_scale_name(const std::string& weight);  // "W.scale"
std::string linear_zero_name(const std::string& weight);   // "W.zero"

// Writes the metadata that names `weight`'s format (the version key too).
void write_linear_format(GgufWriter& w, const std::string& weight, const LinearFormat& f);

// The formats `f` names, by weight name; empty for a file without
// serval.quantization keys. Throws serval::Error naming the key (or tensor)
// and the problem: an unknown version or format name, an unknown key, a
// missing or odd group size, a named tensor that is missing or not I8.
std::map<std::string, LinearFormat> read_linear_formats(const GgufFile& f);

// The Linear of the quantized weight `name` of `store` in format `f`: the
// weight, its scales and zero points checked against [out, in] (throws naming
// the tensor: a missing or mis-shaped companion, a group size that does not
// divide `in`).
Linear load_stored_linear(const WeightStore& store, const std::string& name, const LinearFormat& f, int64_t out,
                          int64_t in);

}  // namespace serval
