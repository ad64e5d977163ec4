#pragma once
// Splits added/special tokens (e.g. "<|eot_id|>", "<s>") out of a text before
// BPE runs on the pieces in between. Matching is leftmost-longest, as the
// Hugging Face tokenizers' added-vocabulary matcher does.
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace serval {

struct TextFragment {
  std::string_view text;  // plain text to tokenize (when id < 0)
  int32_t id = -1;        // an added token found in the text
};

class SpecialSplitter {
 public:
  // lstrip/rstrip: the token swallows whitespace on its left/right (HF AddedToken flags).
  void add(const std::string& content, int32_t id, bool lstrip = false, bool rstrip = false);
  bool empty() const { return nodes_.size() <= 1; }
  // Fragments in text order; empty plain-text fragments are left out.
  std::vector<TextFragment> split(std::string_view text) const;

 private:
  struct Node {
    std::map<unsigned char, int32_t> next;
    int32_t id = -1;
    bool lstrip = false, rstrip = false;
  };
  std::vector<Node> nodes_{1};
};

}  // namespace serval
