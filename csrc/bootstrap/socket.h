// Blocking-with-deadline TCP helpers for bootstrap and the connection mesh (IPv4).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include "common/clock.h"

namespace ringtree {

// A socket bound to ip:port (0: any free port) that does not listen yet; SO_REUSEPORT, so a
// process of the same user (and no other user) may bind the same port and listen there.
int tcp_bind(const std::string& ip, uint16_t port);
void start_listening(int fd, int backlog);
int tcp_listen(const std::string& ip, uint16_t port, int backlog);
uint16_t socket_local_port(int fd);
std::string socket_local_ip(int fd);
// Throw Timeout at the deadline and PeerFailure when the peer closes or resets.
void write_full(int fd, const void* data, size_t bytes, const Deadline& deadline);
void read_full(int fd, void* data, size_t bytes, const Deadline& deadline);
void set_nonblocking(int fd);
void set_tcp_nodelay(int fd);
void close_fd(int& fd);
std::string resolve_ipv4(const std::string& host);

}  // namespace ringtree
