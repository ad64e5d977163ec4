#include "server/listen_socket.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace serval::server {
namespace {

// Binds and listens one resolved address; returns the socket, or -1 with errno set.
int try_listen(const addrinfo& ai, int backlog, bool tcp_nodelay) {
  const int fd = ::socket(ai.ai_family, ai.ai_socktype | SOCK_CLOEXEC, ai.ai_protocol);
  if (fd < 0) return -1;
  const int yes = 1, no = 0;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  // Accepted connections inherit it.
  if (tcp_nodelay) ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &yes, sizeof(yes));
  // "::" serves IPv4 clients too, as with httplib.
  if (ai.ai_family == AF_INET6) ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &no, sizeof(no));
  if (::bind(fd, ai.ai_addr, ai.ai_addrlen) == 0 && ::listen(fd, backlog) == 0) return fd;
  const int err = errno;
  ::close(fd);
  errno = err;
  return -1;
}

int bound_port(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return -1;
  if (addr.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  if (addr.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
  return -1;
}

}  // namespace

ListenSocket open_listen_socket(const std::string& host, int port, int backlog, bool tcp_nodelay) {
  const std::string where = str_cat(host, ":", port);
  if (port < 0 || port > 65535) fail("cannot listen on ", where, ": the port must be in [0, 65535]");
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (const int rc = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &found); rc != 0)
    fail("cannot listen on ", where, ": cannot resolve the host (", ::gai_strerror(rc), ")");
  int fd = -1, err = EADDRNOTAVAIL;  // stays if the host resolves to no address
  for (const addrinfo* ai = found; ai != nullptr && fd < 0; ai = ai->ai_next) {
    fd = try_listen(*ai, backlog, tcp_nodelay);
    if (fd < 0) err = errno;
  }
  ::freeaddrinfo(found);
  if (fd < 0) {
    if (err == EADDRINUSE)
      fail("cannot listen on ", where, ": address already in use (another process, perhaps another serval "
           "serve, listens on port ", port, "; stop it or pick another --port)");
    if (err == EACCES) fail("cannot listen on ", where, ": permission denied (ports below 1024 need privileges)");
    fail("cannot listen on ", where, ": ", std::strerror(err));
  }
  const int actual = bound_port(fd);
  if (actual < 0) {
    const int e = errno;
    ::close(fd);
    fail("cannot listen on ", where, ": getsockname failed (", std::strerror(e), ")");
  }
  return {fd, actual};
}

}  // namespace serval::server
