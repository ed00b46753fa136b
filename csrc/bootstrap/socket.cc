#include "bootstrap/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>
#include <cerrno>
#include <cstring>
#include "common/check.h"

namespace ringtree {

namespace {

sockaddr_in make_addr(const std::string& ip, uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  RT_CHECK(inet_pton(AF_INET, ip.c_str(), &a.sin_addr) == 1, InvalidArgument, "'", ip, "' is not an IPv4 address");
  return a;
}

void wait_fd(int fd, short events, const Deadline& deadline, const char* what) {
  for (;;) {
    pollfd p{fd, events, 0};
    int n = poll(&p, 1, deadline.remaining_ms(100));
    if (n > 0) return;
    if (n < 0 && errno != EINTR) throw_system_error(what, errno);
    if (deadline.expired()) RT_THROW(Timeout, what, ": timed out");
  }
}

}  // namespace

std::string resolve_ipv4(const std::string& host) {
  in_addr tmp{};
  if (inet_pton(AF_INET, host.c_str(), &tmp) == 1) return host;
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_INET;
  int rc = getaddrinfo(host.c_str(), nullptr, &hints, &res);
  RT_CHECK(rc == 0 && res, InvalidArgument, "cannot resolve host '", host, "': ", gai_strerror(rc));
  char buf[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr, buf, sizeof(buf));
  freeaddrinfo(res);
  return buf;
}

int tcp_bind(const std::string& ip, uint16_t port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  RT_SYSCHECK(fd, "socket");
  int one = 1;
  // A launcher's UniqueId::create() holds the port bound (not listening) while rank 0, in
  // another process of the same user, binds it again and listens; connections reach only
  // listening sockets, so they all go to rank 0. SO_REUSEPORT shares a port between sockets of
  // one user only (and binds over the port's TIME_WAIT connections); SO_REUSEADDR is not set:
  // it would let another user bind a reserved port that is not listening yet, and take it.
  setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one));
  sockaddr_in a = make_addr(ip, port);
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) < 0) {
    int e = errno;
    ::close(fd);
    RT_THROW(BootstrapError, "cannot listen on ", ip, ":", port, ": ", std::strerror(e),
             port ? " (is another job using this port? set RINGTREE_PORT or use a fresh unique id)" : "");
  }
  return fd;
}

void start_listening(int fd, int backlog) { RT_SYSCHECK(listen(fd, backlog), "listen"); }

int tcp_listen(const std::string& ip, uint16_t port, int backlog) {
  const int fd = tcp_bind(ip, port);
  try {
    start_listening(fd, backlog);
  } catch (...) {
    ::close(fd);
    throw;
  }
  return fd;
}

uint16_t socket_local_port(int fd) {
  sockaddr_in a{};
  socklen_t len = sizeof(a);
  RT_SYSCHECK(getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), "getsockname");
  return ntohs(a.sin_port);
}

std::string socket_local_ip(int fd) {
  sockaddr_in a{};
  socklen_t len = sizeof(a);
  RT_SYSCHECK(getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), "getsockname");
  char buf[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &a.sin_addr, buf, sizeof(buf));
  return buf;
}

void write_full(int fd, const void* data, size_t bytes, const Deadline& deadline) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    ssize_t n = ::send(fd, p, bytes, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      bytes -= static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      wait_fd(fd, POLLOUT, deadline, "send");
      continue;
    }
    RT_THROW(PeerFailure, "connection lost while sending (", n < 0 ? std::strerror(errno) : "closed", ")");
  }
}

void read_full(int fd, void* data, size_t bytes, const Deadline& deadline) {
  char* p = static_cast<char*>(data);
  while (bytes > 0) {
    ssize_t n = ::recv(fd, p, bytes, MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      bytes -= static_cast<size_t>(n);
      continue;
    }
    if (n == 0) RT_THROW(PeerFailure, "connection closed by the peer");
    if (errno == EAGAIN || errno == EINTR) {
      wait_fd(fd, POLLIN, deadline, "receive");
      continue;
    }
    RT_THROW(PeerFailure, "connection lost while receiving (", std::strerror(errno), ")");
  }
}

void set_nonblocking(int fd) {
  int flags = fcntl(fd, F_GETFL, 0);
  RT_SYSCHECK(fcntl(fd, F_SETFL, flags | O_NONBLOCK), "fcntl");
}

void set_tcp_nodelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

}  // namespace ringtree
