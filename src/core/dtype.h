#pragma once
// Element types of tensors and weights, and conversions between them.
// Block-quantized types (Q8_0, Q4_0) follow GGUF's layouts: 32 elements per block,
// an f16 scale followed by the quantized values.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace serval {

enum class DType : uint8_t { F32, F16, BF16, Q8_0, Q4_0, I8, I32, FP8_E4M3 };

std::string_view dtype_name(DType t);
// Parses "f32", "f16", "bf16", "q8_0", "q4_0" (case-insensitive); throws on others.
DType parse_dtype(std::string_view name);

// Elements per block (1 for plain types, 32 for Q8_0/Q4_0) and bytes per block.
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
// Converts n f32 values into type t (F32, F16, BF16, Q8_0, Q4_0) at dst.
void from_f32(DType t, const float* src, void* dst, int64_t n);

}  // namespace serval
