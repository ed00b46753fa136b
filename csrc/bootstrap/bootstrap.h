// Rendezvous through rank 0, then a full mesh of authenticated connections.
//
// Rank 0 listens at the unique id's address. Every other rank connects, and the two prove to
// each other that they hold the job's secret (bootstrap/handshake.h: rank 0 first, the secret
// never on the wire); the rank's proof carries its host identity and the port of its own mesh
// listener. Rank 0 drops connections that cannot prove the secret (without disturbing the job),
// explains a wrong rank or size to every rank instead of hanging, and sends everyone the peer
// table and a fresh public id for the set-up. Everything rank 0 and a rank say to each other
// after the handshake (the table, barriers, broadcasts, clock offsets) carries a MAC under a key
// of that connection's own. Then every pair connects directly, each connection authenticated
// the same way and bound to the set-up's id: one control connection per pair (liveness, abort
// notices), one message connection per pair (tagged messages, runtime/messenger.h: TCP even on
// one host), plus a data connection for pairs that talk over TCP.
#pragma once
#include <cstdint>
#include <string>
#include <vector>
#include "bootstrap/crypto.h"
#include "common/clock.h"
#include "ringtree/unique_id.h"

namespace ringtree {

struct PeerInfo {
  std::string host;  // host identity (RINGTREE_HOSTNAME or the hostname)
  int pid = 0;
  std::string ip;
  uint16_t mesh_port = 0;
  bool force_tcp = false;
  // Which ranks can share memory and wake each other (transport/shm's shared_memory_domain():
  // boot, /dev/shm and network namespace). Ranks on one named host but in different
  // containers or network namespaces differ here.
  uint64_t shm_domain = 0;
  // Which ranks compete for the same CPUs (transport/shm's cpu_sharing_domain()), and how many
  // CPUs that is: the wait policy counts these ranks against those CPUs.
  uint64_t cpu_domain = 0;
  uint32_t cpu_count = 0;
};

struct Mesh {
  std::vector<PeerInfo> peers;
  // Random, made by rank 0 for this set-up and the same on every rank: names dump files without a
  // bit of the secret. Not names in /dev/shm: those each rank draws itself (transport/shm/shm.h).
  std::string public_id;
  std::vector<int> ctrl_fd;  // per peer, -1 for self
  std::vector<int> data_fd;  // per peer, -1 where the pair uses shared memory
  std::vector<int> msg_fd;   // per peer, -1 for self: tagged messages beside the call order
  bool pair_uses_tcp(int a, int b) const {
    return peers[a].host != peers[b].host || peers[a].shm_domain != peers[b].shm_domain || peers[a].force_tcp ||
           peers[b].force_tcp;
  }
  bool no_pair_uses_tcp() const {
    for (size_t a = 0; a < peers.size(); ++a)
      for (size_t b = a + 1; b < peers.size(); ++b)
        if (pair_uses_tcp(static_cast<int>(a), static_cast<int>(b))) return false;
    return true;
  }
};

// This rank's clock minus rank 0's, and how far off that estimate may be (both in ns).
struct ClockOffset {
  int64_t offset_ns = 0;
  int64_t error_ns = 0;
};

class Bootstrap {
 public:
  Bootstrap(int rank, int size, const UniqueId& uid, double timeout_s);
  ~Bootstrap();
  Bootstrap(const Bootstrap&) = delete;
  Bootstrap& operator=(const Bootstrap&) = delete;

  Mesh connect(const std::string& host_key, bool force_tcp, uint64_t shm_domain, uint64_t cpu_domain,
               uint32_t cpu_count);
  // A barrier through rank 0; only during setup, before the star is closed.
  void barrier();
  // Rank 0's bytes to every rank; only during setup.
  void broadcast_from_root(void* data, size_t bytes);
  // Every rank's `bytes` bytes to every rank, in rank order into all[size * bytes], sealed like
  // every star message; only during setup. Also a barrier.
  void all_gather(const void* mine, void* all, size_t bytes);
  // Every rank's clock offset to rank 0 (a few round trips each); only during setup.
  ClockOffset estimate_clock_offset(int64_t (*now_ns)(), int rounds = 8);
  // The last step of set-up, so that it ends on every rank or on none: every rank tells rank 0
  // it is ready, and rank 0 releases them once all are. A rank that fails before this fails
  // everyone's set-up (rank 0 stops, and the others see its connection close); one that dies
  // after its release is an ordinary failure of the new communicator.
  void confirm_setup();
  void close_star();

 private:
  // Every rank reports to rank 0, which then releases them all; with release_may_fail, a rank
  // that died after reporting does not fail rank 0.
  void gather_then_release(bool release_may_fail);
  void rendezvous_as_root(PeerInfo self, Mesh& mesh, std::array<uint8_t, 16>& setup);
  void rendezvous_as_peer(PeerInfo& self, Mesh& mesh, int& mesh_listener, std::array<uint8_t, 16>& setup);
  void connect_mesh(Mesh& mesh, int mesh_listener, const std::array<uint8_t, 16>& setup);

  // A star connection after its handshake: every message carries a MAC under the connection's
  // own key and a count per direction, so none can be forged, replayed or reordered.
  struct StarLink {
    int fd = -1;
    crypto::HmacKey key;
    uint64_t sent = 0, received = 0;
  };
  void send_sealed(int r, const void* data, size_t bytes);
  void recv_sealed(int r, void* data, size_t bytes);

  int rank_, size_;
  UniqueId uid_;
  crypto::HmacKey secret_key_;
  Deadline deadline_;
  std::vector<StarLink> star_;  // root: one per rank; others: [0] = connection to root
};

}  // namespace ringtree
