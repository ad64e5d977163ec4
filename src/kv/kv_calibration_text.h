#pragma once
// The text the runner reads at start-up to calibrate a quantized KV cache
// (--kv-cache-dtype fp8|int8 without scales in the checkpoint): a few
// hundred tokens of plain English, story and exposition, numbers and a
// little dialogue, so that each KV head sees a typical range.
namespace serval {

extern const char* const kKvCalibrationText;

}  // namespace serval
