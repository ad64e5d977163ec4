#pragma once
// The decoder's forward pass, written once against a DeviceModel's blocks and
// the Backend interface: embedding, then per layer an attention block and an
// MLP block into the f32 residual stream, then the final norm and the LM head
// over the rows that need logits. Fusions are explicit here (Backend ops that
// do several steps at once), never state carried between ops.
#include <vector>

#include "runtime/backend.h"
#include "runtime/device_model.h"
#include "runtime/workspace.h"

namespace serval {

// One layer's KV pools and their layout.
struct KvPool {
  std::vector<KvLayer> layers;
  std::vector<KvGeometry> geoms;
};

// Enqueues the forward pass over `bv` on `be`; the f32 logits of
// bv.logits_rows land in ws.logits.
void enqueue_forward(Backend& be, const DeviceModel& model, const Workspace& ws, const KvPool& kv,
                     const BatchView& bv);

}  // namespace serval
