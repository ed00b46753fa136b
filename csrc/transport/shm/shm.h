// Shared-memory transport between ranks on one host.
//
// Each rank owns one segment holding a byte ring per local sender (single producer, single
// consumer). A sender copies a message into the receiver's ring; the receiver reduces or
// copies straight out of the ring into its destination, so a byte crosses memory twice and
// is never staged again. Messages are padded to 64 bytes, so every ring position a reader
// sees is cache-line aligned and no element straddles the wrap point.
#pragma once
#include <atomic>
#include <cstdint>
#include <string>
#include <sys/types.h>
#include "common/oneshot.h"
#include "transport/doorbell.h"
#include "transport/transport.h"

namespace ringtree {

struct alignas(64) ShmSegmentHeader {
  uint64_t magic;
  std::atomic<uint32_t> sleeping;  // the owner is (about to be) blocked in poll()
  std::atomic<int32_t> cpu;        // the CPU the owner last started a wait on (-1: none yet)
  // The single-copy probe (cma.h), written during set-up only, on its own line: the owner's
  // pid, where its probe word lives in the owner and what it holds, and the owner's verdict on
  // reading every peer's word (0: all read; else a cma.h verdict, about rank cma_failed_peer).
  alignas(64) int32_t cma_pid;
  int32_t cma_verdict;
  int32_t cma_failed_peer;
  uint64_t cma_probe_addr;
  uint64_t cma_probe_value;
  int32_t numa_node;            // the owner's NUMA node (common/numa.h), -1 unknown; written during set-up
  int32_t cores_shared;         // 1: more ranks are allowed the owner's CPUs than there are; written during set-up
  int32_t huge_pages_possible;  // 1: transparent huge pages are not "never" (cma.h); written during set-up
};
static_assert(sizeof(ShmSegmentHeader) == 128, "the segment header is two cache lines");

// The one-shot slots: each rank publishes a small call's whole input in its own segment, in
// one of kOneShotSlots slots chosen by the call's generation (gen % kOneShotSlots), and every peer
// reads it there (exec/host/oneshot.cc). `gen` is stored last, with release; kWriting marks a slot
// being rewritten, so a reader that peeks outside the protocol never trusts a torn header.
// A payload of up to kOneShotInlineBytes follows the slot's header in its page; a larger one is in
// payload slot gen % kOneShotPayloadSlots (common/oneshot.h: how far ahead each lets a rank run).
struct alignas(64) OneShotSlot {
  static constexpr uint64_t kWriting = ~uint64_t{0};
  std::atomic<uint64_t> gen;
  uint64_t pad[7];
  MsgHeader fp;  // the call's fingerprint
  // payload follows (64-byte aligned)
};
static_assert(sizeof(OneShotSlot) == 128, "OneShotSlot header must be two cache lines");

struct ShmRing {
  alignas(64) std::atomic<uint64_t> head;  // bytes ever written (sender)
  // Set by the sender when a call of its ended in an error before the receiver acknowledged a
  // single-copy send: the buffer it pointed to may be freed or reused from then on.
  std::atomic<uint64_t> withdrawn;
  alignas(64) std::atomic<uint64_t> tail;  // bytes ever consumed (receiver)
};

// Which processes can share this transport with this one: the same boot, the same /dev/shm
// (its device and inode: segments and the doorbells' set-up names live there) and the same
// network namespace (ranks in separate ones are treated as separate hosts, as containers are).
// Equal values mean shared memory works between two ranks; a hostname alone does not say so
// (containers sharing /dev/shm, network namespaces).
uint64_t shared_memory_domain();
// Names in /dev/shm (segments, the doorbells' set-up directories) are drawn by their owner:
// 128 random bits in hex, nothing another user can see or derive (not the set-up's public id,
// not a rank), announced to the peers over the authenticated set-up. A name that exists already
// is someone else's: its owner draws another (kFreshNameTries in all) instead of using it.
constexpr int kFreshNameTries = 16;
constexpr size_t kNameBits = 128;
// kNameBits / 4 hex digits; `attempt` counts the draws for one name (a test hook fixes the first
// few, RINGTREE_TEST_SHM_NAMES_TAKEN).
std::string random_name_part(int attempt);
// A segment's name from its random part.
std::string segment_name(const std::string& random_part);
// Ranks that run on one kernel with the same CPUs allowed compete for those CPUs, whatever their
// network namespace or /dev/shm (containers, emulated hosts): a hash of the boot id and the
// affinity mask, and the mask's CPU count in *cpus.
uint64_t cpu_sharing_domain(uint32_t* cpus);

class ShmSegment {
 public:
  ShmSegment() = default;
  ~ShmSegment();
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;

  static size_t bytes_for(int slots, uint64_t ring_bytes, uint64_t oneshot_bytes);
  // Creates and allocates the segment under a fresh random name (segment_name; a taken name is
  // never reused, another is drawn), its pages on `node` where the kernel allows (-1: no
  // preference); *placement says how it went ("" done, else why not). Returns the random part.
  std::string create(int slots, uint64_t ring_bytes, uint64_t oneshot_bytes, int node, std::string* placement);
  void open(const std::string& name, int slots, uint64_t ring_bytes, uint64_t oneshot_bytes);
  static void unlink(const std::string& name);

  ShmSegmentHeader* header() const { return static_cast<ShmSegmentHeader*>(base_); }
  ShmRing* ring(int slot) const;
  uint8_t* ring_data(int slot) const { return reinterpret_cast<uint8_t*>(ring(slot)) + sizeof(ShmRing); }
  // One-shot slot 0 .. kOneShotSlots-1 (gen % kOneShotSlots).
  OneShotSlot* oneshot_slot(int slot) const;
  // Where call `gen`'s payload lives, for a call that publishes call_bytes (the whole call's, as
  // every rank computes it): inline after slot gen's header, or in a payload slot.
  uint8_t* oneshot_payload(uint64_t gen, uint64_t call_bytes) const;
  // Maps [begin, begin + bytes) of this segment into the page tables now, not at first touch.
  void populate(const void* begin, size_t bytes);
  void populate_all() { populate(base_, bytes_); }
  // The header and the one-shot slots: where a segment starts (what its peers read).
  size_t oneshot_region_bytes() const;
  uint64_t ring_bytes() const { return ring_bytes_; }

 private:
  void map(int fd, const std::string& name);
  void* base_ = nullptr;
  size_t bytes_ = 0;
  uint64_t ring_bytes_ = 0;
  uint64_t oneshot_bytes_ = 0;
};

// RINGTREE_SHM_STREAM_STORES: -1 auto, 0 off, 1 on (InvalidArgument for anything else).
int shm_stream_store_setting();

// Copies into shared memory that other ranks read next (a ring, a one-shot slot): plain or streaming
// stores, as RINGTREE_SHM_STREAM_STORES says; 'auto' times both and keeps to the faster (shm.cc).
class SharedStores {
 public:
  SharedStores();
  // Returns once the bytes are visible to a reader that sees a later release store.
  void copy(uint8_t* dst, const uint8_t* src, uint64_t bytes);
  uint64_t streamed() const { return streamed_; }  // copies made with streaming stores
  // "plain" / "streaming" and, under auto, the measured costs behind the choice.
  std::string describe() const;

 private:
  bool streaming_measures_faster() const;
  int setting_;                // -1 auto, 0 plain, 1 streaming
  uint64_t cost_[2] = {0, 0};  // measured ticks per KiB of plain / streaming copies; 0: none yet
  uint32_t measured_ = 0;
  uint64_t streamed_ = 0;
};

class ShmConnection : public Connection {
 public:
  ShmConnection(int peer, ShmRing* out_ring, uint8_t* out_data, ShmRing* in_ring, uint8_t* in_data, uint64_t ring_bytes,
                std::atomic<uint32_t>* peer_sleeping, Doorbell* bell);
  bool progress_send(SendCursor& c) override;
  bool progress_recv(RecvCursor& c) override;
  bool send_complete(const SendCursor& c, uint64_t payload_bytes) const override {
    return c.done == stream_bytes(payload_bytes);
  }
  bool recv_complete(const RecvCursor& c) const override {
    return c.header_checked && c.done == stream_bytes(c.payload_bytes);
  }
  bool peek_header(MsgHeader* h) const override;
  const char* kind() const override { return "shm"; }
  // Sends as large as their SendCursor::single_copy_min_bytes go single-copy; the peer (process
  // peer_pid) reads them out of this process, and its messages out of the peer.
  void enable_single_copy(pid_t peer_pid) { cma_pid_ = peer_pid; }
  uint64_t single_copy_received() const { return cma_received_; }
  // Payload pieces this rank wrote into its ring to the peer with streaming stores (SharedStores).
  uint64_t streamed_pieces() const { return stores_.streamed(); }
  std::string describe_stores() const { return stores_.describe(); }
  // Whether the peer has read every single-copy message this rank sent it.
  bool acknowledged() const { return out_->tail.load(std::memory_order_acquire) >= last_ack_at_; }
  // For a call that ends in an error: tells the peer that the buffers of the single-copy sends it
  // has not acknowledged are no longer there to read (it then raises instead of returning them).
  void withdraw_single_copy_sends();
  static uint64_t stream_bytes(uint64_t payload) { return sizeof(MsgHeader) + ((payload + 63) & ~uint64_t{63}); }

 private:
  void wake_peer();
  bool progress_single_copy_send(SendCursor& c);
  bool progress_single_copy_recv(RecvCursor& c, uint64_t tail);
  void raise_if_withdrawn() const;
  int peer_;
  ShmRing* out_;
  uint8_t* out_data_;
  ShmRing* in_;
  uint8_t* in_data_;
  uint64_t cap_;
  uint64_t piece_;
  SharedStores stores_;  // payload pieces into the out ring
  std::atomic<uint32_t>* peer_sleeping_;
  Doorbell* bell_;
  pid_t cma_pid_ = 0;          // 0: no single-copy transfers on this connection
  uint64_t cma_received_ = 0;  // messages received single-copy
  uint64_t last_ack_at_ = 0;   // the ring position that acknowledges the last single-copy send
};

}  // namespace ringtree
