// Linear weights onto a backend: as they are where the backend runs their
// format, else through the reference composition (dequantized once, then
// multiplied as dense matrices).
#include "runtime/linear_upload.h"

namespace serval {

namespace {

// What the backend uploads for `w`: its own tensor where the backend runs
// the format, else the reference composition's dense f32 matrix (kept in
// `storage` until the upload returns).
TensorView upload_view(const Backend& be, const Linear& w, std::vector<float>& storage) {
  if (be.runs_linear_format(w.format)) return w.weight;
  storage = dequantize_linear(w);
  return TensorView{w.name, DType::F32, {w.out, w.in}, storage.data(), int64_t(storage.size() * sizeof(float))};
}

// The device weight's own format: the backend's dtype, dense, unless it runs `w`'s format as it is.
LinearFormat held_format(const Backend& be, const Linear& w) {
  const bool native = be.runs_linear_format(w.format) && w.format.kind != LinearFormat::Kind::Dense &&
                      w.format.kind != LinearFormat::Kind::GgufBlock;
  return native ? w.format : LinearFormat::dense(be.act_dtype());
}

}  // namespace

std::vector<std::unique_ptr<DeviceWeight>> upload_linear_group(Backend& be, const std::vector<const Linear*>& ws,
                                                               bool gated_pair, int64_t& bytes) {
  std::vector<std::vector<float>> storage(ws.size());
  std::vector<TensorView> views;
  for (size_t i = 0; i < ws.size(); ++i) {
    views.push_back(upload_view(be, *ws[i], storage[i]));
    bytes += be.linear_device_bytes(*ws[i]);
  }
  auto out = gated_pair ? be.upload_gated_pair(views[0], views[1]) : be.upload_weight_group(views);
  for (size_t i = 0; i < ws.size(); ++i) out[i]->set_linear_layout(held_format(be, *ws[i]), ws[i]->shard);
  return out;
}

std::unique_ptr<DeviceWeight> upload_linear(Backend& be, const Linear& w, int64_t& bytes) {
  std::vector<float> storage;
  bytes += be.linear_device_bytes(w);
  auto out = be.upload_weight(upload_view(be, w, storage));
  out->set_linear_layout(held_format(be, w), w.shard);
  return out;
}

}  // namespace serval
