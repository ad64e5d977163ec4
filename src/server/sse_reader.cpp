#include "server/sse_reader.h"

namespace serval::server {

void SseReader::feed(std::string_view bytes, std::vector<std::string>& events) {
  for (const char c : bytes) {
    if (after_cr_) {
      after_cr_ = false;
      if (c == '\n') continue;  // \r\n: the line ended at \r
    }
    if (c == '\r' || c == '\n') {
      after_cr_ = c == '\r';
      line(partial_, events);
      partial_.clear();
    } else {
      partial_ += c;
    }
  }
}

void SseReader::line(std::string_view l, std::vector<std::string>& events) {
  if (l.empty()) {  // the event ends
    if (has_data_) events.push_back(data_);
    data_.clear();
    has_data_ = false;
    return;
  }
  if (l.front() == ':') return;  // a comment
  const size_t colon = l.find(':');
  const std::string_view field = l.substr(0, colon);
  std::string_view value = colon == std::string_view::npos ? std::string_view() : l.substr(colon + 1);
  if (!value.empty() && value.front() == ' ') value.remove_prefix(1);
  if (field != "data") return;
  if (has_data_) data_ += '\n';
  data_ += value;
  has_data_ = true;
}

}  // namespace serval::server
