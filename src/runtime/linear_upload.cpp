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

// The device weight's own format: `w`'s where the backend keeps it, else
// dense in the backend's dtype.
LinearFormat held_format(const Backend& be, const Linear& w) {
  return be.keeps_linear_format(w.format) ? w.format : LinearFormat::dense(be.act_dtype());
}

}  // namespace

std::vector<std::unique_ptr<DeviceWeight>> upload_linear_group(Backend& be, const std::vector<const Linear*>& ws,
                                                               bool gated_pair, int64_t& bytes) {
  // A weight the backend keeps in its own format is laid out alone.
  bool any_kept = false;
  for (const Linear* w : ws) any_kept = any_kept || be.keeps_linear_format(w->format);
  if (any_kept) {
    std::vector<std::unique_ptr<DeviceWeight>> out;
    for (const Linear* w : ws) out.push_back(upload_linear(be, *w, bytes));
    return out;
  }
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
  auto out =
      be.keeps_linear_format(w.format) ? be.upload_kept_linear(w) : be.upload_weight(upload_view(be, w, storage));
  out->set_linear_layout(held_format(be, w), w.shard);
  return out;
}

}  // namespace serval
