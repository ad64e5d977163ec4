// SseReader against streams cut at every byte: the events of the SSE format
// (multi-line data, comments, other fields, \r\n and \r line ends) come out
// whole and only once complete.
#include "server/sse_reader.h"

#include <gtest/gtest.h>

namespace serval::server {
namespace {

std::vector<std::string> read_all(std::string_view stream, size_t piece) {
  SseReader r;
  std::vector<std::string> events;
  for (size_t i = 0; i < stream.size(); i += piece) r.feed(stream.substr(i, piece), events);
  return events;
}

TEST(SseReader, EventsOfAStreamCutAnywhere) {
  const std::string stream =
      "data: {\"a\":1}\n\n"
      ": a comment\r\n"
      "event: chunk\r\n"
      "id: 7\r\n"
      "data: line one\r\n"
      "data:line two\r\n\r\n"
      "data: \rdata\r\r"
      "retry: 10\n\n"  // no data: no event
      "data: [DONE]\n\n";
  const std::vector<std::string> want = {"{\"a\":1}", "line one\nline two", "\n", "[DONE]"};
  for (size_t piece = 1; piece <= stream.size(); ++piece) EXPECT_EQ(read_all(stream, piece), want) << piece;
}

TEST(SseReader, NothingBeforeTheBlankLine) {
  SseReader r;
  std::vector<std::string> events;
  r.feed("data: {\"x\":", events);
  r.feed("2}\n", events);
  EXPECT_TRUE(events.empty());
  r.feed("\n", events);
  EXPECT_EQ(events, std::vector<std::string>{"{\"x\":2}"});
}

}  // namespace
}  // namespace serval::server
