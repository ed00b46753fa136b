#include "transport/shm/shm.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include "bootstrap/crypto.h"
#include "common/check.h"
#include "common/numa.h"
#include "common/clock.h"
#include "common/hash.h"
#include "common/settings.h"
#include "kernels/host/copy.h"
#include "transport/shm/cma.h"

namespace ringtree {

namespace {
constexpr uint64_t kSegmentMagic = 0x5254534547303031ull;
constexpr size_t kHeaderBytes = 128;
RT_SETTING(ShmPieceBytes)
RT_SETTING(TestShmNamesTaken)
// Pieces smaller than this always take plain stores: streaming stores drain to memory before the
// head may move, which costs a small piece more than it saves.
constexpr uint64_t kStreamMinPiece = 16 << 10;
// One measured piece in this many tries the store kind not in use, so the choice follows the
// ranks when the scheduler (or a hypervisor) moves them between core complexes.
constexpr uint32_t kStoreExplorePeriod = 128;

// A single-copy receive reads at most this much per turn, so the executor's other operations of
// the step (and its abort checks) get their turns in between.
constexpr uint64_t kSingleCopyTurnBytes = 2 << 20;
}  // namespace

int shm_stream_store_setting() {
  static const int setting = [] {
    const std::string v = setting_str(Setting::ShmStreamStores);
    if (v == "auto") return -1;
    if (v == "0" || v == "off") return 0;
    if (v == "1" || v == "on") return 1;
    RT_CHECK(false, InvalidArgument, "RINGTREE_SHM_STREAM_STORES must be auto, on or off, got '", v, "'");
    return -1;
  }();
  return setting;
}

// Layout: header, the one-shot slots (a page each, from the second page), the payload slots when
// a slot's payload may exceed what fits inline, then one ring per sender. Without one-shot the
// slots are bare headers (no page each).
static size_t oneshot_slot_stride(uint64_t oneshot_bytes) {
  return oneshot_bytes ? kOneShotSlotBytes : sizeof(OneShotSlot);
}
static size_t oneshot_slots_offset(uint64_t oneshot_bytes) { return oneshot_bytes ? kOneShotSlotBytes : kHeaderBytes; }
static size_t oneshot_payload_offset(uint64_t oneshot_bytes) {
  return oneshot_slots_offset(oneshot_bytes) + kOneShotSlots * oneshot_slot_stride(oneshot_bytes);
}
static size_t oneshot_region_bytes_for(uint64_t oneshot_bytes) {
  const int payload_slots = oneshot_bytes > kOneShotInlineBytes ? kOneShotPayloadSlots : 0;
  return oneshot_payload_offset(oneshot_bytes) + payload_slots * oneshot_bytes;
}
static_assert(sizeof(OneShotSlot) + kOneShotInlineBytes == kOneShotSlotBytes,
              "a slot is its header and inline payload");

size_t ShmSegment::bytes_for(int slots, uint64_t ring_bytes, uint64_t oneshot_bytes) {
  return oneshot_region_bytes_for(oneshot_bytes) + static_cast<size_t>(slots) * (sizeof(ShmRing) + ring_bytes);
}

size_t ShmSegment::oneshot_region_bytes() const { return oneshot_region_bytes_for(oneshot_bytes_); }

OneShotSlot* ShmSegment::oneshot_slot(int slot) const {
  return reinterpret_cast<OneShotSlot*>(static_cast<uint8_t*>(base_) + oneshot_slots_offset(oneshot_bytes_) +
                                        static_cast<size_t>(slot) * oneshot_slot_stride(oneshot_bytes_));
}

uint8_t* ShmSegment::oneshot_payload(uint64_t gen, uint64_t call_bytes) const {
  if (call_bytes <= kOneShotInlineBytes)
    return reinterpret_cast<uint8_t*>(oneshot_slot(oneshot_slot_of(gen))) + sizeof(OneShotSlot);
  return static_cast<uint8_t*>(base_) + oneshot_payload_offset(oneshot_bytes_) +
         (gen % kOneShotPayloadSlots) * oneshot_bytes_;
}

ShmRing* ShmSegment::ring(int slot) const {
  return reinterpret_cast<ShmRing*>(static_cast<uint8_t*>(base_) + oneshot_region_bytes() +
                                    static_cast<size_t>(slot) * (sizeof(ShmRing) + ring_bytes_));
}

std::string ShmSegment::create(int slots, uint64_t ring_bytes, uint64_t oneshot_bytes, int node,
                               std::string* placement) {
  ring_bytes_ = ring_bytes;
  oneshot_bytes_ = oneshot_bytes;
  bytes_ = bytes_for(slots, ring_bytes, oneshot_bytes);
  std::string part, name;
  int fd = -1;
  for (int attempt = 0; fd < 0 && attempt < kFreshNameTries; ++attempt) {
    part = random_name_part(attempt);
    name = segment_name(part);
    fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0 && errno != EEXIST) throw_system_error("shm_open(" + name + ")", errno);
  }
  RT_CHECK(fd >= 0, BootstrapError, kFreshNameTries, " fresh random names in /dev/shm were all taken already: ",
           "another process is creating names there as fast as they are drawn");
  auto fail = [&](const std::string& what, int err) {
    if (fd >= 0) ::close(fd);
    if (base_) munmap(base_, bytes_);
    base_ = nullptr;
    shm_unlink(name.c_str());
    RT_THROW(Error, "cannot reserve ", bytes_, " bytes of shared memory for ", name, ": ", what, ": ",
             std::strerror(err),
             " (free space in /dev/shm, lower RINGTREE_SHM_RING_BYTES, or set RINGTREE_TRANSPORT=tcp)");
  };
  // Sized and mapped first, so the node policy is set before any page exists (numa.h).
  if (ftruncate(fd, static_cast<off_t>(bytes_)) != 0) fail("ftruncate", errno);
  void* p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) fail("mmap", errno);
  base_ = p;
  *placement = prefer_node(base_, bytes_, node);
  // Reserve the pages now: a full /dev/shm must fail here, not with SIGBUS mid-collective.
  if (int rc = posix_fallocate(fd, 0, static_cast<off_t>(bytes_)); rc != 0) fail("posix_fallocate", rc);
  ::close(fd);
  header()->magic = kSegmentMagic;
  header()->sleeping.store(0);
  header()->cpu.store(-1);
  for (int slot = 0; slot < kOneShotSlots; ++slot) oneshot_slot(slot)->gen.store(0);
  for (int s = 0; s < slots; ++s) {
    ring(s)->head.store(0);
    ring(s)->tail.store(0);
  }
  return part;
}

void ShmSegment::open(const std::string& name, int slots, uint64_t ring_bytes, uint64_t oneshot_bytes) {
  ring_bytes_ = ring_bytes;
  oneshot_bytes_ = oneshot_bytes;
  bytes_ = bytes_for(slots, ring_bytes, oneshot_bytes);
  int fd = shm_open(name.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC, 0600);
  // It existed at the barrier before this open, so its owner has since failed set-up (and
  // unlinked it): a failure of the set-up, like a closed connection, not a system error.
  if (fd < 0 && errno == ENOENT)
    RT_THROW(BootstrapError, "shared memory segment ", name, " vanished during set-up: its owner failed");
  if (fd < 0) throw_system_error("shm_open(" + name + ")", errno);
  // The peer made it 0600 and sized it before the barrier: anything else was put there by
  // someone else (and a short one would fault on first use).
  struct stat st{};
  const bool ours = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid() && (st.st_mode & 077) == 0 &&
                    static_cast<uint64_t>(st.st_size) >= bytes_;
  if (!ours) {
    ::close(fd);
    char mode[8];
    std::snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(st.st_mode & 07777));
    RT_THROW(BootstrapError, "shared memory segment ", name, " is not this job's (owner uid ", st.st_uid, ", mode ",
             mode, ", ", st.st_size, " bytes; expected uid ", geteuid(), ", mode 0600, ", bytes_, " bytes)");
  }
  map(fd, name);
  RT_CHECK(header()->magic == kSegmentMagic, Error, "shared memory segment ", name, " is not a ringtree segment");
}

void ShmSegment::map(int fd, const std::string& name) {
  void* p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int e = errno;
  ::close(fd);
  if (p == MAP_FAILED) throw_system_error("mmap(" + name + ")", e);
  base_ = p;
}

void ShmSegment::unlink(const std::string& name) { shm_unlink(name.c_str()); }

// Left to first touch, every 4 KiB of a ring faulted on its first lap, in the writer and again in
// the reader: at 2 us a fault on this VM, a 32 KiB all_reduce took 25-35 us for its first 30
// calls instead of 6-7. Only the parts a rank uses are filled (its own segment, and in a peer's
// the header, the one-shot slots and its own ring): every segment whole would be P^2 ring pages per rank.
void ShmSegment::populate(const void* begin, size_t bytes) {
  const uintptr_t page = 4096;
  const uintptr_t first = reinterpret_cast<uintptr_t>(begin) & ~(page - 1);
  const uintptr_t end = reinterpret_cast<uintptr_t>(begin) + bytes;
#ifdef MADV_POPULATE_WRITE
  if (madvise(reinterpret_cast<void*>(first), end - first, MADV_POPULATE_WRITE) == 0) return;
#endif
  // Older kernels: a read maps a tmpfs page writable in a shared mapping.
  for (uintptr_t a = first; a < end; a += page) (void)*reinterpret_cast<volatile const uint8_t*>(a);
}

ShmSegment::~ShmSegment() {
  if (base_) munmap(base_, bytes_);
}

ShmConnection::ShmConnection(int peer, ShmRing* out_ring, uint8_t* out_data, ShmRing* in_ring, uint8_t* in_data,
                             uint64_t ring_bytes, std::atomic<uint32_t>* peer_sleeping, Doorbell* bell)
    : peer_(peer),
      out_(out_ring),
      out_data_(out_data),
      in_(in_ring),
      in_data_(in_data),
      cap_(ring_bytes),
      piece_(std::max<uint64_t>(64, static_cast<uint64_t>(ShmPieceBytes()) & ~uint64_t{63})),
      peer_sleeping_(peer_sleeping),
      bell_(bell) {}

void ShmConnection::wake_peer() {
  // Pairs with the fence between a sleeper's flag store and its last look at the rings.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (peer_sleeping_->load(std::memory_order_relaxed)) bell_->ring(peer_);
}

bool ShmConnection::progress_send(SendCursor& c) {
  const uint64_t payload = c.header.payload_bytes;
  bool single_copy = c.done == 0 && cma_pid_ && c.single_copy_min_bytes > 0 && payload >= c.single_copy_min_bytes;
  if (single_copy && c.single_copy_from_huge_pages_only) {
    c.single_copy_from_huge_pages_only = false;  // asked once per message: a full ring comes back here
    if (!cma_source_on_huge_pages(c.payload, payload).value_or(true)) c.single_copy_min_bytes = 0, single_copy = false;
  }
  if (c.ack_at || single_copy) return progress_single_copy_send(c);
  const uint64_t total = stream_bytes(payload);
  bool moved = false;
  while (c.done < total) {
    const uint64_t head = out_->head.load(std::memory_order_relaxed);
    const uint64_t tail = out_->tail.load(std::memory_order_acquire);
    const uint64_t free = cap_ - (head - tail);
    if (free == 0) break;
    const uint64_t pos = head % cap_;
    const uint64_t n = std::min({free, cap_ - pos, total - c.done, piece_});
    uint8_t* dst = out_data_ + pos;
    // The stream is header [0,64), payload, then padding that is never written.
    uint64_t off = c.done, left = n;
    if (off < sizeof(MsgHeader)) {
      std::memcpy(dst, &c.header, sizeof(MsgHeader));  // pieces are 64-aligned: the whole header
      off += sizeof(MsgHeader);
      dst += sizeof(MsgHeader);
      left -= sizeof(MsgHeader);
    }
    const uint64_t payload_off = off - sizeof(MsgHeader);
    if (left > 0 && payload_off < payload)
      stores_.copy(dst, c.payload + payload_off, std::min(left, payload - payload_off));
    out_->head.store(head + n, std::memory_order_release);
    c.done += n;
    moved = true;
  }
  if (moved) wake_peer();
  return moved;
}

// A line this core writes into shared memory is then read by another rank's core. When the two
// sit in one core complex that hand-over goes through the shared cache and plain stores are
// fastest; when they do not (another CCD on AMD, another socket, or vCPUs the hypervisor moved
// apart), each store first has to take the line back from the reader's cache, and plain copies
// into a ring ran 4-8x slower here, while streaming stores, which go to memory, ran at full speed
// either way (the reader then reads from memory). Which case holds changes while a job runs, so
// each writer times its own copies and uses streaming stores only while they measure clearly faster.
SharedStores::SharedStores() : setting_(shm_stream_store_setting()) {}

void SharedStores::copy(uint8_t* dst, const uint8_t* src, uint64_t bytes) {
  if (bytes < kStreamMinPiece || setting_ == 0) {
    std::memcpy(dst, src, bytes);
    return;
  }
  bool stream = setting_ == 1;
  const bool measure = setting_ < 0;
  if (measure) {
    // Plain first; then streaming once, to measure it; then the faster, trying the other now and then.
    const bool best = cost_[0] != 0 && (cost_[1] == 0 || streaming_measures_faster());
    stream = ++measured_ % kStoreExplorePeriod == 0 ? !best : best;
  }
  const int64_t start = measure ? ticks() : 0;
  if (stream) {
    streaming_copy(dst, src, bytes);
    streaming_copy_fence();  // streaming stores are weakly ordered: land them before the data is published
    ++streamed_;
  } else {
    std::memcpy(dst, src, bytes);
  }
  if (measure) {
    // Ticks per KiB. Interference (the scheduler, a first touch of the ring's pages) can only
    // slow a copy down, so a faster sample is taken as it is, while a slower one moves the
    // estimate halfway towards it, capped at 4x: one interrupted copy cannot flip the choice.
    uint64_t& cost = cost_[stream];
    const uint64_t sample = std::max<uint64_t>(1, (static_cast<uint64_t>(ticks() - start) << 10) / bytes);
    cost = cost == 0 || sample <= cost ? sample : (cost + std::min(sample, 4 * cost)) / 2;
  }
}

// The timing leaves out the reader, who reads streamed data from memory rather than out of a
// shared cache, which cost about as much again as the copy when the cores share one; so
// streaming has to measure twice as fast. Apart, plain copies measured about 10x slower.
bool SharedStores::streaming_measures_faster() const { return cost_[1] != 0 && cost_[1] * 2 < cost_[0]; }

std::string SharedStores::describe() const {
  if (setting_ >= 0)
    return setting_ ? "streaming (RINGTREE_SHM_STREAM_STORES=on)" : "plain (RINGTREE_SHM_STREAM_STORES=off)";
  if (cost_[0] == 0) return "plain (auto: nothing of 16 KiB or more copied yet)";
  return str_cat(streaming_measures_faster() ? "streaming" : "plain", " (auto: plain ", cost_[0], ", streaming ",
                 cost_[1] ? std::to_string(cost_[1]) : std::string("not measured yet"), " cycles per KiB)");
}

// The header alone goes into the ring, with the payload's address; the send completes once the
// receiver has consumed it, which it does only after reading the whole payload (or at once with
// defer_ack, and the executor waits for acknowledged() before the call returns).
bool ShmConnection::progress_single_copy_send(SendCursor& c) {
  if (c.ack_at) {
    if (out_->tail.load(std::memory_order_acquire) < c.ack_at) return false;
    c.done = stream_bytes(c.header.payload_bytes);
    return true;
  }
  const uint64_t head = out_->head.load(std::memory_order_relaxed);
  const uint64_t tail = out_->tail.load(std::memory_order_acquire);
  if (cap_ - (head - tail) < sizeof(MsgHeader)) return false;
  MsgHeader h = c.header;
  h.reserved[0] = reinterpret_cast<uint64_t>(c.payload);
  h.reserved[1] = kSingleCopyMarker;
  std::memcpy(out_data_ + head % cap_, &h, sizeof(MsgHeader));  // positions are 64-aligned
  out_->head.store(head + sizeof(MsgHeader), std::memory_order_release);
  c.ack_at = last_ack_at_ = head + sizeof(MsgHeader);
  c.done = c.defer_ack ? stream_bytes(c.header.payload_bytes) : sizeof(MsgHeader);
  wake_peer();
  return true;
}

bool ShmConnection::progress_single_copy_recv(RecvCursor& c, uint64_t tail) {
  RT_CHECK(cma_pid_ != 0 && !c.reduce, Error, "internal error: rank ", peer_, " sent a single-copy message where ",
           cma_pid_ ? "this rank reduces" : "single-copy transfers are off");
  const uint64_t payload = c.payload_bytes;  // the executor checked the header's against it
  const uint64_t off = c.done - sizeof(MsgHeader);
  if (off < payload) {
    try {
      c.done += cma_read(cma_pid_, c.dst + off, c.header.reserved[0] + off,
                         std::min(payload - off, kSingleCopyTurnBytes), peer_);
    } catch (const Error&) {
      raise_if_withdrawn();  // the sender's call failed and released the buffer: that explains it
      throw;
    }
    if (c.done - sizeof(MsgHeader) < payload) return true;
  }
  // The sender withdraws before it releases the buffer; a read that ended before the withdrawal
  // (seen here as not withdrawn) read the bytes it meant to send, a later one may have read others.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  raise_if_withdrawn();
  // Consuming the header is the acknowledgement: the sender may now reuse its buffer.
  in_->tail.store(tail + sizeof(MsgHeader), std::memory_order_release);
  c.done = stream_bytes(payload);
  ++cma_received_;
  wake_peer();
  return true;
}

void ShmConnection::withdraw_single_copy_sends() {
  if (acknowledged()) return;
  out_->withdrawn.store(1, std::memory_order_seq_cst);
}

void ShmConnection::raise_if_withdrawn() const {
  if (in_->withdrawn.load(std::memory_order_relaxed))
    RT_THROW(PeerFailure, "rank ", peer_,
             "'s call ended in an error before this rank had read its single-copy message");
}

bool ShmConnection::peek_header(MsgHeader* h) const {
  const uint64_t tail = in_->tail.load(std::memory_order_relaxed);
  const uint64_t head = in_->head.load(std::memory_order_acquire);
  if (head - tail < sizeof(MsgHeader)) return false;
  std::memcpy(h, in_data_ + tail % cap_, sizeof(MsgHeader));
  return true;
}

bool ShmConnection::progress_recv(RecvCursor& c) {
  if (c.header_ready && !c.header_checked) return false;
  if (c.header_checked && c.header.reserved[1] == kSingleCopyMarker)
    return progress_single_copy_recv(c, in_->tail.load(std::memory_order_relaxed));
  bool moved = false;
  for (;;) {
    const uint64_t total = c.header_checked ? stream_bytes(c.payload_bytes) : sizeof(MsgHeader);
    if (c.done >= total) break;
    const uint64_t tail = in_->tail.load(std::memory_order_relaxed);
    const uint64_t head = in_->head.load(std::memory_order_acquire);
    const uint64_t avail = head - tail;
    if (avail == 0) break;
    const uint64_t pos = tail % cap_;
    const uint8_t* src = in_data_ + pos;
    if (c.done == 0) {
      std::memcpy(&c.header, src, sizeof(MsgHeader));
      // A single-copy header stays in the ring until its payload is read (see above).
      if (c.header.reserved[1] != kSingleCopyMarker)
        in_->tail.store(tail + sizeof(MsgHeader), std::memory_order_release);
      c.done = sizeof(MsgHeader);
      c.header_ready = true;
      moved = true;
      break;  // the executor checks the header before any payload is consumed
    }
    const uint64_t n = std::min({avail, cap_ - pos, total - c.done});
    const uint64_t payload_off = c.done - sizeof(MsgHeader);
    if (payload_off < c.payload_bytes) {
      const uint64_t bytes = std::min(n, c.payload_bytes - payload_off);
      if (c.reduce)
        c.reduce(c.dst + payload_off, c.local + payload_off, src, bytes / c.elem_size);
      else if (c.stream)
        streaming_copy(c.dst + payload_off, src, bytes);
      else
        std::memcpy(c.dst + payload_off, src, bytes);
    }
    in_->tail.store(tail + n, std::memory_order_release);
    c.done += n;
    moved = true;
  }
  if (moved) wake_peer();
  return moved;
}

namespace {
void mix_boot_id(uint64_t& h) {
  char boot_id[64] = {0};
  if (FILE* f = std::fopen("/proc/sys/kernel/random/boot_id", "r")) {
    if (!std::fgets(boot_id, sizeof(boot_id), f)) boot_id[0] = '\0';
    std::fclose(f);
  }
  for (const char* p = boot_id; *p; ++p) h = fnv1a(h, static_cast<unsigned char>(*p));
}
}  // namespace

uint64_t cpu_sharing_domain(uint32_t* cpus) {
  uint64_t h = kFnvOffset;
  mix_boot_id(h);
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  *cpus = 0;
  if (sched_getaffinity(0, sizeof(allowed), &allowed) == 0) {
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &allowed)) {
        h = fnv1a(h, static_cast<uint64_t>(c));
        ++*cpus;
      }
  }
  return h;
}

std::string random_name_part(int attempt) {
  if (attempt < TestShmNamesTaken()) return std::string(kNameBits / 4, '0');
  uint8_t bits[kNameBits / 8];
  crypto::random_bytes(bits, sizeof(bits));
  return crypto::to_hex(bits, sizeof(bits));
}

std::string segment_name(const std::string& random_part) { return "/rt-" + random_part; }

uint64_t shared_memory_domain() {
  uint64_t h = kFnvOffset;
  auto mix = [&h](uint64_t v) { h = fnv1a(h, v); };
  mix_boot_id(h);
  for (const char* path : {"/proc/self/ns/net", "/dev/shm"}) {
    struct stat st{};
    if (::stat(path, &st) == 0) {
      mix(static_cast<uint64_t>(st.st_dev));
      mix(static_cast<uint64_t>(st.st_ino));
    }
  }
  return h;
}

}  // namespace ringtree
