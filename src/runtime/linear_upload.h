#pragma once
// Uploading Linear weights (model/linear.h) to a backend. A format the
// backend's matmuls run (Backend::runs_linear_format) goes up as it is;
// any other through the reference composition: dequantize_linear once at
// load, then dense matmuls. Each result's format() says what the backend holds.
#include <memory>
#include <vector>

#include "model/linear.h"
#include "runtime/backend.h"

namespace serval {

// Adds the device bytes of the upload (Backend::linear_device_bytes) to `bytes`.
std::unique_ptr<DeviceWeight> upload_linear(Backend& be, const Linear& w, int64_t& bytes);
// Weights read together (q/k/v through Backend::upload_weight_group; with
// `gated_pair`, gate and up through Backend::upload_gated_pair), in order.
std::vector<std::unique_ptr<DeviceWeight>> upload_linear_group(Backend& be, const std::vector<const Linear*>& ws,
                                                               bool gated_pair, int64_t& bytes);

}  // namespace serval
