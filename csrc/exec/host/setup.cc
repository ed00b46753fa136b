// Set-up of the host executor: its TCP connections from the mesh, the shared-memory segments and
// rings of the ranks on this host, the single-copy probe, and what set-up found (transports,
// NUMA placement, stores), which the communicator reports.
#include <sys/eventfd.h>
#include <unistd.h>
#include <algorithm>
#include <cstring>
#include <random>
#include "bootstrap/socket.h"
#include "common/check.h"
#include "common/settings.h"
#include "exec/host/executor.h"
#include "transport/shm/cma.h"
#include "transport/tcp/tcp.h"

namespace ringtree {

namespace {
RT_SETTING(SingleCopy)
// RINGTREE_CMA_MIN_BYTES; -1 where it is "auto".
RT_AUTO_SETTING(SingleCopyMinBytes)
// RINGTREE_STREAM_BYTES; -1 where it is "auto" (half the last-level cache).
RT_AUTO_SETTING(StreamBytes)
// auto: below about 1 MiB the ring (two copies, made by two cores at once) was as fast or faster
// on the 2-core VM it was measured on (process_vm_readv pins the pages it reads, a cost per page);
// at P=2 all_gather, all_to_all and broadcast of 512 KiB-2 MiB ran 1.1-2.1x slower with 256 KiB.
constexpr uint64_t kAutoSingleCopyBytes = uint64_t{1} << 20;
// auto, where ranks outnumber cores: the second copy of a two-copy message costs a core that
// another rank waits for, and an all_to_all block is read once, straight into place. At P=4 on
// 2 cores, all_to_all of 1 and 2 MiB (blocks of 256 and 512 KiB) ran 1.0-1.1x and 1.6-2.0x faster
// single-copy; 128 KiB blocks ran 1.4x slower. Broadcast's pipelined segments and all_gather's
// forwarded blocks ran slower single-copy there too, so they keep 1 MiB. (The bench's buffers were
// on huge pages; from small pages every message but a broadcast's, and an all_to_all's whose
// output does not stream, takes the ring, cma.h.)
constexpr uint64_t kOversubscribedAllToAllSingleCopyBytes = uint64_t{256} << 10;
// A test hook: a directory standing in for /sys/devices/system/node (a host with several nodes).
const std::string& NodeDir() {
  static const std::string dir = setting_str(Setting::TestNumaNodeDir);
  return dir;
}
// A test hook: the rank named here reports its single-copy probe as failed.
RT_SETTING(TestSingleCopyProbeFail)
}  // namespace

int64_t stream_bytes_setting() { return StreamBytes(); }

// Every rank owns a segment with one ring per shared-memory sender. Segments are created,
// then opened by the peers, then unlinked: nothing is left in /dev/shm even if a rank dies.
void HostExecutor::connect(Bootstrap& boot, Mesh& mesh, const UniqueId& uid, uint64_t ring_bytes,
                           uint64_t oneshot_bytes, bool cores_shared) {
  conns_.resize(size_);
  for (int q = 0; q < size_; ++q) {
    if (q == rank_) continue;
    if (mesh.pair_uses_tcp(rank_, q)) {
      conns_[q] = std::make_unique<TcpConnection>(q, mesh.data_fd[q]);
      mesh.data_fd[q] = -1;  // owned by the connection now
    } else {
      have_shm_ = true;
    }
  }
  // One-shot needs every rank on this host; every rank derives the same answer from the mesh.
  const bool all_local = size_ > 1 && mesh.no_pair_uses_tcp();
  oneshot_usable_ = all_local && oneshot_bytes > 0;
  oneshot_bytes_ = all_local ? (oneshot_bytes + 63) & ~uint64_t{63} : 0;
  oneshot_arrived_.assign(size_, 0);
  setup_shared_memory(boot, mesh, uid, ring_bytes, cores_shared);
}

void HostExecutor::setup_shared_memory(Bootstrap& boot, const Mesh& mesh, const UniqueId& uid, uint64_t ring_bytes,
                                       bool cores_shared) {
  // senders_of[r]: the ranks that write into r's segment, in rank order; slot = position.
  auto senders_of = [&](int r) {
    std::vector<int> v;
    for (int q = 0; q < size_; ++q)
      if (q != r && !mesh.pair_uses_tcp(r, q)) v.push_back(q);
    return v;
  };
  const std::vector<int> my_senders = senders_of(rank_);
  // Unlinked once every peer has mapped it, and also when set-up fails on the way there (a peer
  // died between the barriers): a failed job must not leave its segments in /dev/shm.
  struct UnlinkAtExit {
    std::string name;
    ~UnlinkAtExit() {
      if (!name.empty()) ShmSegment::unlink(name);
    }
  } own_name;
  // What each rank announces: the random parts of its segment's and its doorbell's names (hex
  // digits; empty without shared-memory peers).
  constexpr size_t kPart = kNameBits / 4;
  struct Names {
    char segment[kPart];
    char bell[kPart];
  } mine{};
  numa_ = numa_placement(NodeDir());
  if (have_shm_) {
    const std::string bell = bell_.bind();
    own_segment_ = std::make_unique<ShmSegment>();
    // The rings in it are read here: on this rank's node, first touched (allocated) by it.
    const std::string segment = own_segment_->create(static_cast<int>(my_senders.size()), ring_bytes, oneshot_bytes_,
                                                     numa_.node, &numa_refused_);
    own_name.name = segment_name(segment);
    RT_CHECK(segment.size() == kPart && bell.size() == kPart, Error, "a fresh name of the wrong length");
    std::memcpy(mine.segment, segment.data(), kPart);
    std::memcpy(mine.bell, bell.data(), kPart);
    own_segment_->populate_all();  // its rings are read here, its one-shot slots written
    own_segment_->header()->numa_node = numa_.node;
  }
  if (have_shm_) {  // read by the peers' probes (probe_single_copy), after the barrier below
    std::random_device random;
    single_copy_probe_word_ = (static_cast<uint64_t>(random()) << 32) ^ random() ^ static_cast<uint64_t>(getpid());
    ShmSegmentHeader* h = own_segment_->header();
    h->cma_pid = static_cast<int32_t>(getpid());
    h->cma_verdict = kCmaVerdictPending;
    h->cma_failed_peer = -1;
    h->cma_probe_addr = reinterpret_cast<uint64_t>(&single_copy_probe_word_);
    h->cma_probe_value = single_copy_probe_word_;
  }
  std::vector<Names> all(size_);
  boot.all_gather(&mine, all.data(), sizeof(Names));  // every segment exists; everyone knows its name
  // The peers' names came sealed from ranks that proved the secret; still, a name is only ever
  // hex digits, so nothing received can step out of /dev/shm.
  auto part_of = [&](int q, const char* field) {
    const std::string part(field, kPart);
    RT_CHECK(part.find_first_not_of("0123456789abcdef") == std::string::npos, BootstrapError, "rank ", q,
             " announced a malformed shared-memory name");
    return part;
  };
  if (have_shm_) {
    std::vector<std::string> bells(size_);
    for (int q = 0; q < size_; ++q)
      if (q != rank_ && !mesh.pair_uses_tcp(rank_, q)) bells[q] = part_of(q, all[q].bell);
    bell_.connect(mesh, rank_, bells);
  }
  peer_segments_.resize(size_);
  for (int q : my_senders) {
    peer_segments_[q] = std::make_unique<ShmSegment>();
    peer_segments_[q]->open(segment_name(part_of(q, all[q].segment)), static_cast<int>(senders_of(q).size()),
                            ring_bytes, oneshot_bytes_);
  }
  boot.barrier();  // every segment is mapped by everyone who needs it
  bell_.forget_name();
  for (size_t i = 0; i < my_senders.size(); ++i) {
    const int q = my_senders[i];
    const std::vector<int> theirs = senders_of(q);
    const int out_slot = static_cast<int>(std::find(theirs.begin(), theirs.end(), rank_) - theirs.begin());
    ShmSegment& peer = *peer_segments_[q];
    peer.populate(peer.header(), peer.oneshot_region_bytes());  // read: its one-shot slots and sleeping flag
    peer.populate(peer.ring(out_slot), sizeof(ShmRing) + peer.ring_bytes());  // written: our ring there
    conns_[q] = std::make_unique<ShmConnection>(
        q, peer.ring(out_slot), peer.ring_data(out_slot), own_segment_->ring(static_cast<int>(i)),
        own_segment_->ring_data(static_cast<int>(i)), ring_bytes, &peer.header()->sleeping, &bell_);
  }
  probe_single_copy(boot, my_senders, cores_shared);
}

void HostExecutor::probe_single_copy(Bootstrap& boot, const std::vector<int>& local_peers, bool cores_shared) {
  // Every rank takes part in the barrier, with or without peers on its host.
  int32_t verdict = 0, failed_peer = -1;
  if (SingleCopy() == 0)
    verdict = kCmaVerdictOff;
  else if (TestSingleCopyProbeFail() == rank_)
    verdict = kCmaVerdictSimulated;
  for (size_t i = 0; verdict == 0 && i < local_peers.size(); ++i) {
    const ShmSegmentHeader* h = peer_segments_[local_peers[i]]->header();
    verdict = cma_probe(h->cma_pid, h->cma_probe_addr, h->cma_probe_value);
    if (verdict != 0) failed_peer = local_peers[i];
  }
  if (have_shm_) {
    own_segment_->header()->cma_failed_peer = failed_peer;
    own_segment_->header()->cma_verdict = verdict;
    own_segment_->header()->cores_shared = cores_shared ? 1 : 0;
    own_segment_->header()->huge_pages_possible = transparent_huge_pages_possible() ? 1 : 0;
  }
  boot.barrier();  // every verdict is written
  if (!have_shm_) return;
  // The first rank on this host (in rank order) that could not, and why.
  std::vector<int> here = local_peers;
  here.push_back(rank_);
  std::sort(here.begin(), here.end());
  for (int q : here) {
    const ShmSegmentHeader* h = q == rank_ ? own_segment_->header() : peer_segments_[q]->header();
    if (h->cma_verdict == 0) continue;
    single_copy_status_ = str_cat(
        "off: rank ", q,
        h->cma_failed_peer >= 0 ? str_cat(" could not read rank ", h->cma_failed_peer, "'s memory") : std::string(),
        ": ", cma_verdict_text(h->cma_verdict), "; messages between ranks on this host are copied twice");
    return;
  }
  for (int q : local_peers) {
    auto* conn = static_cast<ShmConnection*>(conns_[q].get());
    conn->enable_single_copy(peer_segments_[q]->header()->cma_pid);
    single_copy_conns_.emplace_back(q, conn);
  }
  single_copy_on_ = true;
  const bool automatic = SingleCopyMinBytes() < 0;
  single_copy_min_bytes_ =
      automatic ? kAutoSingleCopyBytes : static_cast<uint64_t>(std::max<int64_t>(1, SingleCopyMinBytes()));
  single_copy_all_to_all_min_bytes_ =
      automatic && cores_shared ? kOversubscribedAllToAllSingleCopyBytes : single_copy_min_bytes_;
  // Every rank of the host decides alike (the broadcast's segments follow): any rank's shared
  // cores keep the single copy for all.
  for (int q : here) {
    const ShmSegmentHeader* h = q == rank_ ? own_segment_->header() : peer_segments_[q]->header();
    host_cores_shared_ |= h->cores_shared != 0;
    host_huge_pages_possible_ |= h->huge_pages_possible != 0;
  }
  single_copy_from_huge_pages_only_ = automatic;
  single_copy_status_ =
      str_cat("on: process_vm_readv for collective messages of at least ", single_copy_min_bytes_, " bytes",
              single_copy_all_to_all_min_bytes_ != single_copy_min_bytes_
                  ? str_cat(" (all_to_all: ", single_copy_all_to_all_min_bytes_, ", ranks outnumber cores)")
                  : std::string(),
              automatic ? " (RINGTREE_CMA_MIN_BYTES auto)" : " (RINGTREE_CMA_MIN_BYTES)", " between the ",
              single_copy_conns_.size() + 1, " ranks on this host",
              single_copy_from_huge_pages_only_
                  ? std::string("; a message mostly on small pages uses the ring") +
                        (host_cores_shared_ ? " (but a broadcast's, and an all_to_all's whose output does not stream: "
                                              "ranks outnumber cores)"
                                            : "")
                  : std::string());
}

// auto, where every rank of the host has a core of its own: a broadcast that does not fit the
// last-level cache goes through the ring even from huge pages. Its root has nothing else to do,
// so the ring's two copies stream from and to memory on two cores at once, where one receiver's
// single copy is bounded by what its one core pulls from memory; in cache the single copy wins.
// At P=2 on the 2-core VM (32 MiB L3, huge pages; separate launches taking turns, 4-8 each) the
// single copy ran 1.2-1.7x faster at 8 MiB in four runs of four; 16 MiB went either way (0.94-1.39x
// here, the ring ahead in six earlier runs); the ring ran 0.95-1.32x at 32 and 64 MiB (1.1-1.6x
// earlier). Where ranks share cores the second copy costs a core another rank waits for: single
// copy there at every size.
//
// Streaming stores pay where an output would push its inputs out of the cache; one that fits
// beside them is read back sooner from there. At P=2 on the 2-core VM (32 MiB L3, huge pages)
// all_gather and all_to_all of 8 MiB ran 1.15-1.45x faster with plain stores, 32 MiB 1.1-1.2x
// faster streaming, 16 MiB alike.
//
// auto, where ranks share cores (P >= 4, where the binary tree is not flat): a broadcast from
// the single-copy size up to the last-level cache follows the root's pages. From huge pages the
// flat tree, its receivers reading the root's buffer single-copy, ran 1.3-2.2x faster than the
// binary tree at P=4 on the 2-core VM (1-8 MiB; 16 MiB 1.0-1.3x; 32 MiB slower); from small
// pages 1.5-2.4x slower (the root copies into every receiver's ring, or pins 4 KiB pages).
// Only the root sees its pages: the communicator asks it before such a call
// (broadcast_asks_root). Not where huge pages are off on the host: the answer is known.
void HostExecutor::set_last_level_cache_bytes(uint64_t bytes) {
  stream_bytes_ = StreamBytes() >= 0 ? static_cast<uint64_t>(StreamBytes()) : bytes / 2;
  if (!single_copy_on_ || SingleCopyMinBytes() >= 0 || bytes == 0) return;
  if (host_cores_shared_) {
    const bool every_peer_single_copy = single_copy_conns_.size() + 1 == static_cast<size_t>(size_);
    if (!every_peer_single_copy || rooted_tree_is_flat(Algo::Tree, size_) || !host_huge_pages_possible_) return;
    root_pages_broadcast_below_ = bytes;
    single_copy_status_ += str_cat("; a broadcast of ", single_copy_min_bytes_, " bytes or more, below ", bytes,
                                   " (the last-level cache), asks its root first and runs the flat tree, every "
                                   "receiver reading the root's buffer single-copy, where the root holds it mostly "
                                   "on huge pages (ranks outnumber cores)");
    return;
  }
  broadcast_ring_from_bytes_ = bytes;
  single_copy_status_ +=
      str_cat("; broadcasts of ", bytes,
              " bytes or more (the last-level cache) use the ring (every rank has a core of its own)");
}

// Every receiver of a broadcast over a flat tree (direct; P = 2 on the chain, up to 3 on the
// binary tree) reads from the root, so there is nothing to pipeline; single-copy, each segment
// costs the receiver a system call and the pair a header. At P=2, 2-8 MiB, segments of the
// single-copy size ran 1.2-1.7x faster than the default's in two interleaved runs here and even
// in two others, never slower. Only where every other rank is a single-copy
// peer: single copy is then on for every rank or none, so every rank lowers the same schedule.
uint64_t HostExecutor::segment_bytes_for(Collective coll, Algo algo, uint64_t bytes) const {
  const bool every_peer_single_copy = single_copy_conns_.size() + 1 == static_cast<size_t>(size_);
  if (coll != Collective::Broadcast || !every_peer_single_copy || bytes < single_copy_min_bytes_ ||
      bytes >= broadcast_ring_from_bytes_ || (algo != Algo::Tree && algo != Algo::Ring && algo != Algo::Direct))
    return 0;
  return rooted_tree_is_flat(algo, size_) ? single_copy_min_bytes_ : 0;
}

std::string HostExecutor::numa_status() const {
  if (!own_segment_) return str_cat(describe(numa_), "; no shared memory");
  return str_cat(describe(numa_), "; rings this rank reads and its one-shot slots ",
                 numa_refused_.empty() ? str_cat("on node ", numa_.node, " (preferred), allocated by this rank")
                                       : str_cat("allocated by this rank, first touch only (", numa_refused_, ")"));
}

std::vector<int> HostExecutor::numa_nodes() const {
  std::vector<int> nodes(size_, -1);
  nodes[rank_] = numa_.node;
  for (int q = 0; q < size_ && q < static_cast<int>(peer_segments_.size()); ++q)
    if (peer_segments_[q]) nodes[q] = peer_segments_[q]->header()->numa_node;
  return nodes;
}

uint64_t HostExecutor::single_copy_messages() const {
  uint64_t n = 0;
  for (const auto& [peer, conn] : single_copy_conns_) n += conn->single_copy_received();
  return n;
}

const ShmConnection* HostExecutor::shm_connection(int q) const {
  // A peer whose segment this rank mapped is one it talks to over shared memory.
  const bool shm = q < static_cast<int>(peer_segments_.size()) && peer_segments_[q] && conns_[q];
  return shm ? static_cast<const ShmConnection*>(conns_[q].get()) : nullptr;
}

uint64_t HostExecutor::streamed_pieces() const {
  uint64_t n = oneshot_stores_.streamed();
  for (int q = 0; q < size_; ++q)
    if (const ShmConnection* conn = shm_connection(q)) n += conn->streamed_pieces();
  return n;
}

std::string HostExecutor::shm_stores() const {
  std::string out;
  if (oneshot_usable_) out = str_cat("one-shot slots: ", oneshot_stores_.describe());
  for (int q = 0; q < size_; ++q)
    if (const ShmConnection* conn = shm_connection(q))
      out += str_cat(out.empty() ? "" : "; ", "ring to rank ", q, ": ", conn->describe_stores());
  return str_cat(out.empty() ? "no shared-memory peers" : out, "; outputs: ",
                 stream_bytes_ ? str_cat("streaming stores from ", stream_bytes_, " bytes") : "plain stores",
                 " (RINGTREE_STREAM_BYTES", StreamBytes() < 0 ? " auto: half the last-level cache)" : ")");
}

void HostExecutor::open_wake_fd() {
  wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  RT_SYSCHECK(wake_fd_, "eventfd");
}

HostExecutor::~HostExecutor() { close_fd(wake_fd_); }

std::string HostExecutor::transport_to(int peer) const {
  if (peer == rank_) return "self";
  return conns_.size() > static_cast<size_t>(peer) && conns_[peer] ? conns_[peer]->kind() : "closed";
}

void HostExecutor::close() {
  single_copy_conns_.clear();  // they point into conns_
  conns_.clear();
  peer_segments_.clear();
  own_segment_.reset();
}

}  // namespace ringtree
