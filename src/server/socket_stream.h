#pragma once
// SocketStream: httplib::Stream over one accepted TCP socket, owned by
// HttpServer's connection loop. Reads are buffered (httplib reads request
// lines a byte at a time) and bounded twice: each read waits at most
// `read_timeout`, and a whole request (headers and body) must arrive before
// the deadline set by start_request() — so a slowloris client that trickles a
// byte every few seconds is cut off. Writes never raise SIGPIPE.
#include <chrono>
#include <string>

#include <httplib.h>

namespace serval::server {

class SocketStream : public httplib::Stream {
 public:
  using Clock = std::chrono::steady_clock;
  SocketStream(int fd, std::chrono::milliseconds read_timeout, std::chrono::milliseconds write_timeout);

  // Starts the read deadline of the next request.
  void start_request(Clock::time_point deadline) { deadline_ = deadline; }
  // Buffered bytes not yet consumed (a pipelined request).
  bool has_buffered() const { return pos_ < end_; }

  bool is_readable() const override;
  bool is_writable() const override;
  ssize_t read(char* ptr, size_t size) override;
  ssize_t write(const char* ptr, size_t size) override;
  void get_remote_ip_and_port(std::string& ip, int& port) const override;
  void get_local_ip_and_port(std::string& ip, int& port) const override;
  socket_t socket() const override { return fd_; }

 private:
  int fd_;
  std::chrono::milliseconds read_timeout_, write_timeout_;
  Clock::time_point deadline_ = Clock::time_point::max();
  char buf_[4096];
  size_t pos_ = 0, end_ = 0;
};

// Waits up to `timeout` for `fd` to have input (or EOF); false on timeout.
bool wait_readable(int fd, std::chrono::milliseconds timeout);
// True when the peer of `fd` has closed or reset the connection. Does not
// consume pending input (a pipelined request is not a disconnect).
bool peer_closed(int fd);

}  // namespace serval::server
