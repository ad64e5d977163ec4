#pragma once
// HttpServer: cpp-httplib's Server with what serving needs on top:
// - connections run on a ConnectionPool that grows with the load (a thread per
//   live connection, up to max_connections), behind a listen backlog sized for
//   bursts (httplib's own is 5);
// - Serval's own per-connection loop (keep-alive, pipelining) over a
//   SocketStream, so that each request has a read deadline (slowloris) and the
//   handler can ask client_disconnected() for its connection;
// - limits: body size (413), API key (401 on /v1/*, /tokenize, /detokenize
//   when set), errors in OpenAI's shape for whatever httplib refuses itself;
// - draining: begin_drain() stops accepting connections, answers new requests
//   on open connections with 503 and closes connections after their current
//   request, while in-flight requests (streams included) run to their end.
#include <atomic>
#include <chrono>
#include <cstddef>
#include <string>

#include <httplib.h>

namespace serval::server {

struct HttpLimits {
  size_t max_body_bytes = 8u << 20;
  // A whole request (headers and body) must arrive within this time.
  std::chrono::milliseconds request_read_timeout{10000};
  // Longest wait for one read or write of the socket to make progress.
  std::chrono::milliseconds io_timeout{10000};
  std::chrono::milliseconds keep_alive_timeout{5000};
  size_t max_keep_alive_requests = 1000;
  size_t max_connections = 2048;
  int listen_backlog = 4096;
};

class HttpServer : public httplib::Server {
 public:
  // `api_key` empty: no authentication.
  HttpServer(HttpLimits limits, std::string api_key);

  // Binds host:port (port 0: any free port); returns the port, throws
  // serval::Error when the address cannot be bound (a port in use included:
  // the socket is not shared, see listen_socket.h).
  int bind(const std::string& host, int port);
  // Serves until drained (or stop()); returns when every connection is closed.
  void serve();
  // Stops accepting connections; see the header comment.
  void begin_drain();
  bool draining() const { return draining_.load(); }

 private:
  bool process_and_close_socket(socket_t sock) override;
  bool authorized(const httplib::Request& req) const;

  const HttpLimits limits_;
  const std::string api_key_;
  std::atomic<bool> draining_{false};
};

// Inside a handler or a content provider: true when the client of the
// calling thread's connection has closed it (the request should be aborted).
bool client_disconnected();

}  // namespace serval::server
