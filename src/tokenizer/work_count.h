#pragma once
// Counts the steps of the tokenizer's inner loops on the calling thread, so a
// test can check that encoding grows linearly with the text by the work done,
// not by wall-clock time, which a loaded machine stretches. Off unless a
// CountTokenizerWork is alive on the thread; then each loop adds its counts
// once per call, so production encodes pay one thread-local read per call.
#include <cstdint>

namespace serval {

struct TokenizerWork {
  int64_t special_steps = 0;  // added-token trie steps, one per text position at least
  int64_t regex_steps = 0;    // pre-tokenizer regex items tried, backtracking included
  int64_t words = 0;          // pre-tokenized pieces given to byte-level BPE (cached or merged)
  int64_t merge_pairs = 0;    // candidate pairs looked up and queued by a merge loop
  int64_t merge_pops = 0;     // candidates taken off a merge loop's queue, stale ones included

  int64_t total() const { return special_steps + regex_steps + words + merge_pairs + merge_pops; }
};

namespace detail {
inline thread_local TokenizerWork* tokenizer_work = nullptr;
}  // namespace detail

// The counts being kept on this thread, or null (the usual case).
inline TokenizerWork* tokenizer_work() { return detail::tokenizer_work; }

// Counts the work of every encode on this thread while it lives.
class CountTokenizerWork {
 public:
  CountTokenizerWork() : outer_(detail::tokenizer_work) { detail::tokenizer_work = &work_; }
  ~CountTokenizerWork() { detail::tokenizer_work = outer_; }
  CountTokenizerWork(const CountTokenizerWork&) = delete;
  CountTokenizerWork& operator=(const CountTokenizerWork&) = delete;
  const TokenizerWork& work() const { return work_; }

 private:
  TokenizerWork work_;
  TokenizerWork* outer_;
};

}  // namespace serval
