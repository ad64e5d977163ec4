#include "server/socket_stream.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace serval::server {
namespace {

// poll() for `events` up to `timeout`, retrying on EINTR; returns revents (0 on timeout).
short poll_for(int fd, short events, std::chrono::milliseconds timeout) {
  pollfd p{fd, events, 0};
  for (;;) {
    const int n = ::poll(&p, 1, int(std::max<int64_t>(0, timeout.count())));
    if (n > 0) return p.revents;
    if (n == 0) return 0;
    if (errno != EINTR) return POLLERR;
  }
}

void ip_and_port(const sockaddr_storage& addr, std::string& ip, int& port) {
  char host[NI_MAXHOST] = {0};
  char serv[NI_MAXSERV] = {0};
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&addr), sizeof(addr), host, sizeof(host), serv,
                  sizeof(serv), NI_NUMERICHOST | NI_NUMERICSERV) == 0) {
    ip = host;
    port = std::atoi(serv);
  }
}

}  // namespace

SocketStream::SocketStream(int fd, std::chrono::milliseconds read_timeout,
                           std::chrono::milliseconds write_timeout)
    : fd_(fd), read_timeout_(read_timeout), write_timeout_(write_timeout) {}

bool SocketStream::is_readable() const {
  if (pos_ < end_) return true;
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline_ - Clock::now());
  return poll_for(fd_, POLLIN, std::min(read_timeout_, left)) != 0;
}

bool SocketStream::is_writable() const { return (poll_for(fd_, POLLOUT, write_timeout_) & POLLOUT) != 0; }

ssize_t SocketStream::read(char* ptr, size_t size) {
  if (pos_ == end_) {
    if (Clock::now() >= deadline_ || !is_readable()) return -1;
    ssize_t n;
    do n = ::recv(fd_, buf_, sizeof(buf_), 0);
    while (n < 0 && errno == EINTR);
    if (n <= 0) return n;
    pos_ = 0;
    end_ = size_t(n);
  }
  const size_t take = std::min(size, end_ - pos_);
  std::memcpy(ptr, buf_ + pos_, take);
  pos_ += take;
  return ssize_t(take);
}

ssize_t SocketStream::write(const char* ptr, size_t size) {
  if (!is_writable()) return -1;
  ssize_t n;
  do n = ::send(fd_, ptr, size, MSG_NOSIGNAL);
  while (n < 0 && errno == EINTR);
  return n;
}

void SocketStream::get_remote_ip_and_port(std::string& ip, int& port) const {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (getpeername(fd_, reinterpret_cast<sockaddr*>(&addr), &len) == 0) ip_and_port(addr, ip, port);
}

void SocketStream::get_local_ip_and_port(std::string& ip, int& port) const {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) == 0) ip_and_port(addr, ip, port);
}

bool wait_readable(int fd, std::chrono::milliseconds timeout) { return poll_for(fd, POLLIN, timeout) != 0; }

bool peer_closed(int fd) {
  const short r = poll_for(fd, POLLIN | POLLRDHUP, std::chrono::milliseconds(0));
  if (r & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) return true;
  if (r & POLLIN) {
    char c;
    const ssize_t n = ::recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
  }
  return false;
}

}  // namespace serval::server
