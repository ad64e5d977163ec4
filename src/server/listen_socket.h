#pragma once
// The server's listening socket, opened here rather than by cpp-httplib:
// httplib sets SO_REUSEPORT, with which a second server started on a port
// already in use binds too and the kernel splits the connections between the
// two. This socket sets SO_REUSEADDR only (a restart may bind while the old
// process's connections sit in TIME_WAIT), so a port in use is an error.
#include <string>

namespace serval::server {

struct ListenSocket {
  int fd = -1;
  int port = 0;  // the bound port (the one the kernel picked for port 0)
};

// Binds host:port (port 0: any free port) and listens with `backlog`.
// Throws serval::Error naming the address and the reason, e.g.
// "cannot listen on 127.0.0.1:8000: address already in use (...)".
ListenSocket open_listen_socket(const std::string& host, int port, int backlog, bool tcp_nodelay);

}  // namespace serval::server
