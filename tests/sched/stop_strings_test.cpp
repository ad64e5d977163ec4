#include "sched/stop_strings.h"

#include <gtest/gtest.h>

#include <random>

#include "core/error.h"

namespace serval {
namespace {

// Feeds the deltas, collecting everything emitted (plus flush() if no match).
struct Streamed {
  std::vector<std::string> pieces;  // feed() results, one per delta
  std::string text;
  std::optional<StopStringMatch> match;
};

Streamed stream(StopStringMatcher& m, const std::vector<std::string>& deltas) {
  Streamed s;
  for (const std::string& d : deltas) {
    StopStringMatcher::Result r = m.feed(d);
    s.pieces.push_back(r.text);
    s.text += r.text;
    if (r.match) {
      EXPECT_FALSE(s.match) << "a second match was reported";
      s.match = r.match;
    }
  }
  s.text += m.flush();
  EXPECT_EQ(s.text, m.output_text());
  return s;
}

TEST(StopStringMatcher, StopSpanningTokensIsCutAndNotEmitted) {
  StopStringMatcher m({"###"});
  Streamed s = stream(m, {"Hello", " wor", "ld#", "#", "# and more", "ignored"});
  EXPECT_EQ(s.text, "Hello world");
  // The '#' after "ld" is held back until the next delta decides it.
  EXPECT_EQ(s.pieces, (std::vector<std::string>{"Hello", " wor", "ld", "", "", ""}));
  ASSERT_TRUE(s.match);
  EXPECT_EQ(s.match->stop_index, 0u);
  EXPECT_EQ(s.match->match_begin, 11u);
  EXPECT_EQ(s.match->truncate_at, 11u);
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.matched_string(), "###");
}

TEST(StopStringMatcher, HeldBackTextIsReleasedWhenPrefixBreaks) {
  StopStringMatcher m({"</end>"});
  EXPECT_EQ(m.feed("a</e").text, "a");
  EXPECT_EQ(m.held_back_bytes(), 3u);
  EXPECT_EQ(m.feed("x").text, "</ex");  // no longer a possible stop start
  EXPECT_EQ(m.held_back_bytes(), 0u);
  EXPECT_EQ(m.feed("<").text, "");
  EXPECT_EQ(m.flush(), "<");  // generation ended without a match
  EXPECT_EQ(m.output_text(), "a</ex<");
  EXPECT_FALSE(m.stopped());
  EXPECT_EQ(m.flush(), "");
  EXPECT_EQ(m.feed("more").text, "");  // finished: ignored
}

TEST(StopStringMatcher, HoldsBackOnlyWhatCouldStartAStop) {
  // A tail that cannot begin a stop string is emitted at once (vLLM would hold
  // back max_len - 1 characters regardless).
  StopStringMatcher m({"STOP"});
  EXPECT_EQ(m.feed("abcdefgh").text, "abcdefgh");
  EXPECT_EQ(m.feed("xxST").text, "xx");
  EXPECT_EQ(m.feed("O").text, "");
  EXPECT_EQ(m.held_back_bytes(), 3u);
  StopStringMatcher::Result r = m.feed("P!");
  EXPECT_EQ(r.text, "");
  EXPECT_EQ(m.output_text(), "abcdefghxx");
  ASSERT_TRUE(r.match);
  EXPECT_EQ(r.match->match_begin, 10u);
}

TEST(StopStringMatcher, IncludeStopStringInOutput) {
  StopStringMatcher m({"###"}, /*include_stop_str_in_output=*/true);
  // Nothing is held back: a partial stop string is either completed (and
  // included) or ordinary text.
  EXPECT_EQ(m.feed("ab#").text, "ab#");
  EXPECT_EQ(m.feed("#").text, "#");
  StopStringMatcher::Result r = m.feed("#tail");
  EXPECT_EQ(r.text, "#");  // the stop string ends the text; "tail" is dropped
  ASSERT_TRUE(r.match);
  EXPECT_EQ(r.match->match_begin, 2u);
  EXPECT_EQ(r.match->truncate_at, 5u);
  EXPECT_EQ(m.output_text(), "ab###");
  EXPECT_EQ(m.flush(), "");
}

TEST(StopStringMatcher, StopInsideOneDeltaDropsTheRestOfIt) {
  StopStringMatcher m({"\n\n"});
  StopStringMatcher::Result r = m.feed("line one\n\nline two");
  EXPECT_EQ(r.text, "line one");
  ASSERT_TRUE(r.match);
  EXPECT_EQ(r.match->truncate_at, 8u);
}

TEST(StopStringMatcher, StopAtTheVeryStart) {
  StopStringMatcher m({"x"});
  StopStringMatcher::Result r = m.feed("xyz");
  EXPECT_EQ(r.text, "");
  ASSERT_TRUE(r.match);
  EXPECT_EQ(r.match->truncate_at, 0u);
  EXPECT_EQ(m.output_text(), "");
}

TEST(StopStringMatcher, EarliestEndingMatchWinsAmongOverlappingStops) {
  // "bc" is complete before "abcd" is, so a character stream stops at "bc";
  // a single delta must give the same answer.
  for (const std::vector<std::string>& deltas :
       {std::vector<std::string>{"xabcd"}, {"x", "a", "b", "c", "d"}, {"xa", "bcd"}}) {
    StopStringMatcher m({"abcd", "bc"});
    Streamed s = stream(m, deltas);
    EXPECT_EQ(s.text, "xa");
    ASSERT_TRUE(s.match);
    EXPECT_EQ(s.match->stop_index, 1u);
  }
  // Not list order (vLLM's rule would pick "cd" here and emit "ab", which
  // contains the stop string "ab").
  StopStringMatcher m({"cd", "ab"});
  Streamed s = stream(m, {"abcd"});
  EXPECT_EQ(s.text, "");
  EXPECT_EQ(s.match->stop_index, 1u);
}

TEST(StopStringMatcher, StopThatIsAPrefixOfAnother) {
  // "ab" completes first, so it wins even when "abc" follows.
  StopStringMatcher a({"abc", "ab"}, true);
  Streamed s = stream(a, {"xabc"});
  EXPECT_EQ(s.text, "xab");
  EXPECT_EQ(s.match->stop_index, 1u);
  // Same end, different starts: the longer (earlier-starting) one wins, so
  // the emitted text is the shortest.
  StopStringMatcher b({"bc", "abc"});
  s = stream(b, {"x", "ab", "c"});
  EXPECT_EQ(s.text, "x");
  EXPECT_EQ(s.match->stop_index, 1u);
}

TEST(StopStringMatcher, SelfOverlappingStopString) {
  StopStringMatcher m({"aab"});
  Streamed s = stream(m, {"a", "a", "a", "b", "zz"});
  EXPECT_EQ(s.text, "a");
  EXPECT_EQ(s.pieces, (std::vector<std::string>{"", "", "a", "", ""}));
  EXPECT_EQ(s.match->match_begin, 1u);
}

TEST(StopStringMatcher, MultiByteCharacters) {
  // "終わり" = 9 bytes; deltas are whole characters, and so is what is emitted.
  StopStringMatcher m({"終わり", "🛑"});
  EXPECT_EQ(m.feed("こんにちは終").text, "こんにちは");
  EXPECT_EQ(m.feed("わ").text, "");
  EXPECT_EQ(m.feed("る").text, "終わる");  // "終わる" is not "終わり"
  StopStringMatcher::Result r = m.feed("é🛑ü");
  EXPECT_EQ(r.text, "é");
  ASSERT_TRUE(r.match);
  EXPECT_EQ(r.match->stop_index, 1u);
  EXPECT_EQ(r.match->truncate_at, std::string("こんにちは終わるé").size());
}

TEST(StopStringMatcher, EmptyDeltasAndNoStopStrings) {
  StopStringMatcher m({"END"});
  EXPECT_EQ(m.feed("").text, "");
  EXPECT_EQ(m.feed("E").text, "");
  EXPECT_EQ(m.feed("").text, "");
  EXPECT_EQ(m.held_back_bytes(), 1u);
  StopStringMatcher::Result r = m.feed("ND");
  EXPECT_TRUE(r.match);

  StopStringMatcher none({});
  EXPECT_EQ(none.feed("any text").text, "any text");
  EXPECT_EQ(none.flush(), "");
  EXPECT_EQ(none.output_text(), "any text");
}

TEST(StopStringMatcher, LongStopStringAcrossManySmallDeltas) {
  const std::string stop = "<|end_of_a_very_long_stop_sequence|>";
  StopStringMatcher m({stop});
  std::vector<std::string> deltas = {"answer: 42"};
  for (char c : stop) deltas.emplace_back(1, c);
  deltas.push_back("after");
  Streamed s = stream(m, deltas);
  EXPECT_EQ(s.text, "answer: 42");
  EXPECT_EQ(s.match->match_begin, 10u);
}

TEST(StopStringMatcher, UncheckedDeltasForMinTokens) {
  StopStringMatcher m({"ab"});
  // Inside min_tokens a complete stop string is ordinary text...
  EXPECT_EQ(m.feed("xab", /*check_stop=*/false).text, "xab");
  EXPECT_FALSE(m.stopped());
  EXPECT_EQ(m.feed("c").text, "c");  // ...and is not found later either.
  // A stop string that starts before the end of min_tokens and ends after it
  // is found (as vLLM); its start was held back meanwhile.
  EXPECT_EQ(m.feed("da", false).text, "d");
  StopStringMatcher::Result r = m.feed("b!");
  ASSERT_TRUE(r.match);
  EXPECT_EQ(r.match->match_begin, 5u);
  EXPECT_EQ(m.output_text(), "xabcd");
}

TEST(StopStringMatcher, RejectsEmptyStopString) {
  EXPECT_THROW(StopStringMatcher({"ok", ""}), Error);
  StopStringMatcher m({"a"});
  EXPECT_THROW(m.matched_string(), Error);
}

// Reference: the earliest-ending occurrence (longest on ties) in the whole
// text, among those ending after the first `unchecked` bytes.
std::string reference_output(const std::string& text, const std::vector<std::string>& stops,
                             bool include, size_t unchecked, std::optional<size_t>* stop_index) {
  size_t best_end = std::string::npos, best_begin = 0;
  for (size_t i = 0; i < stops.size(); ++i) {
    for (size_t begin = 0; begin + stops[i].size() <= text.size(); ++begin) {
      const size_t end = begin + stops[i].size();
      if (end <= unchecked || text.compare(begin, stops[i].size(), stops[i]) != 0) continue;
      if (end < best_end || (end == best_end && begin < best_begin)) {
        best_end = end;
        best_begin = begin;
        *stop_index = i;
      }
    }
  }
  if (best_end == std::string::npos) return text;
  return text.substr(0, include ? best_end : best_begin);
}

// Longest suffix of `text` that is a proper prefix of some stop string.
size_t reference_hold(const std::string& text, const std::vector<std::string>& stops) {
  size_t best = 0;
  for (const std::string& s : stops)
    for (size_t k = 1; k < s.size() && k <= text.size(); ++k)
      if (text.compare(text.size() - k, k, s, 0, k) == 0) best = std::max(best, k);
  return best;
}

TEST(StopStringMatcher, RandomTextsAndSplitsMatchTheReference) {
  std::mt19937 rng(1234);
  auto random_string = [&](size_t max_len) {
    std::string s(1 + rng() % max_len, 'a');
    for (char& c : s) c = "abc"[rng() % 3];
    return s;
  };
  for (int trial = 0; trial < 3000; ++trial) {
    std::vector<std::string> stops(1 + rng() % 3);
    for (std::string& s : stops) s = random_string(4);
    const std::string text = random_string(24);
    const bool include = rng() % 2;
    std::vector<std::string> deltas;
    for (size_t pos = 0; pos < text.size();) {
      size_t len = std::min<size_t>(rng() % 5, text.size() - pos);  // 0 = empty delta
      deltas.push_back(text.substr(pos, len));
      pos += len;
    }
    // The first deltas are sometimes unchecked (min_tokens).
    const size_t num_unchecked = rng() % 4 == 0 ? rng() % (deltas.size() + 1) : 0;
    size_t unchecked_bytes = 0;
    for (size_t i = 0; i < num_unchecked; ++i) unchecked_bytes += deltas[i].size();
    StopStringMatcher m(stops, include);
    std::string so_far, emitted;
    for (size_t i = 0; i < deltas.size(); ++i) {
      const std::string& d = deltas[i];
      if (m.stopped()) break;
      emitted += m.feed(d, /*check_stop=*/i >= num_unchecked).text;
      so_far += d;
      if (!m.stopped()) {  // everything but the minimal possible stop start is out
        size_t hold = include ? 0 : reference_hold(so_far, stops);
        ASSERT_EQ(emitted, so_far.substr(0, so_far.size() - hold))
            << "trial " << trial << " text " << text;
      }
    }
    emitted += m.flush();
    std::optional<size_t> stop_index;
    ASSERT_EQ(emitted, reference_output(text, stops, include, unchecked_bytes, &stop_index))
        << "trial " << trial << " text " << text;
    ASSERT_EQ(m.stopped(), stop_index.has_value());
    if (stop_index) {
      EXPECT_EQ(m.match()->stop_index, *stop_index);
      EXPECT_EQ(m.match()->truncate_at, emitted.size());
    }
  }
}

}  // namespace
}  // namespace serval
