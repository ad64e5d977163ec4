#pragma once
// Linear: one weight matrix of a linear layer as the checkpoint stores it, in
// a format, with the tensors that format needs and the part of the full
// matrix this device holds. A backend runs the formats it has kernels for
// (Backend::runs_linear_format); any other goes through the reference
// composition, the matrix dequantized by dequantize_linear, so a new format
// runs everywhere as soon as its dequantizer exists.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "model/weights.h"

namespace serval {

struct LinearFormat {
  enum class Kind : uint8_t {
    Dense,           // elements of `dtype` (f32, f16, bf16)
    GgufBlock,       // GGUF block quantization (`dtype` Q8_0, Q4_0, ..., Q6_K): scales inside the blocks
    Int8PerChannel,  // int8 weights, one f32 scale per output row: w = q * scale[row]
    Int4Grouped,     // int4 weights, two per byte (low nibble first), a scale (and a zero point
                     // when asymmetric) per `group_size` inputs of a row: w = (q - zero) * scale
    Fp8,             // e4m3 weights with a per-tensor, per-row or per-block f32 scale: w = q * scale
  };
  Kind kind = Kind::Dense;
  DType dtype = DType::F32;  // Dense and GgufBlock: the element type
  int32_t group_size = 0;    // Int4Grouped
  bool symmetric = true;     // Int4Grouped: no zero points (zero 8)
  // Fp8 with block scales: one scale per block of block_rows x block_cols
  // weights (the last blocks of a row or column may be partial); 0: a
  // per-tensor or per-row scale.
  int32_t block_rows = 0, block_cols = 0;

  static LinearFormat dense(DType t) { return {Kind::Dense, t, 0, true}; }
  // The format of a plain tensor: Dense, or GgufBlock for a block-quantized dtype.
  static LinearFormat of_dtype(DType t);
  bool operator==(const LinearFormat&) const = default;
  // "bf16", "q4_0", "int8 per channel", "int4 g128 asym", "fp8 e4m3"
  std::string describe() const;
};

// Which rows or columns of the full [out, in] matrix a device holds (tensor
// parallelism: Megatron's column split of q/k/v and gate/up, row split of o
// and down). Whole on one device.
struct ShardSpec {
  enum class Split : uint8_t { Whole, OutRows, InCols };
  Split split = Split::Whole;
  int32_t rank = 0, world = 1;
  int64_t full_out = 0, full_in = 0;  // the whole matrix's shape
  int64_t offset = 0;                 // first row (OutRows) or column (InCols) held

  static ShardSpec whole(int64_t out, int64_t in) { return {Split::Whole, 0, 1, out, in, 0}; }
  bool is_whole() const { return split == Split::Whole; }
};

struct Linear {
  std::string name;        // the weight's tensor name (GGUF naming, weights.h)
  int64_t out = 0, in = 0;  // the shape held here, outermost first
  LinearFormat format;
  TensorView weight;                 // [out, in] elements (Int4Grouped: [out, in / 2] bytes)
  std::optional<TensorView> scales;  // Int8PerChannel / Fp8 per row: [out] f32; Fp8 per tensor: [1];
                                     // Fp8 per block: [ceil(out / block_rows), ceil(in / block_cols)] f32;
                                     // Int4Grouped: [out, in / group_size] f32
  std::optional<TensorView> zeros;   // Int4Grouped asymmetric: [out, in / group_size] f32
  ShardSpec shard;

  // Bytes of the weight and its tensors as stored (what a backend running
  // the format natively keeps in memory).
  int64_t stored_bytes() const;
  // Throws serval::Error naming the weight when its tensors do not match its
  // format and shape.
  void validate() const;
};

// A Linear of a plain tensor (Dense or GgufBlock), whole.
Linear linear_of(const TensorView& view);

// The reference dequantization: the [out, in] matrix `w` holds, in f32,
// row-major. Exact for every format (no rounding beyond the format's own).
std::vector<float> dequantize_linear(const Linear& w);

}  // namespace serval
