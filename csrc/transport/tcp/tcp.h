// TCP transport between hosts: one non-blocking stream per pair. Received payload goes
// straight into the destination for plain receives; reductions stage through a fixed buffer
// allocated once per connection.
#pragma once
#include <vector>
#include "transport/transport.h"

namespace ringtree {

// The transport's settings, read and checked once; a bad value throws InvalidArgument. The
// communicator calls this before bootstrap, so a bad setting fails before any traffic.
struct TcpSettings {
  int64_t sockbuf_bytes;  // RINGTREE_TCP_SOCKBUF: SO_SNDBUF/SO_RCVBUF, 0 = the kernel's autotuning
  int64_t staging_bytes;  // RINGTREE_TCP_STAGING_BYTES: the reduction staging buffer
};
const TcpSettings& tcp_settings();

class TcpConnection : public Connection {
 public:
  TcpConnection(int peer, int fd);
  ~TcpConnection() override;
  bool progress_send(SendCursor& c) override;
  bool progress_recv(RecvCursor& c) override;
  bool send_complete(const SendCursor& c, uint64_t payload_bytes) const override {
    return c.done == sizeof(MsgHeader) + payload_bytes;
  }
  bool recv_complete(const RecvCursor& c) const override {
    return c.header_checked && c.done == sizeof(MsgHeader) + c.payload_bytes && staged_ == 0;
  }
  int poll_fd() const override { return fd_; }
  const char* kind() const override { return "tcp"; }

 private:
  [[noreturn]] void lost(const char* what, int err) const;
  int peer_;
  int fd_;
  std::vector<uint8_t> staging_;
  uint64_t staged_ = 0;    // bytes in staging_ not yet reduced
  uint64_t consumed_ = 0;  // payload bytes reduced into dst
};

}  // namespace ringtree
