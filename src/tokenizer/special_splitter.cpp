#include "tokenizer/special_splitter.h"

#include "tokenizer/work_count.h"

namespace serval {

namespace {
bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }
}  // namespace

void SpecialSplitter::add(const std::string& content, int32_t id, bool lstrip, bool rstrip) {
  if (content.empty()) return;
  int32_t node = 0;
  for (unsigned char c : content) {
    auto it = nodes_[node].next.find(c);
    if (it == nodes_[node].next.end()) {
      nodes_.push_back({});
      int32_t fresh = static_cast<int32_t>(nodes_.size() - 1);
      nodes_[node].next.emplace(c, fresh);
      node = fresh;
    } else {
      node = it->second;
    }
  }
  nodes_[node].id = id;
  nodes_[node].lstrip = lstrip;
  nodes_[node].rstrip = rstrip;
}

std::vector<TextFragment> SpecialSplitter::split(std::string_view text) const {
  std::vector<TextFragment> out;
  size_t plain_start = 0, i = 0;
  int64_t steps = 0;  // for work_count.h
  while (i < text.size()) {
    // Longest token starting at i.
    int32_t node = 0, best = -1;
    size_t best_end = 0;
    for (size_t j = i; j < text.size(); ++j) {
      ++steps;
      auto it = nodes_[node].next.find(static_cast<unsigned char>(text[j]));
      if (it == nodes_[node].next.end()) break;
      node = it->second;
      if (nodes_[node].id >= 0) {
        best = node;
        best_end = j + 1;
      }
    }
    if (best < 0) {
      ++i;
      continue;
    }
    size_t plain_end = i;
    if (nodes_[best].lstrip)
      while (plain_end > plain_start && is_space(text[plain_end - 1])) --plain_end;
    if (plain_end > plain_start) out.push_back({text.substr(plain_start, plain_end - plain_start), -1});
    out.push_back({{}, nodes_[best].id});
    i = best_end;
    if (nodes_[best].rstrip)
      while (i < text.size() && is_space(text[i])) ++i;
    plain_start = i;
  }
  if (plain_start < text.size()) out.push_back({text.substr(plain_start), -1});
  if (TokenizerWork* work = tokenizer_work()) work->special_steps += steps;
  return out;
}

}  // namespace serval
