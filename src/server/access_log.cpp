#include "server/access_log.h"

#include <cstdio>

namespace serval::server {
namespace {

thread_local AccessRecord tl_record;

// The path as sent may hold any bytes: print it %-escaped and bounded.
std::string printable(const std::string& s, size_t max_len = 200) {
  std::string out;
  for (unsigned char c : s) {
    if (out.size() >= max_len) {
      out += "...";
      break;
    }
    if (c > 0x20 && c < 0x7f && c != '%') {
      out += char(c);
    } else {
      char hex[4];
      std::snprintf(hex, sizeof(hex), "%%%02X", c);
      out += hex;
    }
  }
  return out;
}

double ms(AccessRecord::Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

}  // namespace

AccessRecord& current_access_record() { return tl_record; }

void start_access_record() {
  tl_record = AccessRecord{};
  tl_record.start = AccessRecord::Clock::now();
}

std::string format_access_line(const AccessRecord& r, AccessRecord::Clock::time_point end) {
  char buf[256];
  std::string line = "access id=" + (r.id.empty() ? std::string("-") : r.id) + " " + printable(r.method, 16) + " " +
                     printable(r.path);
  std::snprintf(buf, sizeof(buf), " status=%d", r.status);
  line += buf;
  if (r.prompt_tokens >= 0) line += " prompt_tokens=" + std::to_string(r.prompt_tokens);
  if (r.completion_tokens >= 0) line += " completion_tokens=" + std::to_string(r.completion_tokens);
  if (r.first_token) {
    std::snprintf(buf, sizeof(buf), " ttft_ms=%.1f", ms(*r.first_token - r.start));
    line += buf;
  }
  std::snprintf(buf, sizeof(buf), " total_ms=%.1f", ms(end - r.start));
  line += buf;
  return line;
}

void write_access_log() {
  if (tl_record.method.empty() && tl_record.status == 0) return;
  std::string line = format_access_line(tl_record, AccessRecord::Clock::now());
  line += '\n';
  std::fwrite(line.data(), 1, line.size(), stderr);
}

}  // namespace serval::server
