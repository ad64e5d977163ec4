#include "sched/scheduler.h"

#include <algorithm>
#include <climits>

#include "core/error.h"
#include "sched/request_fit.h"
#include "sched/scheduler_entry.h"

namespace serval {


void SchedulerConfig::validate() const {
  SERVAL_CHECK(max_num_batched_tokens >= 1, "max_num_batched_tokens must be at least 1, got ",
               max_num_batched_tokens);
  SERVAL_CHECK(max_num_seqs >= 1, "max_num_seqs must be at least 1, got ", max_num_seqs);
  SERVAL_CHECK(max_queued_requests >= 1, "max_queued_requests must be at least 1, got ",
               max_queued_requests);
  SERVAL_CHECK(max_model_len >= 0, "max_model_len must be >= 0 (0: unlimited), got ",
               max_model_len);
  SERVAL_CHECK(kv_window >= 0, "kv_window must be >= 0 (0: no sliding window), got ", kv_window);
  SERVAL_CHECK(max_scored_rows >= 1, "max_scored_rows must be at least 1, got ", max_scored_rows);
}

Scheduler::Scheduler(SchedulerConfig config, KvCacheManager& kv) : config_(config), kv_(kv) {
  config_.validate();
  SERVAL_CHECK(config_.kv_window == 0 || !kv_.prefix_cache_enabled(), "a sliding-window KV cache (kv_window ",
               config_.kv_window, ") needs the prefix cache off");
}

Scheduler::~Scheduler() = default;

void Scheduler::check_fits(const Sequence& seq) const {
  check_request_fits(fit_limits(), seq.num_prompt_tokens(), seq.stop().max_tokens, str_cat("request ", seq.id(), ": "));
}

// K/V of `tokens` (the sequence's first num_computed_tokens) are written:
// their full blocks go to the prefix cache, and behind a sliding window the
// blocks no later token reads go back to the pool.
void Scheduler::kv_computed(Sequence& seq, std::span<const int32_t> tokens) {
  kv_.commit_full_blocks(seq.block_table(), tokens);
  if (config_.kv_window > 0)
    kv_.release_before(seq.block_table(), seq.num_computed_tokens() + 1 - config_.kv_window);
}

KvFitLimits Scheduler::fit_limits() const {
  return KvFitLimits{config_.max_model_len, kv_.block_size(), kv_.num_blocks(), config_.kv_window,
                     config_.max_num_batched_tokens};
}

void Scheduler::add(Sequence seq, RequestOptions options) {
  SERVAL_CHECK(int64_t(waiting_.size()) < config_.max_queued_requests, "request ", seq.id(),
               " refused: the waiting queue is full (", waiting_.size(),
               " requests, max_queued_requests ", config_.max_queued_requests, ")");
  const auto same_id = entries_.lower_bound(Key{seq.id(), INT32_MIN});
  SERVAL_CHECK(same_id == entries_.end() || same_id->first.first != seq.id(), "request ",
               seq.id(), " is already scheduled");
  SERVAL_CHECK(seq.sample_index() == 0, "request ", seq.id(), ": add the first sample (index 0)");
  SERVAL_CHECK(!seq.finished() && seq.num_computed_tokens() == 0 &&
                   seq.block_table().num_blocks() == 0,
               "request ", seq.id(), ": a new request must be unstarted (no computed tokens, "
               "no KV blocks, not finished)");
  SERVAL_CHECK(seq.block_table().block_size() == kv_.block_size(), "request ", seq.id(),
               ": block table has block size ", seq.block_table().block_size(),
               " but the KV cache uses ", kv_.block_size());
  check_fits(seq);
  auto e = std::make_unique<Entry>(Entry{std::move(seq), options.priority, next_arrival_++,
                                         options.deadline, {}, false});
  e->tokens = e->seq.prompt_ids();
  e->tokens.insert(e->tokens.end(), e->seq.output_ids().begin(), e->seq.output_ids().end());
  Entry* raw = e.get();
  entries_.emplace(key_of(raw->seq), std::move(e));
  insert_waiting(raw);
}

void Scheduler::insert_waiting(Entry* e) {
  e->running = false;
  auto it = std::upper_bound(waiting_.begin(), waiting_.end(), e,
                             [](const Entry* a, const Entry* b) { return a->before(*b); });
  waiting_.insert(it, e);
}

void Scheduler::insert_running(Entry* e) {
  e->running = true;
  auto it = std::upper_bound(running_.begin(), running_.end(), e,
                             [](const Entry* a, const Entry* b) { return a->before(*b); });
  running_.insert(it, e);
}

void Scheduler::retire(Entry* e) {
  if (e->seq.block_table().num_blocks() > 0) kv_.free(e->seq.block_table());
  if (e->running)
    std::erase(running_, e);
  else
    std::erase(waiting_, e);
  finished_.push_back(std::move(e->seq));
  entries_.erase(key_of(finished_.back()));
}

void Scheduler::preempt(Entry* e) {
  kv_.free(e->seq.block_table());
  e->seq.reset_computed();
  std::erase(running_, e);
  insert_waiting(e);
  ++num_preemptions_;
}

void Scheduler::expire_deadlines(SchedulerClock::time_point now, StepPlan& plan) {
  std::vector<Entry*> expired;
  for (auto& [id, e] : entries_)
    if (e->deadline && *e->deadline <= now) expired.push_back(e.get());
  // Deterministic order: by arrival, then sample.
  std::sort(expired.begin(), expired.end(), [](const Entry* a, const Entry* b) {
    return a->arrival != b->arrival ? a->arrival < b->arrival
                                    : a->seq.sample_index() < b->seq.sample_index();
  });
  for (Entry* e : expired) {
    e->seq.finish(FinishReason::kTimeout);
    plan.finished.push_back(e->seq.id());
    retire(e);
  }
}

int64_t Scheduler::chunk_tokens(const Sequence& seq, int64_t from, int64_t budget) const {
  const int64_t n = std::min(seq.num_tokens() - from, budget);
  return seq.scores_prompt() ? std::min(n, std::max<int64_t>(scored_rows_left_, 0)) : n;
}

void Scheduler::take_scored_rows(const Sequence& seq, int64_t n) {
  if (seq.scores_prompt()) scored_rows_left_ -= n;
}

bool Scheduler::schedule_running(Entry* e, int64_t& budget, StepPlan& plan) {
  Sequence& seq = e->seq;
  propose_draft(e, budget);
  std::vector<int32_t>& draft = seq.draft_ids();
  auto chunk = [&] {
    return draft.empty() ? chunk_tokens(seq, seq.num_computed_tokens(), budget) : 1 + int64_t(draft.size());
  };
  auto missing_slots = [&] {
    return std::max<int64_t>(0, seq.num_computed_tokens() + chunk() - seq.block_table().num_tokens());
  };
  // A draft is shortened rather than preempt anything for it.
  while (!draft.empty() && !kv_.can_allocate(seq.block_table(), missing_slots())) draft.pop_back();
  scored_rows_left_ -= int64_t(draft.size());
  const int64_t n = chunk();
  if (n == 0) return true;  // a scored prompt waits for rows left in a later step
  const int64_t end = seq.num_computed_tokens() + n;
  const int64_t missing = missing_slots();
  while (!kv_.can_allocate(seq.block_table(), missing)) {
    // running_ is sorted, and everything before e is already scheduled: the
    // victim (lowest priority, latest arrival) is the last one, maybe e.
    Entry* victim = running_.back();
    preempt(victim);
    ++plan.num_preempted;
    if (victim == e) return false;
  }
  auto alloc = kv_.allocate_slots(seq.block_table(), missing);
  SERVAL_CHECK(alloc.has_value(), "internal error: KV allocation failed after can_allocate");
  plan.copies.insert(plan.copies.end(), alloc->copies.begin(), alloc->copies.end());
  plan.items.push_back(ScheduledChunk{&seq, int32_t(n), seq.num_computed_tokens()});
  if (end == seq.num_tokens_with_draft()) {
    plan.sample_rows.push_back(&seq);
    if (!draft.empty()) {
      plan.num_draft.resize(plan.sample_rows.size(), 0);
      plan.num_draft.back() = int32_t(draft.size());
    }
  }
  take_scored_rows(seq, n);
  budget -= n;
  plan.num_tokens += n;
  return true;
}

void Scheduler::admit_waiting(int64_t& budget, StepPlan& plan, const StepPlan* in_flight) {
  // Seats taken: running sequences and the samples they will still fork.
  int64_t seats = 0;
  for (const Entry* r : running_) seats += 1 + r->seq.num_pending_forks();
  while (!waiting_.empty() && budget > 0) {
    Entry* e = waiting_.front();
    Sequence& seq = e->seq;
    // A request of more samples than max_num_seqs still runs, alone.
    const int64_t need = 1 + seq.num_pending_forks();
    if (seats + need > config_.max_num_seqs && seats > 0) break;
    // Nor what is aborted at its commit.
    if (in_flight && abort_pending(key_of(seq))) break;
    // Look up the prefix cache, then check, adopt and allocate, in that
    // order with nothing in between (an eviction would make the match stale).
    // A prompt being scored needs every token's logits: none from the cache.
    const bool scored = seq.scores_prompt();
    const PrefixMatch match = scored ? PrefixMatch{} : kv_.match_prefix(e->tokens);
    if (in_flight && !scored && computes_uncached_prefix(*in_flight, *e, match.num_tokens)) break;
    const int64_t n = chunk_tokens(seq, match.num_tokens, budget);
    if (n == 0) break;  // no scored rows left this step
    // Head-of-line: the next request in order waits for blocks rather than
    // being overtaken, so no request starves.
    if (!kv_.can_adopt_and_allocate(match, n)) break;
    kv_.adopt_prefix(seq.block_table(), match);
    seq.reset_computed();
    seq.advance_computed(match.num_tokens);
    auto alloc = kv_.allocate_slots(seq.block_table(), n);
    SERVAL_CHECK(alloc.has_value(), "internal error: KV allocation failed after the check");
    plan.copies.insert(plan.copies.end(), alloc->copies.begin(), alloc->copies.end());
    waiting_.pop_front();
    insert_running(e);
    seats += need;
    plan.items.push_back(ScheduledChunk{&seq, int32_t(n), match.num_tokens});
    take_scored_rows(seq, n);
    if (plan.continuation) plan.item_keys.push_back(key_of(seq));
    if (match.num_tokens + n == seq.num_tokens()) {
      plan.sample_rows.push_back(&seq);
      if (plan.continuation) plan.row_keys.push_back(key_of(seq));
    }
    budget -= n;
    plan.num_tokens += n;
  }
}

bool Scheduler::computes_uncached_prefix(const StepPlan& in_flight, const Entry& e, int64_t cached) {
  if (!kv_.prefix_cache_enabled()) return false;
  const int64_t bs = kv_.block_size();
  for (size_t i = 0; i < in_flight.items.size(); ++i) {
    const ScheduledChunk& item = in_flight.items[i];
    if (item.fed()) continue;
    const Entry* other = find_entry(item_key(in_flight, i));
    if (other == nullptr) continue;
    // Tokens [0, end) of `other` are in the KV cache after in_flight; the
    // blocks e shares with them past `cached` would be cached then.
    const int64_t end = item.first() + item.num_new_tokens;
    const int64_t len = std::min<int64_t>(end, int64_t(e.tokens.size()));
    const auto diff = std::mismatch(e.tokens.begin(), e.tokens.begin() + len, other->tokens.begin());
    const int64_t common = diff.first - e.tokens.begin();
    if (common / bs > cached / bs) return true;
  }
  return false;
}

void Scheduler::fork_samples(StepPlan& plan) {
  for (size_t row = 0; row < plan.sample_rows.size(); ++row) {
    Sequence& parent = *plan.sample_rows[row];
    const int32_t forks = parent.num_pending_forks();
    if (forks == 0) continue;
    const Entry& pe = *entries_.at(key_of(parent));
    for (int32_t i = 1; i <= forks; ++i) {
      // The table shares the blocks this step writes the prompt's K/V into.
      auto e = std::make_unique<Entry>(Entry{parent.fork(i, kv_.fork(parent.block_table())),
                                             pe.priority, pe.arrival, pe.deadline, pe.tokens,
                                             false});
      Entry* raw = e.get();
      entries_.emplace(key_of(raw->seq), std::move(e));
      insert_running(raw);
      plan.forks.push_back(StepPlan::Fork{&raw->seq, int32_t(row)});
      if (plan.continuation) plan.fork_keys.push_back(key_of(raw->seq));
    }
    parent.mark_forked();
  }
}

StepPlan Scheduler::schedule(SchedulerClock::time_point now) {
  SERVAL_CHECK(in_flight_ == 0, "schedule() called again before commit() of the previous plan");
  StepPlan plan;
  plan.copies = std::move(unused_copies_);
  unused_copies_.clear();
  expire_deadlines(now, plan);
  scored_rows_left_ = config_.max_scored_rows;
  int64_t budget = config_.max_num_batched_tokens;
  // Index loop: preemption removes entries from the back of running_.
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    if (schedule_running(running_[i], budget, plan)) ++i;
  }
  if (plan.num_preempted == 0 && (!config_.static_batching || running_.empty()))
    admit_waiting(budget, plan);
  fork_samples(plan);
  if (plan.items.empty()) std::swap(unused_copies_, plan.copies);  // for the next plan that runs
  in_flight_ = plan.items.empty() ? 0 : 1;
  scheduled_in_flight_ = in_flight_ == 1;
  return plan;
}

StepPlan Scheduler::continue_plan(const StepPlan& plan, SchedulerClock::time_point now) {
  SERVAL_CHECK(in_flight_ == 1, "continue_plan: ", in_flight_, " plans are in flight, expected the one continued");
  StepPlan next;
  next.continuation = true;
  // Which of its draft tokens are accepted is known only once its tokens are.
  if (plan.has_drafts()) return next;
  // Expired requests end now, as aborts do, unless a schedule() plan in
  // flight points at them: then schedule() expires them after its commit.
  for (const auto& [key, e] : entries_)
    if (e->deadline && *e->deadline <= now) {
      if (scheduled_in_flight_) return next;
      expire_deadlines(now, next);
      break;
    }
  // Where the plan leaves each of its sequences still here (one may have
  // finished at the commit before, or been aborted since), and its logits
  // row there, if any. Sample rows are in item order.
  struct Left {
    Entry* e;
    int64_t end;
    int32_t row;  // -1: a prompt chunk that does not complete the prompt
  };
  std::vector<Left> left;
  left.reserve(plan.items.size());
  size_t row = 0, aborting = 0;
  for (size_t i = 0; i < plan.items.size(); ++i) {
    const Key key = item_key(plan, i);
    const bool samples = row < plan.sample_rows.size() && key == row_key(plan, row);
    const int32_t item_row = samples ? int32_t(row++) : -1;
    Entry* e = find_entry(key);
    if (e == nullptr) continue;
    // Aborted at the plan's commit: not continued.
    if (abort_pending(key)) {
      ++aborting;
      continue;
    }
    left.push_back(Left{e, plan.items[i].first() + plan.items[i].num_new_tokens, item_row});
    // Penalties count every output token, and the one being sampled is not on the host yet.
    if (samples && e->seq.params().has_penalties() && !config_.fed_penalties) return next;
  }
  SERVAL_CHECK(row == plan.sample_rows.size(), "internal error: continue_plan matched ", row,
               " of the plan's ", plan.sample_rows.size(), " sample rows to its items");
  // Samples forked by the plan: their first token is its spec after the rows.
  for (size_t f = 0; f < plan.forks.size(); ++f) {
    const Key key = fork_key(plan, f);
    Entry* e = find_entry(key);
    if (e == nullptr) continue;
    if (abort_pending(key)) {
      ++aborting;
      continue;
    }
    if (e->seq.params().has_penalties() && !config_.fed_penalties) return next;
    left.push_back(Left{e, e->seq.num_tokens(), int32_t(plan.sample_rows.size() + f)});
  }
  // In schedule()'s order (forks next to their parent): the budget goes as it would.
  std::stable_sort(left.begin(), left.end(), [](const Left& a, const Left& b) {
    if (a.e->before(*b.e) || b.e->before(*a.e)) return a.e->before(*b.e);
    return a.e->seq.sample_index() < b.e->seq.sample_index();
  });
  // Everything running must be in the plan (schedule() would schedule it).
  if (left.size() + aborting != running_.size()) return next;

  // Out of budget or blocks: schedule() decides. The slots taken so far stay
  // (it uses them), and so must their copy-on-write copies: the next plan makes them.
  auto give_up = [&] {
    unused_copies_.insert(unused_copies_.end(), next.copies.begin(), next.copies.end());
    return StepPlan{};
  };
  next.copies = std::move(unused_copies_);
  unused_copies_.clear();
  int64_t budget = config_.max_num_batched_tokens;
  scored_rows_left_ = config_.max_scored_rows;
  for (const Left& l : left) {
    Sequence& seq = l.e->seq;
    ScheduledChunk chunk{&seq, 0, l.end};
    if (l.row >= 0) {
      // The plan samples the token at position end; after it the sequence
      // has end + 1 tokens and one more output.
      const int64_t outputs_after = int64_t(seq.output_ids().size()) + 1;
      if (outputs_after >= seq.stop().max_tokens ||
          (config_.max_model_len > 0 && l.end + 1 >= config_.max_model_len))
        continue;  // finishes by length at the commit: nothing to continue
      chunk.num_new_tokens = 1;
      chunk.source_row = l.row;
    } else {
      chunk.num_new_tokens = int32_t(chunk_tokens(seq, l.end, budget));
    }
    if (chunk.num_new_tokens < 1 || chunk.num_new_tokens > budget) return give_up();
    const int64_t missing = std::max<int64_t>(0, l.end + chunk.num_new_tokens - seq.block_table().num_tokens());
    if (!kv_.can_allocate(seq.block_table(), missing)) return give_up();
    auto alloc = kv_.allocate_slots(seq.block_table(), missing);
    SERVAL_CHECK(alloc.has_value(), "internal error: KV allocation failed after can_allocate");
    next.copies.insert(next.copies.end(), alloc->copies.begin(), alloc->copies.end());
    next.items.push_back(chunk);
    take_scored_rows(seq, chunk.num_new_tokens);
    next.item_keys.push_back(key_of(seq));
    if (chunk.fed() || l.end + chunk.num_new_tokens == seq.num_tokens()) {
      next.sample_rows.push_back(&seq);
      next.row_keys.push_back(key_of(seq));
    }
    budget -= chunk.num_new_tokens;
    next.num_tokens += chunk.num_new_tokens;
  }
  if (!config_.static_batching) admit_waiting(budget, next, &plan);
  fork_samples(next);
  if (next.items.empty()) return give_up();
  ++in_flight_;
  return next;
}

Scheduler::Key Scheduler::item_key(const StepPlan& plan, size_t i) {
  return plan.continuation ? plan.item_keys[i] : key_of(*plan.items[i].seq);
}

Scheduler::Key Scheduler::row_key(const StepPlan& plan, size_t i) {
  return plan.continuation ? plan.row_keys[i] : key_of(*plan.sample_rows[i]);
}

Scheduler::Key Scheduler::fork_key(const StepPlan& plan, size_t i) {
  return plan.continuation ? plan.fork_keys[i] : key_of(*plan.forks[i].seq);
}

Scheduler::Entry* Scheduler::find_entry(const Key& key) {
  auto it = entries_.find(key);
  return it == entries_.end() ? nullptr : it->second.get();
}

bool Scheduler::abort_pending(const Key& key) const {
  return std::find(pending_aborts_.begin(), pending_aborts_.end(), key) != pending_aborts_.end();
}

int64_t Scheduler::commit(const StepPlan& plan, std::span<SampledToken> sampled, std::span<const int32_t> accepted) {
  size_t num_draft = 0;
  for (int32_t d : plan.num_draft) num_draft += size_t(d);
  SERVAL_CHECK(sampled.size() == plan.sample_rows.size() + plan.forks.size() + num_draft, "commit: ",
               sampled.size(), " sampled tokens for ", plan.sample_rows.size(),
               " logits rows, ", plan.forks.size(), " forked samples and ", num_draft, " draft tokens");
  SERVAL_CHECK(accepted.empty() || accepted.size() == plan.sample_rows.size(), "commit: ", accepted.size(),
               " accepted lengths for ", plan.sample_rows.size(), " rows");
  SERVAL_CHECK(!plan.continuation || num_draft == 0, "commit: a continuation carries no draft");
  if (in_flight_ > 0) --in_flight_;
  if (!plan.continuation) scheduled_in_flight_ = false;
  if (plan.continuation) {
    // Sequences finished since the plan was made (at the commit before, or
    // aborted) were computed for nothing: their tokens are dropped.
    for (size_t i = 0; i < plan.items.size(); ++i) {
      Entry* e = find_entry(item_key(plan, i));
      if (e == nullptr) continue;
      Sequence& seq = e->seq;
      const ScheduledChunk& item = plan.items[i];
      SERVAL_CHECK(seq.num_computed_tokens() == item.start, "commit: continued sequence ", seq.id(), " has ",
                   seq.num_computed_tokens(), " tokens computed, its chunk starts at ", item.start);
      seq.advance_computed(item.num_new_tokens);
      kv_computed(seq,
                             std::span<const int32_t>(e->tokens).first(size_t(seq.num_computed_tokens())));
    }
    // Forked samples computed their parent's prompt (shared blocks) with it.
    for (const Key& key : plan.fork_keys) {
      Entry* e = find_entry(key);
      if (e == nullptr) continue;
      Sequence& seq = e->seq;
      seq.advance_computed(seq.num_tokens() - seq.num_computed_tokens());
      kv_computed(seq,
                             std::span<const int32_t>(seq.prompt_ids()).first(size_t(seq.num_computed_tokens())));
    }
    int64_t appended = 0;
    for (size_t i = 0; i < sampled.size(); ++i) {
      const size_t rows = plan.sample_rows.size();
      Entry* e = find_entry(i < rows ? row_key(plan, i) : fork_key(plan, i - rows));
      if (e == nullptr) continue;
      ++appended;
      const FinishReason finish = e->seq.append_output(sampled[i].token, std::move(sampled[i].logprobs),
                                                       config_.max_model_len);
      e->tokens.push_back(sampled[i].token);
      if (finish != FinishReason::kNone) retire(e);
    }
    apply_pending_aborts();
    return appended;
  }
  for (const ScheduledChunk& item : plan.items) {
    Sequence& seq = *item.seq;
    if (!seq.draft_ids().empty()) continue;  // commit_draft_row
    Entry* e = entries_.at(key_of(seq)).get();
    seq.advance_computed(item.num_new_tokens);
    // Only tokens whose K/V this step wrote: never the token sampled below.
    kv_computed(seq,
                           std::span<const int32_t>(e->tokens).first(size_t(seq.num_computed_tokens())));
  }
  // Forked samples computed their parent's chunk (shared blocks) with it.
  for (const StepPlan::Fork& f : plan.forks) {
    Sequence& seq = *f.seq;
    seq.advance_computed(plan.sample_rows[size_t(f.row)]->num_computed_tokens() -
                         seq.num_computed_tokens());
    kv_computed(seq,
                           std::span<const int32_t>(seq.prompt_ids()).first(size_t(seq.num_computed_tokens())));
  }
  const size_t rows = plan.sample_rows.size();
  int64_t appended = 0;
  size_t at = 0;  // into sampled
  for (size_t i = 0; i < rows + plan.forks.size(); ++i) {
    Sequence& seq = i < rows ? *plan.sample_rows[i] : *plan.forks[i - rows].seq;
    Entry* e = entries_.at(key_of(seq)).get();
    const int32_t d = i < rows ? plan.draft_of(i) : 0;
    if (d > 0) {
      appended += commit_draft_row(e, sampled.subspan(at, size_t(1 + d)), accepted.empty() ? 1 : accepted[i]);
      at += size_t(1 + d);
      continue;
    }
    const FinishReason finish = seq.append_output(sampled[at].token,
                                                  std::move(sampled[at].logprobs),
                                                  config_.max_model_len);
    e->tokens.push_back(sampled[at].token);
    ++at;
    ++appended;
    if (finish != FinishReason::kNone) retire(e);
  }
  apply_pending_aborts();
  return appended;
}

void Scheduler::fail_step(const StepPlan& plan) {
  if (in_flight_ > 0) --in_flight_;
  if (!plan.continuation) scheduled_in_flight_ = false;
  // Keys first: retiring frees the sequences a schedule() plan points at.
  std::vector<Key> failed;
  for (size_t i = 0; i < plan.items.size(); ++i) failed.push_back(item_key(plan, i));
  for (size_t f = 0; f < plan.forks.size(); ++f) failed.push_back(fork_key(plan, f));
  for (const Key& k : failed) {
    Entry* e = find_entry(k);
    if (e == nullptr) continue;
    e->seq.finish(FinishReason::kError);
    retire(e);
  }
  apply_pending_aborts();
}

void Scheduler::apply_pending_aborts() {
  std::vector<Key> aborts = std::move(pending_aborts_);
  pending_aborts_.clear();
  for (const Key& k : aborts) abort_entry(k);
}

void Scheduler::abort_entry(const Key& key) {
  auto it = entries_.find(key);
  if (it == entries_.end()) return;
  if (scheduled_in_flight_) {
    if (!abort_pending(key)) pending_aborts_.push_back(key);
    return;
  }
  Entry* e = it->second.get();
  e->seq.finish(FinishReason::kAbort);
  retire(e);
}

bool Scheduler::abort(int64_t id) {
  std::vector<Key> keys;
  for (auto it = entries_.lower_bound(Key{id, INT32_MIN});
       it != entries_.end() && it->first.first == id; ++it)
    keys.push_back(it->first);
  for (const Key& k : keys) abort_entry(k);
  return !keys.empty();
}

bool Scheduler::abort_sample(int64_t id, int32_t sample_index) {
  if (!entries_.count(Key{id, sample_index})) return false;
  abort_entry(Key{id, sample_index});
  return true;
}

std::vector<Sequence> Scheduler::take_finished() {
  std::vector<Sequence> out = std::move(finished_);
  finished_.clear();
  return out;
}

const Sequence* Scheduler::find(int64_t id, int32_t sample_index) const {
  auto it = entries_.find(Key{id, sample_index});
  return it == entries_.end() ? nullptr : &it->second->seq;
}

Sequence* Scheduler::find(int64_t id, int32_t sample_index) {
  auto it = entries_.find(Key{id, sample_index});
  return it == entries_.end() ? nullptr : &it->second->seq;
}

SchedulerCounts Scheduler::stats() const {
  SchedulerCounts s;
  s.num_running = int64_t(running_.size());
  s.num_waiting = int64_t(waiting_.size());
  s.num_preemptions = num_preemptions_;
  const PrefixCacheStats p = kv_.prefix_cache_stats();
  s.prefix_query_tokens = p.query_tokens;
  s.prefix_hit_tokens = p.hit_tokens;
  return s;
}

}  // namespace serval
