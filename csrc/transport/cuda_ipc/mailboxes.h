// The CUDA IPC transport: every rank's mailboxes live in one region of its device memory, which
// every peer maps through CUDA IPC. The executor (exec/cuda/ipc_executor) exchanges what
// export_region() gives over its host communicator and gets lanes back; it never sees a CUDA
// IPC handle or the region's layout.
//
// Every mailbox exists once per channel (C walkers per rank, see WalkPlan::nchannels):
//   inboxes    P x C x slots x slot_bytes: inbox[q][c] holds chunks from rank q, channel c
//   headers    P x C x slots x 2 words: tag and byte count of each inbox slot
//   posted     P x C words: posted[q][c] = chunks rank q has put in inbox[q][c]   (written by q)
//   consumed   P x C words: consumed[q][c] = this rank's chunks rank q has read    (written by q)
//   stop       P words: stop[q] set by rank q when it stopped a call                 (written by q)
//   calls      P x 2 words: the call rank q is in, {tag, seq + 1}                  (written by q)
#pragma once
#include <cstdint>
#include <string>
#include <vector>
#include "transport/mailbox_lane.h"

namespace ringtree {

class CudaIpcMailboxes {
 public:
  // What a peer needs to map this rank's region (a CUDA IPC handle, opaque to the caller).
  struct Export {
    char bytes[64];
  };

  CudaIpcMailboxes(int nranks, int rank) : P_(nranks), rank_(rank) {}
  ~CudaIpcMailboxes() { close(); }
  CudaIpcMailboxes(const CudaIpcMailboxes&) = delete;
  CudaIpcMailboxes& operator=(const CudaIpcMailboxes&) = delete;

  // Allocates this rank's region on the current device for up to `slots` slots of `slot_bytes`
  // and `channels` channels, and zeroes it (complete before this returns, so before any peer can
  // write into it); then exports it. Returns "" or why not.
  std::string allocate(uint64_t slot_bytes, uint32_t slots, uint32_t channels, Export* out);
  // The layout every rank uses: the same on every rank (peers compute offsets into this rank's
  // region with it), no larger in any term than what this rank allocated.
  void use_layout(uint64_t slot_bytes, uint32_t slots, uint32_t channels);
  uint32_t channels() const { return channels_; }
  // Maps every peer's region (exports[q] from rank q; this rank's own is skipped). "" or why not.
  std::string open_peers(const std::vector<Export>& exports);
  // The lanes to every peer, [peer * channels + channel]; this rank's own are empty.
  std::vector<MailboxLane> lanes() const;
  // This rank's stop words (P of them, one per writer), and this rank's word in peer q's memory
  // (null before open_peers, or for this rank).
  uint64_t* stop_words() const;
  uint64_t* peer_stop_word(int q) const;
  // Unmaps the peers' regions. This rank's device work must be done with them.
  void unmap_peers();
  // Frees this rank's region: only once no peer maps it any more (each has unmapped it, or is
  // gone), as CUDA requires and as a peer's late writes need. keep=true leaves it allocated for
  // the life of the process instead, when that cannot be known.
  void release(bool keep);
  // unmap_peers() and release(false): for a region no peer ever mapped.
  void close() {
    unmap_peers();
    release(false);
  }

 private:
  size_t box(int peer, uint32_t c) const { return static_cast<size_t>(peer) * channels_ + c; }
  size_t inbox_off(int from, uint32_t c) const { return box(from, c) * slots_ * slot_bytes_; }
  size_t headers_off(int from, uint32_t c) const { return inbox_off(P_, 0) + box(from, c) * slots_ * 16; }
  size_t posted_off(int from, uint32_t c) const { return headers_off(P_, 0) + box(from, c) * 8; }
  size_t consumed_off(int to, uint32_t c) const { return posted_off(P_, 0) + box(to, c) * 8; }
  size_t stop_off(int writer) const { return consumed_off(P_, 0) + static_cast<size_t>(writer) * 8; }
  size_t calls_off(int from) const { return stop_off(P_) + static_cast<size_t>(from) * 16; }
  size_t region_bytes() const { return calls_off(P_); }

  int P_, rank_;
  size_t allocated_bytes_ = 0;
  uint64_t slot_bytes_ = 0;
  uint32_t slots_ = 0, channels_ = 1;
  uint8_t* region_ = nullptr;
  std::vector<uint8_t*> peer_regions_;
};

}  // namespace ringtree
