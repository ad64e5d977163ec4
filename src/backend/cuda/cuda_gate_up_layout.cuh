#pragma once
// How upload_gated_pair lays out an MLP's gate and up matrices [I, H] when it
// interleaves them (CudaTuning::gate_up_interleaved): one allocation of 2I rows
// in groups of 16, gate's rows 8g..8g+7 then up's rows 8g..8g+7. Why 8: a
// wgmma accumulator thread holds rows r and r + 8 of every 16, so CUTLASS's
// epilogue finds the gate and up sums of one output in one thread; the GEMV's
// unit is 8 rows. The product of the whole pair is [T, 2I] with the same
// interleave: chunk c of 8 outputs of a row is its 16-byte chunks 2c (gate)
// and 2c + 1 (up).
#include <cstdint>

namespace serval::cuda {

constexpr int kGateUpGroupRows = 8;

// Where row r of gate lies in the pair, in rows from its start (up's row r:
// that + kGateUpGroupRows).
__host__ __device__ constexpr int64_t gate_up_row(int64_t r) {
  return r / kGateUpGroupRows * (2 * kGateUpGroupRows) + r % kGateUpGroupRows;
}

}  // namespace serval::cuda
