// The messenger (see messenger.h): matching, the progress thread, cancellation, failures.
//
// Locking: one mutex guards everything but the bytes in flight. The progress thread picks the
// next piece of I/O under the lock, marks the link busy, does the system call without the
// lock, and takes the lock again to account for it. Whoever takes a message out of the
// progress thread's hands (a receive that timed out, a cancelled send) holds the link, waits
// until it is not busy, and only then touches the buffer: a cancelled receive's buffer is
// never written again.
#include "runtime/messenger.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <list>
#include <new>
#include "bootstrap/bootstrap.h"
#include "bootstrap/socket.h"
#include "common/check.h"
#include "common/settings.h"

namespace ringtree {

namespace {

constexpr uint32_t kMsgMagic = 0x52544d53;  // "RTMS"
enum WireKind : uint32_t { kMessage = 1, kGoodbye = 2 };

struct MsgWire {
  uint32_t magic;
  uint32_t kind;
  int64_t tag;
  uint64_t bytes;
};

constexpr size_t kDiscardBytes = 64 << 10;  // where payloads nobody will read are drained
constexpr int kIoRounds = 64;  // system calls per link per wake-up, so one busy link cannot starve the others

// What a peer may make this rank hold: one message's claimed size, and the bytes of messages
// that arrived before their receive, all peers together. A header past either is a protocol
// error: the sender is dropped (PeerFailure) before anything is allocated for it.
RT_SETTING(MaxMessageBytes)
RT_SETTING(MaxUnexpectedBytes)

std::string rank_text(int r) { return r < 0 ? std::string("any") : std::to_string(r); }
std::string tag_text(int64_t t) { return t < 0 ? std::string("any") : std::to_string(t); }

bool matches(int want_src, int64_t want_tag, int src, int64_t tag) {
  return (want_src < 0 || want_src == src) && (want_tag < 0 ? tag < kFirstReservedTag : want_tag == tag);
}

class MessageOp;

struct Unexpected {
  Unexpected(int source, int64_t tag, uint64_t bytes) : source(source), tag(tag), bytes(bytes) {}
  int source;
  int64_t tag;
  uint64_t bytes;
  std::unique_ptr<char[]> data;
  uint64_t held = 0;  // of State::unexpected_bytes: what data holds
  bool complete = false;
  std::string failure;                 // it could not be buffered: the receive that takes it fails
  std::shared_ptr<MessageOp> claimed;  // the receive waiting for the rest of it
  bool discard = false;                // its receive was too small: dropped once it is whole
};

enum class Sink : uint8_t { Header, Op, Unexpected, Discard };

struct Link {
  enum class Peer : uint8_t { Alive, Departed, Gone };
  int fd = -1;
  Peer peer = Peer::Alive;
  std::string why;  // Departed or Gone: what happened, naming the peer
  int hold = 0;     // someone is taking a message out of the progress thread's hands
  // Sending: the queue's front is on the wire.
  std::deque<std::shared_ptr<MessageOp>> sendq;
  uint64_t sent = 0;  // of the front: header and payload bytes written
  MsgWire out{};
  bool send_busy = false;
  // Receiving: a header, then its payload into the sink.
  MsgWire in{};
  uint64_t got = 0;  // header bytes, then payload bytes
  Sink sink = Sink::Header;
  std::shared_ptr<MessageOp> op;       // Sink::Op
  std::list<Unexpected>::iterator ux;  // Sink::Unexpected
  bool recv_busy = false;
};

}  // namespace

struct Messenger::State {
  std::mutex mu;
  std::condition_variable cv;  // completions, arrivals, links no longer busy, queues drained
  int rank = 0, size = 0;
  double default_timeout = 0;
  std::vector<std::string> names;
  std::vector<Link> links;
  std::list<std::shared_ptr<MessageOp>> posted;
  std::list<Unexpected> unexpected;
  uint64_t unexpected_bytes = 0;  // held by `unexpected`, at most max_unexpected
  uint64_t max_message = 0, max_unexpected = 0;
  bool aborted = false, closed = false, stop = false;
  std::string end_why;
  int wake_fd = -1;
  std::vector<char> discard;

  void wake() const {
    const uint64_t one = 1;
    (void)!::write(wake_fd, &one, sizeof(one));
  }
  void check_open() const {
    if (aborted) RT_THROW(Aborted, "the communicator was aborted: ", end_why);
    if (closed) RT_THROW(Aborted, "the communicator is closed");
  }
  void check_peer(int peer, bool any_allowed, const char* what) const {
    RT_CHECK(peer >= (any_allowed ? -1 : 0) && peer < size, InvalidArgument, what, " must be in [",
             any_allowed ? "-1" : "0", ", ", size, ")", any_allowed ? " (-1: any source)" : "", ", got ", peer);
  }
  void check_tag(int64_t tag, bool any_allowed) const {
    RT_CHECK(tag >= (any_allowed ? -1 : 0), InvalidArgument, "tag must be ",
             any_allowed ? ">= -1 (-1: any tag)" : ">= 0", ", got ", tag);
  }

  void complete(MessageOp& op, std::exception_ptr error);
  // A buffer for an unexpected message within max_unexpected; false (nothing held) past it.
  bool hold_unexpected(Unexpected& u);
  void forget(std::list<Unexpected>::iterator it);
  // A receive that can never be satisfied (its peer, or every peer, is gone): the error, else null.
  std::exception_ptr unreachable(int src, const std::string& what) const;
  std::list<Unexpected>::iterator first_unexpected(int src, int64_t tag);
  // Gives a whole unexpected message to a receive and drops it from the queue.
  void take(std::list<Unexpected>::iterator it, MessageOp& op);
  void deliver_local(MessageOp& send);
  bool cancel(std::unique_lock<std::mutex>& lock, MessageOp& op, ErrorKind kind, const std::string& text);

  // The progress thread's side.
  void run();
  void pump_recv(int q);
  void pump_send(int q);
  void received(int q, uint64_t n);
  void header_arrived(int q);
  void start_payload(int q, Sink sink);
  void payload_done(int q);
  void lose_peer(int q, bool departed, const std::string& detail);
  // A peer that broke the protocol: lost, and its connection shut down both ways so it learns too.
  void protocol_error(int q, const std::string& what);
  void fail_everything(ErrorKind kind, const std::string& text);
};

namespace {

class MessageOp final : public MessageWork {
 public:
  using State = Messenger::State;
  enum class Where : uint8_t { Queued, Posted, Claimed, Arriving, Done };

  MessageOp(std::shared_ptr<State> state, bool is_send, char* ptr, uint64_t bytes, int peer, int64_t tag)
      : state(std::move(state)), is_send(is_send), ptr(ptr), bytes(bytes), peer(peer), tag(tag) {
    if (is_send) result = {peer, tag, bytes};
  }

  void wait(double timeout_s) override {
    std::unique_lock<std::mutex> lock(state->mu);
    const double t = timeout_s > 0 ? timeout_s : state->default_timeout;
    if (!state->cv.wait_for(lock, std::chrono::duration<double>(t), [this] { return done; })) {
      state->cancel(lock, *this, ErrorKind::Timeout,
                    str_cat(describe(), " timed out after ", t,
                            " s: ", is_send ? "the peer did not take the data" : "no matching message arrived",
                            "; the ", is_send ? "send" : "receive", " is cancelled"));
    }
    if (error) std::rethrow_exception(error);
  }
  bool is_completed() const override {
    std::lock_guard<std::mutex> lock(state->mu);
    return done;
  }
  bool cancel() override {
    std::unique_lock<std::mutex> lock(state->mu);
    return state->cancel(lock, *this, ErrorKind::Aborted, describe() + " was cancelled");
  }
  MessageStatus status() const override {
    std::lock_guard<std::mutex> lock(state->mu);
    return result;
  }

  std::string describe() const {
    return is_send ? str_cat("isend(dst=", peer, ", tag=", tag, ", ", bytes, " bytes) on rank ", state->rank)
                   : str_cat("irecv(src=", rank_text(peer), ", tag=", tag_text(tag), ") on rank ", state->rank);
  }
  // Where the payload's byte `offset` is: the user's buffer, or the copy a cancelled send keeps.
  const char* payload(uint64_t offset) const { return owned ? owned.get() + (offset - owned_from) : ptr + offset; }

  // All guarded by state->mu.
  const std::shared_ptr<State> state;
  const bool is_send;
  char* const ptr;
  const uint64_t bytes;  // a send's size, a receive's capacity
  const int peer;        // destination, or source (-1: any)
  const int64_t tag;     // -1: any (receives)
  std::unique_ptr<char[]> owned;
  uint64_t owned_from = 0;
  Where where = Where::Queued;
  std::list<Unexpected>::iterator entry;  // Where::Claimed
  bool done = false;
  std::exception_ptr error;
  MessageStatus result;
};

std::exception_ptr truncation(const MessageOp& op, int src, int64_t tag, uint64_t bytes) {
  return make_error(ErrorKind::InvalidArgument,
                    str_cat(op.describe(), ": the message from rank ", src, " with tag ", tag, " has ", bytes,
                            " bytes but the receive buffer holds only ", op.bytes, " bytes; the message is discarded"));
}

}  // namespace

// --- matching, on the callers' threads ----------------------------------------------------

void Messenger::State::complete(MessageOp& op, std::exception_ptr err) {
  if (op.done) return;  // a cancelled send that still finishes from its copy
  op.done = true;
  op.error = err;
  op.where = MessageOp::Where::Done;
  cv.notify_all();
}

std::exception_ptr Messenger::State::unreachable(int src, const std::string& what) const {
  if (src >= 0) {
    if (src == rank || links[src].peer == Link::Peer::Alive) return nullptr;
    return make_error(ErrorKind::PeerFailure, str_cat(what, ": ", links[src].why));
  }
  if (size == 1) return nullptr;  // only this rank can send it, from another thread
  std::string whys;
  for (int q = 0; q < size; ++q) {
    if (q == rank) continue;
    if (links[q].peer == Link::Peer::Alive) return nullptr;
    whys += (whys.empty() ? "" : "; ") + links[q].why;
  }
  return make_error(ErrorKind::PeerFailure, str_cat(what, ": no other rank is left to send it (", whys, ")"));
}

std::list<Unexpected>::iterator Messenger::State::first_unexpected(int src, int64_t tag) {
  return std::find_if(unexpected.begin(), unexpected.end(), [&](const Unexpected& u) {
    return !u.claimed && !u.discard && matches(src, tag, u.source, u.tag);
  });
}

void Messenger::State::take(std::list<Unexpected>::iterator it, MessageOp& op) {
  if (!it->failure.empty()) {
    complete(op, make_error(ErrorKind::Error, str_cat(op.describe(), ": ", it->failure)));
  } else {
    if (it->bytes) std::memcpy(op.ptr, it->data.get(), it->bytes);
    op.result = {it->source, it->tag, it->bytes};
    complete(op, nullptr);
  }
  forget(it);
}

bool Messenger::State::hold_unexpected(Unexpected& u) {
  if (u.bytes > max_unexpected - unexpected_bytes) return false;
  u.data.reset(new char[u.bytes ? u.bytes : 1]);
  u.held = u.bytes;
  unexpected_bytes += u.held;
  return true;
}

void Messenger::State::forget(std::list<Unexpected>::iterator it) {
  unexpected_bytes -= it->held;
  unexpected.erase(it);
}

void Messenger::State::deliver_local(MessageOp& send) {
  const auto receive = std::find_if(posted.begin(), posted.end(), [&](const std::shared_ptr<MessageOp>& r) {
    return matches(r->peer, r->tag, rank, send.tag);
  });
  if (receive != posted.end()) {
    std::shared_ptr<MessageOp> r = *receive;
    posted.erase(receive);
    if (send.bytes > r->bytes) {
      complete(*r, truncation(*r, rank, send.tag, send.bytes));
    } else {
      if (send.bytes) std::memcpy(r->ptr, send.ptr, send.bytes);
      r->result = {rank, send.tag, send.bytes};
      complete(*r, nullptr);
    }
  } else {
    Unexpected u{rank, send.tag, send.bytes};
    if (!hold_unexpected(u)) {
      return complete(
          send, make_error(ErrorKind::Error,
                           str_cat(send.describe(),
                                   ": no receive is posted for it and the messages waiting for "
                                   "theirs already hold ",
                                   unexpected_bytes, " bytes (RINGTREE_MAX_UNEXPECTED_BYTES=", max_unexpected, ")")));
    }
    if (send.bytes) std::memcpy(u.data.get(), send.ptr, send.bytes);
    u.complete = true;
    unexpected.push_back(std::move(u));
  }
  complete(send, nullptr);
}

bool Messenger::State::cancel(std::unique_lock<std::mutex>& lock, MessageOp& op, ErrorKind kind,
                              const std::string& text) {
  using Where = MessageOp::Where;
  if (op.done) return false;
  std::string note;
  if (op.where == Where::Posted) {
    posted.remove_if([&](const std::shared_ptr<MessageOp>& p) { return p.get() == &op; });
  } else if (op.where == Where::Claimed) {
    op.entry->claimed.reset();  // the message stays for a later receive
  } else if (op.where == Where::Arriving || op.where == Where::Queued) {
    Link& link = links[op.where == Where::Arriving ? op.result.source : op.peer];
    const bool on_wire = op.where == Where::Arriving || (!link.sendq.empty() && link.sendq.front().get() == &op);
    if (on_wire) {  // let the system call in progress finish, and start no other
      ++link.hold;
      cv.wait(lock, [&] { return !link.send_busy && !link.recv_busy; });
      --link.hold;
      wake();
      if (op.done) return false;
    }
    if (op.is_send && (!on_wire || link.sent == 0)) {  // nothing of it written yet: it never goes
      const auto queued = std::find_if(link.sendq.begin(), link.sendq.end(),
                                       [&](const std::shared_ptr<MessageOp>& p) { return p.get() == &op; });
      if (queued != link.sendq.end()) link.sendq.erase(queued);
    } else if (op.is_send) {
      // Part of it is on the wire, which cannot be taken back: the rest goes from a copy, so
      // the caller may free the buffer, and the peer still gets the whole message.
      const uint64_t from = link.sent > sizeof(MsgWire) ? link.sent - sizeof(MsgWire) : 0;
      op.owned.reset(new char[op.bytes - from + 1]);
      std::memcpy(op.owned.get(), op.ptr + from, op.bytes - from);
      op.owned_from = from;
      note = " (part of it was already written: the rest is sent from a copy, so the peer still gets it)";
    } else {
      // The part already here moves to a buffer of ours, where the rest follows: the message
      // becomes unexpected again, for a later receive.
      Unexpected u{op.result.source, op.result.tag, op.result.bytes};
      try {
        if (hold_unexpected(u)) {
          std::memcpy(u.data.get(), op.ptr, link.got);
          link.ux = unexpected.insert(unexpected.end(), std::move(u));
          link.sink = Sink::Unexpected;
        } else {
          link.sink = Sink::Discard;
        }
      } catch (const std::bad_alloc&) {
        link.sink = Sink::Discard;
      }
      link.op.reset();
    }
  }
  complete(op, make_error(kind, text + note));
  return true;
}

// --- the progress thread --------------------------------------------------------------------

void Messenger::State::run() {
  std::vector<pollfd> fds;
  std::vector<int> fd_peer;
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (stop) return;
      fds.assign(1, pollfd{wake_fd, POLLIN, 0});
      fd_peer.assign(1, -1);
      for (int q = 0; q < size; ++q) {
        const Link& link = links[q];
        if (link.fd < 0 || link.peer != Link::Peer::Alive || link.hold) continue;
        fds.push_back({link.fd, static_cast<short>(POLLIN | (link.sendq.empty() ? 0 : POLLOUT)), 0});
        fd_peer.push_back(q);
      }
    }
    if (poll(fds.data(), fds.size(), -1) < 0) {
      if (errno == EINTR) continue;
      std::lock_guard<std::mutex> lock(mu);
      fail_everything(ErrorKind::Error, str_cat("the message progress thread failed: poll: ", std::strerror(errno)));
      return;
    }
    if (fds[0].revents) {
      uint64_t count;
      (void)!::read(wake_fd, &count, sizeof(count));
    }
    for (size_t i = 1; i < fds.size(); ++i) {
      if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) pump_recv(fd_peer[i]);
      if (fds[i].revents & POLLOUT) pump_send(fd_peer[i]);
    }
  }
}

void Messenger::State::pump_recv(int q) {
  Link& link = links[q];
  for (int round = 0; round < kIoRounds; ++round) {
    char* dst = nullptr;
    size_t len = 0;
    int fd;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (link.peer != Link::Peer::Alive || link.hold) return;
      const uint64_t left = link.in.bytes - link.got;
      switch (link.sink) {
        case Sink::Header:
          dst = reinterpret_cast<char*>(&link.in) + link.got;
          len = sizeof(MsgWire) - link.got;
          break;
        case Sink::Op:
          dst = link.op->ptr + link.got, len = left;
          break;
        case Sink::Unexpected:
          dst = link.ux->data.get() + link.got, len = left;
          break;
        case Sink::Discard:
          dst = discard.data(), len = std::min<uint64_t>(left, discard.size());
          break;
      }
      link.recv_busy = true;
      fd = link.fd;
    }
    const ssize_t n = ::recv(fd, dst, len, MSG_DONTWAIT);
    const int err = errno;
    std::lock_guard<std::mutex> lock(mu);
    link.recv_busy = false;
    if (link.hold) cv.notify_all();
    if (n > 0) {
      received(q, static_cast<uint64_t>(n));
      continue;
    }
    if (n < 0 && (err == EAGAIN || err == EWOULDBLOCK)) return;
    if (n < 0 && err == EINTR) continue;
    lose_peer(
        q, false,
        n == 0 ? "its message connection closed" : str_cat("its message connection failed: ", std::strerror(err)));
    return;
  }
}

void Messenger::State::pump_send(int q) {
  Link& link = links[q];
  for (int round = 0; round < kIoRounds; ++round) {
    iovec iov[2];
    int parts = 0;
    int fd;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (link.peer != Link::Peer::Alive || link.hold || link.sendq.empty()) return;
      const MessageOp& op = *link.sendq.front();
      if (link.sent == 0) link.out = {kMsgMagic, kMessage, op.tag, op.bytes};
      const uint64_t header_left = link.sent < sizeof(MsgWire) ? sizeof(MsgWire) - link.sent : 0;
      const uint64_t payload_from = link.sent - (sizeof(MsgWire) - header_left);
      if (header_left) iov[parts++] = {reinterpret_cast<char*>(&link.out) + link.sent, header_left};
      if (op.bytes > payload_from)
        iov[parts++] = {const_cast<char*>(op.payload(payload_from)), op.bytes - payload_from};
      link.send_busy = true;
      fd = link.fd;
    }
    msghdr m{};
    m.msg_iov = iov;
    m.msg_iovlen = parts;
    const ssize_t n = ::sendmsg(fd, &m, MSG_DONTWAIT | MSG_NOSIGNAL);
    const int err = errno;
    {
      std::lock_guard<std::mutex> lock(mu);
      link.send_busy = false;
      if (link.hold) cv.notify_all();
      if (n > 0) {
        link.sent += static_cast<uint64_t>(n);
        std::shared_ptr<MessageOp> op = link.sendq.front();
        if (link.sent == sizeof(MsgWire) + op->bytes) {
          link.sendq.pop_front();
          link.sent = 0;
          complete(*op, nullptr);
          if (link.sendq.empty()) cv.notify_all();  // close() may wait for the queues to drain
        }
        continue;
      }
      if (n < 0 && (err == EAGAIN || err == EWOULDBLOCK)) return;
      if (n < 0 && err == EINTR) continue;
    }
    // A peer that closed its communicator may have said goodbye before its socket went away:
    // read what it sent first, so that its goodbye, not our failed write, explains.
    pump_recv(q);
    std::lock_guard<std::mutex> lock(mu);
    if (link.peer == Link::Peer::Alive)
      lose_peer(q, false, str_cat("its message connection failed: ", std::strerror(n < 0 ? err : EPIPE)));
    return;
  }
}

void Messenger::State::received(int q, uint64_t n) {
  Link& link = links[q];
  link.got += n;
  if (link.sink != Sink::Header) {
    if (link.got == link.in.bytes) payload_done(q);
    return;
  }
  if (link.got < sizeof(MsgWire)) return;
  if (link.in.magic == kMsgMagic && link.in.kind == kGoodbye) return lose_peer(q, true, "");
  if (link.in.magic != kMsgMagic || link.in.kind != kMessage)
    return protocol_error(q, "it sent a corrupt message header");
  if (link.in.bytes > max_message)
    return protocol_error(q, str_cat("it sent a message header claiming ", link.in.bytes,
                                     " bytes, over RINGTREE_MAX_MESSAGE_BYTES=", max_message, ": a protocol error"));
  if (link.in.tag < 0 || link.in.tag >= kReservedTagEnd)
    return protocol_error(q, str_cat("it sent a message with tag ", link.in.tag,
                                     ", which no send can produce (user tags are 0..2^62-1): a protocol error"));
  header_arrived(q);
}

void Messenger::State::header_arrived(int q) {
  Link& link = links[q];
  const int64_t tag = link.in.tag;
  const uint64_t bytes = link.in.bytes;
  const auto receive = std::find_if(posted.begin(), posted.end(), [&](const std::shared_ptr<MessageOp>& r) {
    return matches(r->peer, r->tag, q, tag);
  });
  if (receive != posted.end()) {
    std::shared_ptr<MessageOp> r = *receive;
    posted.erase(receive);
    if (bytes > r->bytes) {
      complete(*r, truncation(*r, q, tag, bytes));
      return start_payload(q, Sink::Discard);
    }
    r->where = MessageOp::Where::Arriving;
    r->result = {q, tag, bytes};
    link.op = std::move(r);
    return start_payload(q, Sink::Op);
  }
  // Nobody waits for it yet: it is read at once all the same, so that the sender is never held up.
  if (bytes > max_unexpected - unexpected_bytes)
    return protocol_error(q, str_cat("its message of ", bytes, " bytes (tag ", tag,
                                     ") arrived before its receive, and the messages waiting for theirs already hold ",
                                     unexpected_bytes, " bytes: over RINGTREE_MAX_UNEXPECTED_BYTES=", max_unexpected));
  Unexpected u{q, tag, bytes};
  try {
    hold_unexpected(u);  // within the cap: checked above
  } catch (const std::bad_alloc&) {
    u.failure = str_cat("the message from rank ", q, " with tag ", tag, " (", bytes,
                        " bytes) arrived before its receive and could not be buffered: out of memory");
    u.complete = true;
  }
  const bool failed = !u.failure.empty();
  link.ux = unexpected.insert(unexpected.end(), std::move(u));
  cv.notify_all();  // probes
  start_payload(q, failed ? Sink::Discard : Sink::Unexpected);
}

void Messenger::State::start_payload(int q, Sink sink) {
  Link& link = links[q];
  link.sink = sink;
  link.got = 0;
  if (link.in.bytes == 0) payload_done(q);
}

void Messenger::State::payload_done(int q) {
  Link& link = links[q];
  if (link.sink == Sink::Op) {
    complete(*link.op, nullptr);
    link.op.reset();
  } else if (link.sink == Sink::Unexpected) {
    Unexpected& u = *link.ux;
    u.complete = true;
    if (u.discard) {
      forget(link.ux);
    } else if (u.claimed) {
      std::shared_ptr<MessageOp> r = std::move(u.claimed);
      take(link.ux, *r);
    }
  }
  link.sink = Sink::Header;
  link.got = 0;
}

void Messenger::State::lose_peer(int q, bool departed, const std::string& detail) {
  Link& link = links[q];
  if (link.peer != Link::Peer::Alive) return;
  link.peer = departed ? Link::Peer::Departed : Link::Peer::Gone;
  link.why = departed ? str_cat(names[q], " closed its communicator")
                      : str_cat(names[q], " died or lost its connection (", detail, ")");
  // The socket stays open (out of the poll set) until close(): descriptors change only when
  // this rank makes or closes a communicator.
  auto failure = [&](const MessageOp& op) {
    return make_error(ErrorKind::PeerFailure, str_cat(op.describe(), ": ", link.why));
  };
  for (const std::shared_ptr<MessageOp>& op : link.sendq) complete(*op, failure(*op));
  link.sendq.clear();
  link.sent = 0;
  // The message it was in the middle of will never be whole.
  if (link.sink == Sink::Op) {
    complete(*link.op, failure(*link.op));
    link.op.reset();
  } else if (link.sink == Sink::Unexpected) {
    if (link.ux->claimed) complete(*link.ux->claimed, failure(*link.ux->claimed));
    forget(link.ux);
  }
  link.sink = Sink::Header;
  link.got = 0;
  // Receives naming it, and receives from any source once nobody else is left.
  for (auto it = posted.begin(); it != posted.end();) {
    MessageOp& r = **it;
    std::exception_ptr why = r.peer == q ? failure(r) : r.peer < 0 ? unreachable(-1, r.describe()) : nullptr;
    if (!why) {
      ++it;
      continue;
    }
    complete(r, why);
    it = posted.erase(it);
  }
  cv.notify_all();  // probes naming it
}

void Messenger::State::protocol_error(int q, const std::string& what) {
  lose_peer(q, false, what);
  shutdown(links[q].fd, SHUT_RDWR);
}

void Messenger::State::fail_everything(ErrorKind kind, const std::string& text) {
  auto failure = [&](const MessageOp& op) { return make_error(kind, str_cat(op.describe(), ": ", text)); };
  for (Link& link : links) {
    for (const std::shared_ptr<MessageOp>& op : link.sendq) complete(*op, failure(*op));
    link.sendq.clear();
    if (link.op) complete(*link.op, failure(*link.op));
    link.op.reset();
    link.sink = Sink::Header;
  }
  for (const std::shared_ptr<MessageOp>& op : posted) complete(*op, failure(*op));
  posted.clear();
  for (Unexpected& u : unexpected)
    if (u.claimed) complete(*u.claimed, failure(*u.claimed));
  unexpected.clear();
  unexpected_bytes = 0;
  cv.notify_all();
}

// --- the messenger --------------------------------------------------------------------------

Messenger::~Messenger() {
  try {
    close(0.0);
  } catch (...) {
  }
}

void Messenger::start(int rank, Mesh& mesh, std::vector<std::string> names, double default_timeout_s) {
  auto s = std::make_shared<State>();
  s->rank = rank;
  s->size = static_cast<int>(mesh.peers.size());
  s->default_timeout = default_timeout_s;
  RT_CHECK(MaxMessageBytes() > 0 && MaxUnexpectedBytes() > 0, InvalidArgument,
           "RINGTREE_MAX_MESSAGE_BYTES and RINGTREE_MAX_UNEXPECTED_BYTES must be positive, got ", MaxMessageBytes(),
           " and ", MaxUnexpectedBytes());
  s->max_message = static_cast<uint64_t>(MaxMessageBytes());
  s->max_unexpected = static_cast<uint64_t>(MaxUnexpectedBytes());
  s->names = std::move(names);
  s->discard.resize(kDiscardBytes);
  s->links.resize(s->size);
  s->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  RT_SYSCHECK(s->wake_fd, "eventfd");
  for (int q = 0; q < s->size; ++q) {
    std::swap(s->links[q].fd, mesh.msg_fd[q]);  // owned here now
    if (s->links[q].fd >= 0) set_nonblocking(s->links[q].fd);
  }
  state_ = s;
  progress_ = std::thread([s] { s->run(); });
}

std::shared_ptr<MessageWork> Messenger::isend(const void* ptr, uint64_t bytes, int dst, int64_t tag) {
  State& s = *state_;
  s.check_peer(dst, false, "isend: dst");
  s.check_tag(tag, false);
  RT_CHECK(ptr || bytes == 0, InvalidArgument, "isend: a null buffer of ", bytes, " bytes");
  RT_CHECK(bytes <= s.max_message, InvalidArgument, "isend: ", bytes,
           " bytes is over RINGTREE_MAX_MESSAGE_BYTES=", s.max_message,
           " (the receiver would drop this rank); raise it on every rank, or send in pieces");
  auto op = std::make_shared<MessageOp>(state_, true, static_cast<char*>(const_cast<void*>(ptr)), bytes, dst, tag);
  std::lock_guard<std::mutex> lock(s.mu);
  s.check_open();
  if (dst == s.rank) {
    s.deliver_local(*op);
    return op;
  }
  Link& link = s.links[dst];
  if (link.peer != Link::Peer::Alive) {
    s.complete(*op, make_error(ErrorKind::PeerFailure, str_cat(op->describe(), ": ", link.why)));
    return op;
  }
  link.sendq.push_back(op);
  if (link.sendq.size() == 1) s.wake();
  return op;
}

std::shared_ptr<MessageWork> Messenger::irecv(void* ptr, uint64_t capacity, bool readonly, int src, int64_t tag) {
  State& s = *state_;
  s.check_peer(src, true, "irecv: src");
  s.check_tag(tag, true);
  RT_CHECK(!readonly, InvalidArgument, "irecv: the receive buffer is read-only");
  RT_CHECK(ptr || capacity == 0, InvalidArgument, "irecv: a null buffer of ", capacity, " bytes");
  auto op = std::make_shared<MessageOp>(state_, false, static_cast<char*>(ptr), capacity, src, tag);
  std::lock_guard<std::mutex> lock(s.mu);
  s.check_open();
  const auto it = s.first_unexpected(src, tag);
  if (it != s.unexpected.end()) {
    if (it->bytes > capacity && it->failure.empty()) {
      s.complete(*op, truncation(*op, it->source, it->tag, it->bytes));
      if (it->complete)
        s.forget(it);
      else
        it->discard = true;
    } else if (it->complete) {
      s.take(it, *op);
    } else {
      it->claimed = op;  // the rest is on its way
      op->where = MessageOp::Where::Claimed;
      op->entry = it;
    }
    return op;
  }
  if (std::exception_ptr failure = s.unreachable(src, op->describe())) {
    s.complete(*op, failure);
    return op;
  }
  op->where = MessageOp::Where::Posted;
  s.posted.push_back(op);
  return op;
}

bool Messenger::iprobe(int src, int64_t tag, MessageStatus& found) {
  State& s = *state_;
  s.check_peer(src, true, "iprobe: src");
  s.check_tag(tag, true);
  std::lock_guard<std::mutex> lock(s.mu);
  s.check_open();
  const auto it = s.first_unexpected(src, tag);
  if (it != s.unexpected.end()) {
    found = {it->source, it->tag, it->bytes};
    return true;
  }
  if (std::exception_ptr failure =
          s.unreachable(src, str_cat("iprobe(src=", rank_text(src), ", tag=", tag_text(tag), ") on rank ", s.rank)))
    std::rethrow_exception(failure);
  return false;
}

MessageStatus Messenger::probe(int src, int64_t tag, double timeout_s) {
  State& s = *state_;
  s.check_peer(src, true, "probe: src");
  s.check_tag(tag, true);
  const double t = timeout_s > 0 ? timeout_s : s.default_timeout;
  const auto deadline =
      std::chrono::steady_clock::now() +
      std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(t));
  const std::string what = str_cat("probe(src=", rank_text(src), ", tag=", tag_text(tag), ") on rank ", s.rank);
  std::unique_lock<std::mutex> lock(s.mu);
  for (;;) {
    s.check_open();
    const auto it = s.first_unexpected(src, tag);
    if (it != s.unexpected.end()) return {it->source, it->tag, it->bytes};
    if (std::exception_ptr failure = s.unreachable(src, what)) std::rethrow_exception(failure);
    if (s.cv.wait_until(lock, deadline) == std::cv_status::timeout && std::chrono::steady_clock::now() >= deadline)
      RT_THROW(Timeout, what, " timed out after ", t, " s: no matching message arrived");
  }
}

void Messenger::stop_progress() {
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->stop = true;
  }
  state_->wake();
  if (progress_.joinable()) progress_.join();
}

void Messenger::abort(const std::string& why) {
  std::lock_guard<std::mutex> lifecycle(lifecycle_mu_);
  if (!state_) return;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    if (state_->aborted || state_->closed) return;
    state_->aborted = true;
    state_->end_why = why;
  }
  stop_progress();
  std::lock_guard<std::mutex> lock(state_->mu);
  for (Link& link : state_->links) {
    if (link.fd >= 0) shutdown(link.fd, SHUT_RDWR);
    close_fd(link.fd);
  }
  state_->fail_everything(ErrorKind::Aborted, "the communicator was aborted: " + why);
}

void Messenger::close(double timeout_s) {
  std::lock_guard<std::mutex> lifecycle(lifecycle_mu_);
  if (!state_) return;
  State& s = *state_;
  bool flushed;
  {
    std::unique_lock<std::mutex> lock(s.mu);
    if (s.closed) return;
    s.closed = true;  // no new messages from here on
    flushed = s.cv.wait_for(lock, std::chrono::duration<double>(std::max(0.0, timeout_s)), [&] {
      return std::all_of(s.links.begin(), s.links.end(), [](const Link& l) { return l.sendq.empty(); });
    });
  }
  stop_progress();
  std::lock_guard<std::mutex> lock(s.mu);
  const MsgWire goodbye{kMsgMagic, kGoodbye, 0, 0};
  for (Link& link : s.links) {
    if (link.fd < 0) continue;
    // A goodbye only where no message is half written (else the peer sees a broken message).
    if (link.peer == Link::Peer::Alive && link.sent == 0)
      (void)::send(link.fd, &goodbye, sizeof(goodbye), MSG_DONTWAIT | MSG_NOSIGNAL);
    shutdown(link.fd, SHUT_WR);
    // Unread bytes would make close() reset the connection, which can overtake the goodbye.
    while (::recv(link.fd, s.discard.data(), s.discard.size(), MSG_DONTWAIT) > 0) {
    }
    close_fd(link.fd);
  }
  s.fail_everything(ErrorKind::Aborted, flushed ? "the communicator is closed"
                                                : str_cat("the communicator closed before the message was written (",
                                                          timeout_s, " s to flush)"));
  close_fd(s.wake_fd);
}

}  // namespace ringtree
