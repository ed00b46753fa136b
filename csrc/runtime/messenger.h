// Tagged point-to-point messages beside the call order.
//
// Collectives (and the ordered send/recv) run in each rank's call order. Messages do not: a
// server answers whichever worker speaks first. Every pair of ranks has a message connection
// (made by the bootstrap; TCP even between ranks on one host), and one progress thread per
// communicator owns them all. Terms:
//   message     a header {kind, tag, bytes} and then `bytes` of payload on a pair's connection;
//   posted      a receive that found nothing to take and waits, in post order;
//   unexpected  a message no receive took when it arrived (whole, or still arriving), kept in
//               a heap buffer of its own, in arrival order.
// Sends are written straight from the user's buffer; a send completes once its last byte is
// written. Arriving messages are always read at once: into the first posted receive that
// matches their source and tag, else into the unexpected queue. So a sender never waits for
// its receiver to reach the receive, and isend/irecv in any order on both sides cannot
// deadlock; the price is memory that grows with messages nobody receives yet. A new receive
// takes the oldest matching unexpected message (MPI's matching). One connection per pair keeps
// the messages of one pair and tag in order (non-overtaking).
#pragma once
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>
#include "ringtree/communicator.h"

namespace ringtree {

struct Mesh;

class Messenger {
 public:
  Messenger() = default;
  ~Messenger();
  Messenger(const Messenger&) = delete;
  Messenger& operator=(const Messenger&) = delete;

  // Takes over the mesh's message connections and starts the progress thread; names[q] is how
  // errors name rank q (the control plane's who()).
  void start(int rank, Mesh& mesh, std::vector<std::string> names, double default_timeout_s);

  std::shared_ptr<MessageWork> isend(const void* ptr, uint64_t bytes, int dst, int64_t tag);
  std::shared_ptr<MessageWork> irecv(void* ptr, uint64_t capacity, bool readonly, int src, int64_t tag);
  MessageStatus probe(int src, int64_t tag, double timeout_s);
  bool iprobe(int src, int64_t tag, MessageStatus& found);

  // Every pending message and every later call fails with Aborted; the connections close, so
  // the peers' receives naming this rank fail instead of waiting.
  void abort(const std::string& why);
  // Writes what is queued (up to timeout_s), says goodbye to every peer, joins the progress
  // thread; what is still pending fails with Aborted.
  void close(double timeout_s);

  struct State;  // shared with the MessageWork objects, which may outlive the messenger

 private:
  // Stops and joins the progress thread; afterwards the calling thread owns the sockets.
  void stop_progress();

  std::shared_ptr<State> state_;
  std::thread progress_;
  std::mutex lifecycle_mu_;  // close() and abort() from different threads
};

}  // namespace ringtree
