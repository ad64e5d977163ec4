#pragma once
// The client's side of server-sent events: bytes as they arrive (cut
// anywhere) in, the data of each complete event out. Per the SSE format:
// lines end in \n, \r\n or \r; an event ends at a blank line; its "data:"
// lines (one optional space after the colon) are joined with \n; comments
// (":...") and other fields are skipped. serval bench --mode serve reads a
// server's stream with it.
#include <string>
#include <string_view>
#include <vector>

namespace serval::server {

class SseReader {
 public:
  // Appends the data of every event that `bytes` completes to `events`.
  void feed(std::string_view bytes, std::vector<std::string>& events);

 private:
  void line(std::string_view l, std::vector<std::string>& events);

  std::string partial_;  // a line not yet ended
  std::string data_;     // the event so far
  bool has_data_ = false;
  bool after_cr_ = false;  // the last byte was \r: a \n next belongs to it
};

}  // namespace serval::server
