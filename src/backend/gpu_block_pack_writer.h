#pragma once
// Writing one matrix into the packed layout of backend/gpu_block_pack.h, a
// weight at a time (the format readers in gpu_block_pack_formats.cpp call it).
// Rows are independent: different rows may be written from different threads.
#include <cstdint>
#include <vector>

#include "backend/gpu_block_pack.h"

namespace serval {

class GpuPackWriter {
 public:
  // Starts as zero weights everywhere (the padding stays so).
  explicit GpuPackWriter(const GpuBlockPack& pack);
  // Column c of row r: a nibble (0..15) or a signed byte (-128..127).
  void quant(int64_t r, int64_t c, int q);
  // Scale group g (columns g * group ..) of row r: f16 bits.
  void scale(int64_t r, int64_t g, uint16_t d) { scales_[pack_.scale_index(r, g)] = d; }
  void min(int64_t r, int64_t g, uint16_t m) { mins_[pack_.scale_index(r, g)] = m; }
  void row_scale(int64_t r, float s) { row_scales_[r] = s; }
  const GpuBlockPack& pack() const { return pack_; }
  std::vector<uint8_t> take() { return std::move(out_); }

 private:
  GpuBlockPack pack_;
  std::vector<uint8_t> out_;
  uint16_t* scales_ = nullptr;
  uint16_t* mins_ = nullptr;
  float* row_scales_ = nullptr;
};

}  // namespace serval
