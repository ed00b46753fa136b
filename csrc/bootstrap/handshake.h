// Mutual authentication of every set-up connection (to rank 0, and each mesh connection), without
// the secret ever crossing the wire. Terms:
//   client      the side that dials (a rank connecting to rank 0, or to a lower rank's mesh);
//   server      the side that accepted;
//   transcript  what both sides must agree on: protocol version, connection kind, both ranks,
//               the world size, the set-up's public id and both sides' fresh nonces;
//   proof       an HMAC-SHA256 keyed by the job's secret over a label and the transcript.
// The exchange, four messages:
//   client -> server  hello      {magic, version, kind, rank, size, peer, client nonce}
//   server -> client  challenge  {server nonce, server proof}
//   client -> server  proof      {client proof over the transcript and its payload, payload}
//   server -> client  accept     {status, text, a MAC over both}
// The server proves the secret first, over the client's fresh nonce, so a client never sends
// anything derived from the secret to a process that does not hold it; the client's proof covers
// the server's fresh nonce, so a recorded exchange cannot be replayed. A hello carries no secret,
// so a server answers anyone (a stranger learns nothing from a proof bound to nonces and labels
// it cannot reuse), and acts on a hello's claims only once its sender has proved the secret.
//
// HandshakeLoop drives any number of both kinds of connection at once from one thread, under
// one deadline: a stranger that connects and stalls holds one slot for a few seconds, never the
// real ranks.
#pragma once
#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>
#include "bootstrap/crypto.h"
#include "common/clock.h"

namespace ringtree {

// 5: mutual authentication by nonce challenge (4: the secret in clear in every hello).
constexpr uint32_t kProtocolVersion = 5;

// What a connection is for: bound into every proof, so a proof for one kind opens no other.
enum LinkKind : int32_t { kControlLink = 0, kDataLink = 1, kMessageLink = 2, kStarLink = 3 };

struct Transcript {
  int32_t kind = 0, client_rank = 0, server_rank = 0, size = 0;
  std::array<uint8_t, 16> setup{};  // the set-up's public id from rank 0's table (zeros on the star)
  std::array<uint8_t, 16> client_nonce{}, server_nonce{};
  // HMAC(key, label || version || every field || extra).
  crypto::Digest mac(const crypto::HmacKey& key, const char* label, const void* extra = nullptr,
                     size_t extra_bytes = 0) const;
};

// A hello's claims, as the server reads them (unauthenticated until the proof).
struct HelloClaims {
  int32_t kind, rank, size, peer;
};

// A connection whose client proved the secret: the server's rules decide what becomes of it.
struct Authenticated {
  int fd = -1;  // the rules' to keep or close
  Transcript t;
  std::vector<uint8_t> payload;
};

struct ServerRules {
  // The transcript (kind, ranks, size, set-up id) a hello may open, or false to drop it unanswered.
  std::function<bool(const HelloClaims&, Transcript&)> admit;
  size_t payload_bytes = 0;  // what a client's proof carries after the MAC
  // Takes the connection: answers it with send_accept() (and keeps it or closes it).
  std::function<void(Authenticated&&)> accept;
};

struct ClientSpec {
  std::string ip;
  uint16_t port = 0;
  Transcript t;  // kind, ranks, size, set-up id; the nonces are made per attempt
  // The payload of the proof, made once connected (the local address is known then); may be empty.
  std::function<std::vector<uint8_t>(int fd)> payload;
  std::string who;  // "rank 0 at 10.0.0.1:29500", for errors
};

// The server's last word: status 0 accepts; otherwise `text` says why not (on the star, rank 0
// explains a wrong world size or a duplicate rank). Authenticated, so only a server holding the
// secret can end a client's set-up this way.
void send_accept(const crypto::HmacKey& key, const Authenticated& a, int32_t status, const std::string& text,
                 const Deadline& deadline);

class HandshakeLoop {
 public:
  HandshakeLoop(const crypto::HmacKey& key, const Deadline& deadline);
  ~HandshakeLoop();  // closes every connection not handed out
  HandshakeLoop(const HandshakeLoop&) = delete;
  HandshakeLoop& operator=(const HandshakeLoop&) = delete;

  // Answers connections on this listener (not owned; made non-blocking here).
  void serve(int listener, ServerRules rules);
  // Dials, and redials after a failure until the deadline; returns the connection's index.
  size_t dial(ClientSpec spec);
  // Until every dialled connection is accepted and served_enough() holds. At the deadline calls
  // on_deadline(), which throws (it may ask client_status() and refusals() what happened). A
  // server's authenticated refusal (accept status != 0) is thrown at once as a BootstrapError.
  void run(const std::function<bool()>& served_enough, const std::function<void()>& on_deadline);

  struct ClientStatus {
    int attempts = 0;
    bool connected = false;  // some attempt reached a listener
    bool done = false;
    std::string failure;  // the last attempt's failure, e.g. "did not prove the job's secret"
  };
  ClientStatus client_status(size_t index) const;
  // After run(): the accepted connection (blocking again); the caller owns it.
  int take_client_fd(size_t index);
  const Transcript& client_transcript(size_t index) const;
  // What the servers refused, e.g. "2 connection(s) did not prove the job's secret".
  std::string refusals() const;

 private:
  struct Conn;
  struct Client;
  void accept_new();
  void redial(Client& c);
  void on_client_event(Client& c, short revents);
  void client_failed(Client& c, const std::string& why);
  void on_server_event(Conn& c);
  void refuse(Conn& c, const std::string& counted_as);

  const crypto::HmacKey& key_;
  Deadline deadline_;
  int listener_ = -1;
  ServerRules rules_;
  std::deque<std::unique_ptr<Conn>> pending_;  // accepted, handshake unfinished; oldest first
  std::vector<std::unique_ptr<Client>> clients_;
  std::vector<std::pair<std::string, int>> refused_;  // (why, how many), in first-seen order
};

}  // namespace ringtree
