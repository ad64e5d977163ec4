// The GPU sampler's draws, logprobs (of sampled and of scored tokens), broken rows and odd shapes against the
// CPU Sampler and the exact reference (cuda_sampling_test_util.h); its speed
// on full batches, printed. Skips without a GPU.
#include <chrono>

#include "cuda_sampling_test_util.h"

namespace serval::testing {
namespace {

// ---------------------------------------------------------------- sampled

TEST(CudaSampling, SampledDistributionsMatchCpu) {
  SERVAL_CUDA_OR_SKIP(gpu);
  float topp_cut = 0.0f;
  const std::vector<float> host = small_rows(&topp_cut);
  const DeviceLogits dev = to_device(*gpu, host, 2, kSmallVocab);
  struct Case {
    std::string name;
    int32_t row;
    float temperature, top_p;
    int32_t top_k;
    float min_p;
    bool penalties;
  };
  const std::vector<Case> cases = {
      {"temperature 1", 0, 1.0f, 1.0f, 0, 0.0f, false},
      {"temperature 0.6", 0, 0.6f, 1.0f, 0, 0.0f, false},
      {"top_k 5 (ties at the boundary)", 0, 1.0f, 1.0f, 5, 0.0f, false},
      {"top_k 1", 0, 1.0f, 1.0f, 1, 0.0f, false},
      {"top_k 11 (tie pair at 11)", 0, 1.5f, 1.0f, 11, 0.0f, false},
      {"top_p 0.7", 0, 1.0f, 0.7f, 0, 0.0f, false},
      {"top_p 0.3 temperature 0.8", 0, 0.8f, 0.3f, 0, 0.0f, false},
      {"top_p 0 (the most likely token alone)", 0, 1.0f, 0.0f, 0, 0.0f, false},
      {"top_p 0 + top_k 5 (ties) t 2", 0, 2.0f, 0.0f, 5, 0.0f, false},
      {"min_p 0.05", 0, 1.0f, 1.0f, 0, 0.05f, false},
      {"min_p 1 (the max and its tie)", 0, 1.0f, 1.0f, 0, 1.0f, false},
      {"top_k 8 min_p 1 (the max and its tie)", 0, 1.0f, 1.0f, 8, 1.0f, false},
      {"min_p 0.3 temperature 2", 0, 2.0f, 1.0f, 0, 0.3f, false},
      {"top_k 12 top_p 0.8 min_p 0.02 t 1.3", 0, 1.3f, 0.8f, 12, 0.02f, false},
      {"top_k 5 (ties) top_p 0.95", 0, 1.0f, 0.95f, 5, 0.0f, false},
      {"top_p cutting a tie group", 1, 1.0f, topp_cut, 0, 0.0f, false},
      {"top_p tie cut + top_k 8", 1, 1.0f, topp_cut, 8, 0.0f, false},
      {"penalties + bans, top_p 0.9 t 0.9", 0, 0.9f, 0.9f, 0, 0.0f, true},
      {"penalties + bans, top_k 6 min_p 0.1", 0, 1.0f, 1.0f, 6, 0.1f, true},
  };
  for (const Case& c : cases) {
    Request base;
    base.row = c.row;
    base.params.temperature = c.temperature;
    base.params.top_p = c.top_p;
    base.params.top_k = c.top_k;
    base.params.min_p = c.min_p;
    if (c.penalties) {
      base.params.repetition_penalty = 1.3f;
      base.params.frequency_penalty = 0.5f;
      base.params.presence_penalty = 0.25f;
      base.prompt = {1, 2, 3, 9, 20, 2};
      base.output = {20, 20, 7, 51, 63};
      base.banned = {argmax_of(host.data(), kSmallVocab), 100};
    }
    expect_distribution(*gpu, dev, host, kSmallVocab, base, kDraws, c.name);
  }
}

// A 128k row: a dozen likely tokens (two tied) over a long tail that holds
// much of the mass; one token banned.
TEST(CudaSampling, LargeVocabularyDistributionsMatchCpu) {
  SERVAL_CUDA_OR_SKIP(gpu);
  std::vector<float> host = random_logits(1, kLargeVocab, 5u, 1.5f);
  std::mt19937 rng(6);
  for (int i = 0; i < 12; ++i) host[rng() % uint32_t(kLargeVocab)] = 8.0f + float(i) * 0.2f;
  host[777] = host[90001] = 10.0f;
  const DeviceLogits dev = to_device(*gpu, host, 1, kLargeVocab);
  struct Case {
    std::string name;
    float temperature, top_p;
    int32_t top_k;
    float min_p;
  };
  const std::vector<Case> cases = {
      {"temperature 1 (all kept)", 1.0f, 1.0f, 0, 0.0f},
      {"top_k 50", 1.0f, 1.0f, 50, 0.0f},
      {"top_p 0.9", 1.0f, 0.9f, 0, 0.0f},
      {"top_p 0.5 temperature 0.7", 0.7f, 0.5f, 0, 0.0f},
      {"top_k 3000 top_p 0.95 min_p 1e-3 t 1.5", 1.5f, 0.95f, 3000, 1e-3f},
      {"min_p 0.2", 1.0f, 1.0f, 0, 0.2f},
  };
  for (const Case& c : cases) {
    Request base;
    base.params.temperature = c.temperature;
    base.params.top_p = c.top_p;
    base.params.top_k = c.top_k;
    base.params.min_p = c.min_p;
    base.banned = {90001};
    expect_distribution(*gpu, dev, host, kLargeVocab, base, kLargeDraws, c.name);
  }
}

// ---------------------------------------------------------------- logprobs

TEST(CudaSampling, LogprobsMatchCpu) {
  SERVAL_CUDA_OR_SKIP(gpu);
  Sampler sampler;
  for (bool lists : {true, false}) {
    const ListMode mode(lists);
    for (int64_t vocab : {int64_t(10), kMidVocab, kLargeVocab}) {
      const int rows = 64;
      std::vector<float> host = random_logits(rows, vocab, uint32_t(vocab), 2.5f);
      std::mt19937 rng(uint32_t(vocab + 1));
      // Row 0: 25 tokens share the max (top 20 cuts the tie); row 1: 4 tokens
      // tie at the 19th largest; row 2: many tokens at -inf.
      {
        float* r0 = host.data();
        const float m = r0[argmax_of(r0, vocab)] + 1.0f;
        for (int i = 0; i < 25; ++i) r0[rng() % uint32_t(vocab)] = m;
        if (vocab > 40) {
          float* r1 = host.data() + vocab;
          std::vector<float> s(r1, r1 + vocab);
          std::sort(s.begin(), s.end(), std::greater<float>());
          for (int i = 0; i < 4; ++i) r1[rng() % uint32_t(vocab)] = s[18];
          float* r2 = host.data() + 2 * vocab;
          for (int64_t i = 0; i < vocab; i += 2) r2[i] = -kInf;
        }
      }
      std::vector<Request> reqs(static_cast<size_t>(rows));
      const int ns[] = {0, 1, 5, 20};
      for (int r = 0; r < rows; ++r) {
        Request& q = reqs[size_t(r)];
        q.row = r;
        q.params.logprobs = r < 2 ? 20 : ns[r % 4];  // rows 0 and 1: the top 20 cuts a tie
        if (r % 3 == 0) {
          q.params.temperature = 0.0f;
        } else {
          q.params.temperature = 0.9f;
          q.params.top_k = 40;
          q.uniform = (r + 0.37) / rows;
        }
        // Scored tokens (prompt logprobs): any token, -inf ones of row 2 too,
        // whatever the sampling parameters say.
        if (r % 7 == 2) q.forced = r == 2 ? 0 : int32_t(rng() % uint32_t(vocab));
        if (r % 5 == 1) {  // penalties and bans change the draw, not the (raw) logprobs
          q.params.repetition_penalty = 1.5f;
          q.prompt = {int32_t(rng() % uint32_t(vocab)), int32_t(rng() % uint32_t(vocab))};
          q.banned = {argmax_of(host.data() + int64_t(r) * vocab, vocab)};
        }
      }
      const DeviceLogits dev = to_device(*gpu, host, rows, vocab);
      const std::vector<SampleResult> g = gpu_sample(*gpu, dev.t, reqs);
      double max_err = 0.0;
      int bad = 0;
      for (int r = 0; r < rows; ++r) {
        const Request& q = reqs[size_t(r)];
        const SampleResult& got = g[size_t(r)];
        if (q.forced >= 0) {
          EXPECT_EQ(got.token, q.forced) << "row " << r;
        } else if (q.params.greedy()) {
          EXPECT_EQ(got.token, cpu_sample(sampler, host, vocab, q).token) << "row " << r;
        }
        ASSERT_TRUE(got.logprobs.has_value()) << "row " << r;
        ASSERT_GE(got.token, 0);
        ASSERT_LT(got.token, vocab);
        const Logprobs want = compute_logprobs(row_of(host, vocab, q.row), got.token, q.params.logprobs);
        const Logprobs& lp = *got.logprobs;
        // Equal values (also -inf for tokens the model excludes) or within
        // 1e-4.
        auto close = [&max_err](float a, float b) {
          if (a == b) return true;
          max_err = std::max(max_err, double(std::abs(a - b)));
          return std::abs(a - b) <= 1e-4f;
        };
        bool ok =
            close(lp.chosen, want.chosen) && lp.chosen_rank == want.chosen_rank && lp.top.size() == want.top.size();
        for (size_t i = 0; ok && i < want.top.size(); ++i)
          ok = lp.top[i].token == want.top[i].token && close(lp.top[i].logprob, want.top[i].logprob);
        if (!ok) {
          ++bad;
          ADD_FAILURE() << "vocab " << vocab << " row " << r << ": chosen " << lp.chosen << " vs " << want.chosen
                        << ", rank " << lp.chosen_rank << " vs " << want.chosen_rank << ", top " << lp.top.size()
                        << " vs " << want.top.size()
                        << (lp.top.empty() || want.top.empty() ? std::string()
                                                               : ", first top " + std::to_string(lp.top[0].token) +
                                                                     " vs " + std::to_string(want.top[0].token));
        }
      }
      std::printf(
          "[cuda sampling] logprobs vocab %lld rows %d [%s]: %d "
          "mismatching rows, max |logprob diff| %.2e\n",
          (long long)vocab, rows, mode_name(lists), bad, max_err);
    }
  }
}

// ---------------------------------------------------------------- errors and
// shapes

void expect_throw_containing(Backend& gpu, const DeviceLogits& dev, const std::vector<Request>& reqs,
                             const std::string& needle, const std::string& what) {
  try {
    gpu_sample(gpu, dev.t, reqs);
    ADD_FAILURE() << what << ": no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << what << ": " << e.what();
  }
}

TEST(CudaSampling, BrokenRowsThrowLikeTheCpu) {
  SERVAL_CUDA_OR_SKIP(gpu);
  const int64_t vocab = 1000;
  std::vector<float> host = random_logits(4, vocab, 21u);
  host[1 * vocab + 517] = std::numeric_limits<float>::quiet_NaN();
  host[2 * vocab + 3] = kInf;
  for (int64_t i = 0; i < vocab; ++i) host[size_t(3 * vocab + i)] = -kInf;
  const DeviceLogits dev = to_device(*gpu, host, 4, vocab);
  int checked = 0;
  for (bool greedy : {true, false}) {
    for (bool logprobs : {false, true}) {
      Request q;
      q.params.temperature = greedy ? 0.0f : 0.8f;
      q.params.top_p = greedy ? 1.0f : 0.9f;
      q.params.logprobs = logprobs ? 3 : -1;
      std::vector<Request> reqs(2, q);
      reqs[0].row = 0;  // a good row before the bad one
      const std::string mode = std::string(greedy ? "greedy" : "sampled") + (logprobs ? " + logprobs" : "");
      reqs[1].row = 1;
      expect_throw_containing(*gpu, dev, reqs, "NaN", mode + " NaN");
      reqs[1].row = 2;
      expect_throw_containing(*gpu, dev, reqs, "+inf", mode + " +inf");
      reqs[1].row = 3;
      expect_throw_containing(*gpu, dev, reqs, "all 1000 logits are -inf", mode + " all -inf");
      reqs[1].row = 0;
      for (int32_t id = 0; id < vocab; ++id) reqs[1].banned.push_back(id);
      expect_throw_containing(*gpu, dev, reqs, "are -inf", mode + " all banned");
      reqs[1].banned.clear();
      reqs[1].row = 1;
      reqs[1].banned = {517};  // the NaN banned away: fine, as on the CPU
      EXPECT_NO_THROW(gpu_sample(*gpu, dev.t, reqs)) << mode << " banned NaN";
      reqs[1].banned.clear();
      reqs[1].row = 0;
      reqs[1].params.repetition_penalty = 1.2f;
      reqs[1].prompt = {5, int32_t(vocab)};
      expect_throw_containing(*gpu, dev, reqs, "token id 1000 in the prompt is outside the vocabulary [0, 1000)",
                              mode + " bad prompt id");
      reqs[1].prompt = {5};
      reqs[1].output = {-3};
      expect_throw_containing(*gpu, dev, reqs, "token id -3 in the output is outside the vocabulary",
                              mode + " bad output id");
      reqs[1].params.repetition_penalty = 1.0f;  // no penalties: ids are not looked at
      EXPECT_NO_THROW(gpu_sample(*gpu, dev.t, reqs)) << mode << " ids without penalties";
      checked += 7;
    }
  }
  std::printf(
      "[cuda sampling] errors: %d broken-row cases checked (NaN, +inf, "
      "all -inf, all banned, bad ids)\n",
      checked);
}

TEST(CudaSampling, EmptyAndOddShapes) {
  SERVAL_CUDA_OR_SKIP(gpu);
  {
    const DeviceLogits dev = to_device(*gpu, std::vector<float>(4, 1.0f), 1, 4);
    std::vector<SampleResult> out(3);
    gpu->sample(Tensor{dev.t.data, DType::F32, 0, 4}, {}, out);
    EXPECT_TRUE(out.empty());
  }
  Sampler sampler;
  int checked = 0;
  for (bool lists : {true, false}) {
    const ListMode mode(lists);
    for (int64_t vocab : {int64_t(1), int64_t(3), int64_t(5), int64_t(4099), int64_t(50257)}) {
      const int rows = 5;  // odd vocabularies leave rows 1.. unaligned
      std::vector<float> host = random_logits(rows, vocab, uint32_t(vocab * 3));
      plant_max_ties(host, rows, vocab, 9u);
      const DeviceLogits dev = to_device(*gpu, host, rows, vocab);
      std::vector<Request> reqs;
      for (int r = 0; r < rows; ++r) {
        Request q;
        q.row = r;
        q.params = greedy_params();
        reqs.push_back(q);
        q.params.temperature = 1.0f;
        q.params.top_k = 3;
        q.params.top_p = 0.9f;
        q.params.logprobs = 2;
        for (double u : {0.01, 0.5, 0.99}) {
          q.uniform = u;
          reqs.push_back(q);
        }
      }
      const std::vector<SampleResult> g = gpu_sample(*gpu, dev.t, reqs);
      for (size_t i = 0; i < reqs.size(); ++i) {
        const Request& q = reqs[i];
        if (q.params.greedy()) {
          EXPECT_EQ(g[i].token, cpu_sample(sampler, host, vocab, q).token) << "vocab " << vocab << " row " << q.row;
        } else {
          const std::vector<double> ref = reference_probs(row_of(host, vocab, q.row), q);
          ASSERT_GE(g[i].token, 0);
          ASSERT_LT(g[i].token, vocab);
          EXPECT_GT(ref[size_t(g[i].token)], 0.0) << "vocab " << vocab << " row " << q.row << " u " << q.uniform;
          ASSERT_TRUE(g[i].logprobs.has_value());
          const Logprobs want = compute_logprobs(row_of(host, vocab, q.row), g[i].token, 2);
          EXPECT_EQ(g[i].logprobs->top.size(), want.top.size());
          EXPECT_EQ(g[i].logprobs->chosen_rank, want.chosen_rank);
        }
        ++checked;
      }
    }
  }
  std::printf(
      "[cuda sampling] empty call ok; %d rows of vocabularies 1, 3, 5, "
      "4099, 50257 checked\n",
      checked);
}

// ---------------------------------------------------------------- speed

double time_call_us(Backend& gpu, const DeviceLogits& dev, const std::vector<Request>& reqs) {
  gpu_sample(gpu, dev.t, reqs);  // warm: buffers allocated
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kTimedCalls; ++i) gpu_sample(gpu, dev.t, reqs);
  const auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::micro>(t1 - t0).count() / kTimedCalls;
}

TEST(CudaSampling, SpeedOfFullBatches) {
  SERVAL_CUDA_OR_SKIP(gpu);
  const int rows = kMaxRows;
  const std::vector<float> host = random_logits(rows, kLargeVocab, 77u);
  const DeviceLogits dev = to_device(*gpu, host, rows, kLargeVocab);
  std::vector<Request> reqs(static_cast<size_t>(rows));
  for (int r = 0; r < rows; ++r) {
    reqs[size_t(r)].row = r;
    reqs[size_t(r)].params = greedy_params();
    reqs[size_t(r)].uniform = (r + 0.5) / rows;
  }
  const double greedy = time_call_us(*gpu, dev, reqs);
  for (Request& q : reqs) q.params.temperature = 0.8f;
  const double plain = time_call_us(*gpu, dev, reqs);
  for (Request& q : reqs) q.params.top_p = 0.9f;
  const double topp = time_call_us(*gpu, dev, reqs);
  for (Request& q : reqs) q.params.top_k = 50;
  const double topk_topp = time_call_us(*gpu, dev, reqs);
  for (Request& q : reqs) {
    q.params.logprobs = 5;
    q.params.repetition_penalty = 1.1f;
    for (int i = 0; i < 200; ++i) q.prompt.push_back(int32_t((i * 7919) % kLargeVocab));
  }
  const double full = time_call_us(*gpu, dev, reqs);
  const double bytes = double(rows) * double(kLargeVocab) * 4.0;
  std::printf(
      "[cuda sampling] speed %d x %lld: greedy %.1f us (%.0f GB/s of "
      "logits), temperature %.1f us, "
      "top_p %.1f us, top_k+top_p %.1f us, +penalties+logprobs5 %.1f "
      "us (per call, incl. copies)\n",
      rows, (long long)kLargeVocab, greedy, bytes / greedy * 1e-3, plain, topp, topk_topp, full);
  // No bound on the times: a loaded machine stretches them. The calls' results
  // are checked by gpu_sample; the times are for the reader.
}


}  // namespace
}  // namespace serval::testing
