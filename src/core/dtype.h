#pragma once
// Element types of tensors and weights, and conversions between them.
// Block-quantized types follow GGUF's layouts: Q8_0, Q4_0, Q4_1, Q5_0 and Q5_1 in
// blocks of 32 elements (core/block_quants.h), the K-quants Q2_K..Q6_K in
// super-blocks of 256 (core/k_quants.h).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace serval {

// New values go at the end, so that the existing ones keep their numbers.
enum class DType : uint8_t {
  F32, F16, BF16, Q8_0, Q4_0, I8, I32, FP8_E4M3,
  Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K,
};

std::string_view dtype_name(DType t);
// Parses the name of a type that from_f32 can write: "f32", "f16", "bf16", "q8_0",
// "q4_0", "q4_1", "q5_0", "q5_1", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k"
// (case-insensitive); throws on others.
DType parse_dtype(std::string_view name);

// Elements per block (1 for plain types, 32 or 256 for block types) and bytes per block.
int64_t dtype_block_elems(DType t);
int64_t dtype_block_bytes(DType t);
// Bytes taken by n elements; n must be a multiple of the block size.
int64_t dtype_bytes(DType t, int64_t n);

inline float f32_from_bits(uint32_t b) { float f; std::memcpy(&f, &b, 4); return f; }
inline uint32_t bits_from_f32(float f) { uint32_t b; std::memcpy(&b, &f, 4); return b; }

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);  // round to nearest even
inline float bf16_to_f32(uint16_t h) { return f32_from_bits(uint32_t(h) << 16); }
uint16_t f32_to_bf16(float f);  // round to nearest even, NaN stays NaN

// Converts n elements of type t at src into f32 at dst.
void to_f32(DType t, const void* src, float* dst, int64_t n);
// Converts n f32 values into type t (every type but I8, I32 and FP8_E4M3) at dst;
// n must be a multiple of the block size. Block types round to nearest (the
// K-quants without llama.cpp's search for better scales).
void from_f32(DType t, const float* src, void* dst, int64_t n);

}  // namespace serval
