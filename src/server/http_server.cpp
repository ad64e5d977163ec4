#include "server/http_server.h"

#include <sys/socket.h>
#include <algorithm>
#include <unistd.h>

#include "core/error.h"
#include "server/access_log.h"
#include "server/api_error.h"
#include "server/connection_pool.h"
#include "server/listen_socket.h"
#include "server/socket_stream.h"

namespace serval::server {
namespace {

// The connection the calling thread serves (-1: none), for client_disconnected().
thread_local int tl_connection_fd = -1;
// Set by the error handler when the connection must close after the response
// (a refused body was never read, so the stream is out of step).
thread_local bool tl_close_after_response = false;

bool needs_api_key(const std::string& path) {
  return path.rfind("/v1/", 0) == 0 || path == "/tokenize" || path == "/detokenize";
}

// Compares without stopping at the first difference.
bool same_secret(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= uint8_t(a[i]) ^ uint8_t(b[i]);
  return diff == 0;
}

}  // namespace

bool client_disconnected() { return tl_connection_fd >= 0 && peer_closed(tl_connection_fd); }

HttpServer::HttpServer(HttpLimits limits, std::string api_key)
    : limits_(limits), api_key_(std::move(api_key)) {
  new_task_queue = [n = limits_.max_connections] { return new ConnectionPool(n); };
  set_payload_max_length(limits_.max_body_bytes);
  // Only for the Keep-Alive header httplib writes; the connection loop below enforces them.
  set_keep_alive_max_count(limits_.max_keep_alive_requests);
  set_keep_alive_timeout(std::max<time_t>(1, limits_.keep_alive_timeout.count() / 1000));
  set_logger([](const httplib::Request& req, const httplib::Response& res) {
    AccessRecord& r = current_access_record();
    r.method = req.method;
    r.path = req.path;
    if (r.status != 499) r.status = res.status;
  });
  set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    AccessRecord& r = current_access_record();
    r.method = req.method;
    r.path = req.path;
    if (draining_ && req.path != "/metrics") {
      write_error(res, ApiError(503, "the server is shutting down", "", "shutting_down"));
      return HandlerResponse::Handled;
    }
    if (!api_key_.empty() && needs_api_key(req.path) && !authorized(req)) {
      write_error(res, ApiError(401,
                                "missing or wrong API key: send the header 'Authorization: Bearer "
                                "<key>' with the key given to --api-key",
                                "", "invalid_api_key"));
      return HandlerResponse::Handled;
    }
    return HandlerResponse::Unhandled;
  });
  // httplib's own refusals (no route, bad request line, body too large) come
  // with an empty body: give them OpenAI's shape.
  set_error_handler(HandlerWithResponse([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return HandlerResponse::Unhandled;
    std::string message, code;
    switch (res.status) {
      case 404: message = str_cat("no route for ", req.method, " ", req.path); code = "not_found"; break;
      case 405: message = str_cat("method ", req.method, " not allowed on ", req.path); break;
      case 413:
        message = "request body too large (see --max-body-bytes)";
        code = "request_too_large";
        tl_close_after_response = true;
        break;
      case 414: message = "request URI too long"; tl_close_after_response = true; break;
      default:
        message = str_cat("bad request (HTTP ", res.status, ")");
        tl_close_after_response = true;
    }
    write_error(res, ApiError(res.status, message, "", code));
    return HandlerResponse::Handled;
  }));
}

bool HttpServer::authorized(const httplib::Request& req) const {
  const std::string value = req.get_header_value("Authorization");
  const std::string prefix = "Bearer ";
  if (value.rfind(prefix, 0) != 0) return false;
  return same_secret(value.substr(prefix.size()), api_key_);
}

int HttpServer::bind(const std::string& host, int port) {
  // Our own socket instead of httplib's bind_to_port (see listen_socket.h);
  // its backlog is sized for bursts (httplib listens with 5).
  const ListenSocket s = open_listen_socket(host, port, limits_.listen_backlog, /*tcp_nodelay=*/true);
  svr_sock_ = s.fd;
  return s.port;
}

void HttpServer::serve() { listen_after_bind(); }

void HttpServer::begin_drain() {
  if (draining_.exchange(true)) return;
  // Wakes httplib's accept loop with an error: it closes the listening socket
  // and waits for the connections. (stop() would also cut streaming responses.)
  const socket_t s = svr_sock_;
  if (s != INVALID_SOCKET) ::shutdown(s, SHUT_RDWR);
}

bool HttpServer::process_and_close_socket(socket_t sock) {
  SocketStream stream(sock, limits_.io_timeout, limits_.io_timeout);
  tl_connection_fd = sock;
  bool ok = true;
  for (size_t served = 0; served < limits_.max_keep_alive_requests; ++served) {
    // Wait for the next request in short slices so that a drain closes idle connections.
    const auto idle_until = SocketStream::Clock::now() + limits_.keep_alive_timeout;
    bool readable = stream.has_buffered();
    while (!readable && !draining_ && SocketStream::Clock::now() < idle_until)
      readable = wait_readable(sock, std::chrono::milliseconds(100));
    if (!readable || (draining_ && !stream.has_buffered())) break;
    stream.start_request(SocketStream::Clock::now() + limits_.request_read_timeout);
    tl_close_after_response = false;
    bool closed = false;
    const bool last = served + 1 == limits_.max_keep_alive_requests || draining_;
    start_access_record();
    ok = process_request(stream, last, closed, nullptr);
    write_access_log();
    if (!ok || closed || tl_close_after_response) break;
  }
  tl_connection_fd = -1;
  ::shutdown(sock, SHUT_RDWR);
  ::close(sock);
  return ok;
}

}  // namespace serval::server
