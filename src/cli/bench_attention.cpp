// serval bench --mode attention: the decode attention kernel alone, on the
// Backend API. At each point of --batch-sizes x --context-lens, B sequences of
// context C (distinct blocks, random K/V written with kv_write) each attend
// with one new query token. Several KV layers are rotated through when one is
// small, so that repeated calls do not find their K/V in the L2 cache (as in
// the model, where 31 other layers run in between). Reported: microseconds
// per call (the median of --repeats timings of --iters calls) and the K/V
// bytes read per second against --bandwidth-gbs.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>

#include "cli/bench_options.h"
#include "cli/bench_output.h"
#include "core/error.h"
#include "kv/kv_quant.h"
#include "model/model_loader.h"
#include "runtime/backend.h"

namespace serval::cli {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int64_t kL2FlushBytes = int64_t(256) << 20;  // several times an H200's 50 MB L2
constexpr int32_t kMaxLayers = 32;

struct Shape {
  int32_t heads = 32, kv_heads = 8, head_dim = 128;
};

// Host values in the backend's activation dtype, uniform in [-1, 1).
std::vector<char> random_act(Backend& be, int64_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<char> out(size_t(dtype_bytes(be.act_dtype(), n)));
  if (be.act_dtype() == DType::BF16) {
    auto* p = reinterpret_cast<uint16_t*>(out.data());
    for (int64_t i = 0; i < n; ++i) p[i] = f32_to_bf16(u(rng));
  } else {
    SERVAL_CHECK(be.act_dtype() == DType::F32, "bench: unexpected activation dtype");
    auto* p = reinterpret_cast<float*>(out.data());
    for (int64_t i = 0; i < n; ++i) p[i] = u(rng);
  }
  return out;
}

template <typename T>
const T* upload(Backend& be, std::vector<DeviceBuffer>& keep, const std::vector<T>& host) {
  keep.push_back(be.alloc(int64_t(host.size() * sizeof(T))));
  be.copy_to_device(keep.back().data(), host.data(), int64_t(host.size() * sizeof(T)));
  return static_cast<const T*>(keep.back().data());
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

}  // namespace

int run_bench_attention(const BenchOptions& o) {
  Shape sh;
  if (!o.model.empty()) {
    const ModelConfig cfg = load_model(o.model).config;
    sh = {int32_t(cfg.num_heads), int32_t(cfg.num_kv_heads), int32_t(cfg.head_dim)};
  }
  if (o.heads > 0) sh.heads = o.heads;
  if (o.kv_heads > 0) sh.kv_heads = o.kv_heads;
  if (o.head_dim > 0) sh.head_dim = o.head_dim;
  SERVAL_CHECK(sh.heads % sh.kv_heads == 0, "bench: --heads ", sh.heads, " is not a multiple of --kv-heads ",
               sh.kv_heads);
  const int32_t bs = o.engine.block_size;
  SERVAL_CHECK(bs >= 1 && bs <= 1024, "--block-size must be in [1, 1024], got ", bs);

  const std::string device = resolve_device(o.engine.device);
  std::unique_ptr<Backend> be = create_backend(device, o.engine.threads, "auto", cuda_tuning(o.engine, device));
  be->set_batch_invariant(o.engine.batch_invariant);
  const bool graphs = be->supports_graphs() && !o.engine.enforce_eager;
  const int64_t kvd = int64_t(sh.kv_heads) * sh.head_dim, qd = int64_t(sh.heads) * sh.head_dim;
  // --kv-cache-dtype: fp8 / int8 pools (scales of 1: the timing does not depend on them).
  be->set_kv_dtype(parse_kv_cache_dtype(o.engine.kv_cache_dtype, be->act_dtype()));
  const int64_t kv_elem = dtype_bytes(be->kv_dtype(), 1);
  const float scale = float(1.0 / std::sqrt(double(sh.head_dim)));
  std::mt19937 rng(1234);

  PointPrinter printer(o.json, {{"batch", "batch", 1, 0},
                                {"context_len", "context", 1, 0},
                                {"us_per_call", "us/call", 1, 1},
                                {"kv_gbs", "K+V GB/s", 1, 0},
                                {"bandwidth_fraction", "of bandwidth %", 100, 1},
                                {"kv_layers", "layers", 1, 0}});
  for (int32_t B : o.batch_sizes) {
    for (int32_t C : o.context_lens) {
      const int64_t nb = (C + bs - 1) / bs;
      KvGeometry geom{int64_t(B) * nb, bs, sh.kv_heads, sh.head_dim, be->kv_dtype()};
      const int64_t layer_bytes = 2 * geom.num_blocks * bs * kvd * kv_elem;  // K and V
      const int32_t layers = int32_t(std::clamp<int64_t>((kL2FlushBytes + layer_bytes - 1) / layer_bytes, 1, kMaxLayers));
      int64_t free_b = 0, total_b = 0;
      be->memory_info(free_b, total_b);
      SERVAL_CHECK(double(layers) * double(layer_bytes) <= 0.9 * double(free_b), "bench: batch ", B, " x context ",
                   C, " needs ", double(layers * layer_bytes) / double(1 << 30), " GiB of K/V but the ",
                   be->name(), " device has ", double(free_b) / double(1 << 30),
                   " GiB free: lower --batch-sizes or --context-lens");

      // Metadata: sequence s owns blocks s * nb .. s * nb + nb - 1; its new
      // token sits at position C - 1.
      std::vector<DeviceBuffer> keep;
      const size_t nseq = static_cast<size_t>(B);
      std::vector<int32_t> table(nseq * size_t(nb)), qs(nseq + 1), ctx(nseq, C), pos(nseq, C - 1), rows(nseq);
      std::vector<int64_t> slots(nseq);
      for (int64_t i = 0; i < B * nb; ++i) table[size_t(i)] = int32_t(i);
      for (int32_t s = 0; s <= B; ++s) qs[size_t(s)] = s;
      for (int32_t s = 0; s < B; ++s) {
        rows[size_t(s)] = s;
        slots[size_t(s)] = (int64_t(s) * nb + (C - 1) / bs) * bs + (C - 1) % bs;
      }
      BatchView bv;
      bv.token_ids = upload(*be, keep, rows);
      bv.positions = upload(*be, keep, pos);
      bv.query_start = upload(*be, keep, qs);
      bv.context_len = upload(*be, keep, ctx);
      bv.block_table = upload(*be, keep, table);
      bv.slot_mapping = upload(*be, keep, slots);
      bv.logits_rows = upload(*be, keep, rows);
      bv.num_tokens = bv.num_seqs = bv.num_logits_rows = B;
      bv.max_blocks_per_seq = int32_t(nb);
      bv.max_query_len = 1;
      bv.max_context_len = C;
      bv.mean_context_len = C;  // as the engine's step would have it (long contexts: the stream kernel)

      // Random K/V in every slot: one random chunk, written to each range of slots.
      const int64_t slots_total = geom.num_blocks * bs;
      const int64_t chunk = std::min<int64_t>(slots_total, 4096);
      const DeviceBuffer kbuf = be->alloc(dtype_bytes(be->act_dtype(), chunk * kvd));
      const DeviceBuffer vbuf = be->alloc(dtype_bytes(be->act_dtype(), chunk * kvd));
      be->copy_to_device(kbuf.data(), random_act(*be, chunk * kvd, rng).data(), kbuf.bytes());
      be->copy_to_device(vbuf.data(), random_act(*be, chunk * kvd, rng).data(), vbuf.bytes());
      DeviceBuffer slot_buf = be->alloc(chunk * 8);
      std::vector<KvLayer> kv;
      for (int32_t l = 0; l < layers; ++l) kv.push_back(be->alloc_kv_layer(geom));
      std::vector<int64_t> chunk_slots(static_cast<size_t>(chunk));
      for (int64_t first = 0; first < slots_total; first += chunk) {
        const int64_t n = std::min(chunk, slots_total - first);
        for (int64_t i = 0; i < n; ++i) chunk_slots[size_t(i)] = first + i;
        be->copy_to_device(slot_buf.data(), chunk_slots.data(), n * 8);
        const Tensor k{kbuf.data(), be->act_dtype(), n, kvd}, v{vbuf.data(), be->act_dtype(), n, kvd};
        for (const KvLayer& layer : kv) be->kv_write(k, v, static_cast<const int64_t*>(slot_buf.data()), layer, geom);
        be->synchronize();  // slot_buf is rewritten next
      }
      const DeviceBuffer qbuf = be->alloc(dtype_bytes(be->act_dtype(), B * qd));
      const DeviceBuffer obuf = be->alloc(dtype_bytes(be->act_dtype(), B * qd));
      be->copy_to_device(qbuf.data(), random_act(*be, B * qd, rng).data(), qbuf.bytes());
      const Tensor q{qbuf.data(), be->act_dtype(), B, qd}, out{obuf.data(), be->act_dtype(), B, qd};

      auto calls = [&] {
        for (int32_t i = 0; i < o.iters; ++i)
          be->paged_attention(q, kv[size_t(i % layers)], geom, bv, sh.heads, scale, out);
      };
      for (const KvLayer& layer : kv) be->paged_attention(q, layer, geom, bv, sh.heads, scale, out);  // sizes scratch
      be->synchronize();
      std::unique_ptr<DeviceGraph> graph;
      if (graphs) {
        be->begin_capture();
        try {
          calls();
        } catch (...) {
          try { be->end_capture(); } catch (...) {}
          throw;
        }
        graph = be->end_capture();
        graph->replay();  // the first launch uploads the graph
      }
      std::vector<double> us;
      for (int32_t r = 0; r < o.repeats; ++r) {
        be->synchronize();
        const auto t0 = Clock::now();
        if (graph) graph->replay();
        else calls();
        be->synchronize();
        us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / o.iters);
      }
      const double t_us = median(us);
      const double kv_bytes = double(B) * double(C) * double(kvd) * double(kv_elem) * 2;
      const double gbs = kv_bytes / (t_us * 1e-6) / 1e9;
      printer.print({{"mode", "attention"},
                     {"device", be->name()},
                     {"batch", B},
                     {"context_len", C},
                     {"heads", sh.heads},
                     {"kv_heads", sh.kv_heads},
                     {"head_dim", sh.head_dim},
                     {"block_size", bs},
                     {"us_per_call", t_us},
                     {"kv_bytes", kv_bytes},
                     {"kv_gbs", gbs},
                     {"bandwidth_fraction", gbs / o.limits.bandwidth_gbs},
                     {"kv_layers", layers},
                     {"iters", o.iters},
                     {"repeats", o.repeats},
                     {"graph", graph != nullptr},
                     {"bandwidth_gbs", o.limits.bandwidth_gbs}});
    }
  }
  return 0;
}

}  // namespace serval::cli
