#include "transport/tcp/tcp.h"

#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>
#include <algorithm>
#include <cerrno>
#include <cstring>
#include "bootstrap/socket.h"
#include "common/check.h"
#include "common/settings.h"

namespace ringtree {

namespace {
RT_SETTING(TcpStagingBytes)
RT_SETTING(TcpSockbuf)
constexpr int64_t kMaxSockbuf = int64_t{1} << 30;

TcpSettings read_settings() {
  TcpSettings s{TcpSockbuf(), TcpStagingBytes()};
  RT_CHECK(s.sockbuf_bytes == 0 || (s.sockbuf_bytes >= 4096 && s.sockbuf_bytes <= kMaxSockbuf), InvalidArgument,
           "RINGTREE_TCP_SOCKBUF must be 0 (the kernel's autotuning) or a byte count in [4096, ", kMaxSockbuf,
           "], got ", s.sockbuf_bytes);
  RT_CHECK(s.staging_bytes >= 4096 && s.staging_bytes <= kMaxSockbuf, InvalidArgument,
           "RINGTREE_TCP_STAGING_BYTES must be a byte count in [4096, ", kMaxSockbuf, "], got ", s.staging_bytes);
  return s;
}
}  // namespace

const TcpSettings& tcp_settings() {
  static const TcpSettings settings = read_settings();
  return settings;
}

TcpConnection::TcpConnection(int peer, int fd)
    : peer_(peer), fd_(fd), staging_(static_cast<size_t>(tcp_settings().staging_bytes)) {
  set_nonblocking(fd_);
  set_tcp_nodelay(fd_);
  if (const int64_t buf = tcp_settings().sockbuf_bytes) {
    // The kernel caps these at net.core.wmem_max/rmem_max and then stops autotuning them:
    // only worth it where autotuning stays below what the link needs.
    const int bytes = static_cast<int>(buf);
    setsockopt(fd_, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof(bytes));
    setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof(bytes));
  }
}

TcpConnection::~TcpConnection() { close_fd(fd_); }

void TcpConnection::lost(const char* what, int err) const {
  RT_THROW(PeerFailure, "TCP connection to rank ", peer_, " lost while ", what, " (",
           err ? std::strerror(err) : "closed by the peer", ")");
}

bool TcpConnection::progress_send(SendCursor& c) {
  const uint64_t payload = c.header.payload_bytes;
  const uint64_t total = sizeof(MsgHeader) + payload;
  bool moved = false;
  while (c.done < total) {
    iovec iov[2];
    int n_iov = 0;
    if (c.done < sizeof(MsgHeader)) {
      iov[n_iov++] = {reinterpret_cast<uint8_t*>(&c.header) + c.done, sizeof(MsgHeader) - c.done};
      if (payload) iov[n_iov++] = {const_cast<uint8_t*>(c.payload), payload};
    } else {
      const uint64_t off = c.done - sizeof(MsgHeader);
      iov[n_iov++] = {const_cast<uint8_t*>(c.payload) + off, payload - off};
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = n_iov;
    ssize_t n = sendmsg(fd_, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n > 0) {
      c.done += static_cast<uint64_t>(n);
      moved = true;
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) break;
    lost("sending", n < 0 ? errno : 0);
  }
  return moved;
}

bool TcpConnection::progress_recv(RecvCursor& c) {
  if (c.header_ready && !c.header_checked) return false;
  bool moved = false;
  if (c.done < sizeof(MsgHeader)) {
    ssize_t n = recv(fd_, reinterpret_cast<uint8_t*>(&c.header) + c.done, sizeof(MsgHeader) - c.done, MSG_DONTWAIT);
    if (n == 0) lost("receiving", 0);
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return false;
      lost("receiving", errno);
    }
    c.done += static_cast<uint64_t>(n);
    if (c.done == sizeof(MsgHeader)) {
      c.header_ready = true;
      staged_ = consumed_ = 0;
    }
    return true;
  }
  const uint64_t total = sizeof(MsgHeader) + c.payload_bytes;
  while (c.done < total) {
    const uint64_t payload_off = c.done - sizeof(MsgHeader);
    ssize_t n;
    if (!c.reduce) {
      n = recv(fd_, c.dst + payload_off, total - c.done, MSG_DONTWAIT);
    } else {
      const uint64_t room = std::min<uint64_t>(staging_.size() - staged_, total - c.done);
      n = recv(fd_, staging_.data() + staged_, room, MSG_DONTWAIT);
    }
    if (n == 0) lost("receiving", 0);
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) break;
      lost("receiving", errno);
    }
    c.done += static_cast<uint64_t>(n);
    moved = true;
    if (c.reduce) {
      staged_ += static_cast<uint64_t>(n);
      // Reduce whole elements; keep a split element's head for the next read.
      const uint64_t whole = staged_ / c.elem_size * c.elem_size;
      if (whole) {
        c.reduce(c.dst + consumed_, c.local + consumed_, staging_.data(), whole / c.elem_size);
        consumed_ += whole;
        std::memmove(staging_.data(), staging_.data() + whole, staged_ - whole);
        staged_ -= whole;
      }
    }
  }
  return moved;
}

}  // namespace ringtree
