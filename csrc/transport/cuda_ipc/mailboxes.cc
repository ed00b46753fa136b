// The CUDA IPC transport's mailboxes (see mailboxes.h).
#include "transport/cuda_ipc/mailboxes.h"
#include <cstring>
#include "common/check.h"
#include "kernels/cuda/cuda_api.h"
#include "kernels/cuda/cuda_check.h"

namespace ringtree {

static_assert(sizeof(CudaIpcMailboxes::Export) == sizeof(cudaIpcMemHandle_t), "an export is one CUDA IPC handle");

std::string CudaIpcMailboxes::allocate(uint64_t slot_bytes, uint32_t slots, uint32_t channels, Export* out) {
  slot_bytes_ = slot_bytes;
  slots_ = slots;
  channels_ = channels;
  allocated_bytes_ = region_bytes();
  cudaStream_t stream = nullptr;
  try {
    void* region = nullptr;
    RT_CUDA_CHECK(cudaMalloc(&region, region_bytes()));
    region_ = static_cast<uint8_t*>(region);
    // Zeroed before any peer can write into it, on a stream of its own: cudaMemset and a device
    // synchronization would also wait for whatever the caller has queued on its streams.
    RT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    RT_CUDA_CHECK(cudaMemsetAsync(region_, 0, region_bytes(), stream));
    RT_CUDA_CHECK(cudaStreamSynchronize(stream));
    (void)cudaStreamDestroy(stream);
  } catch (const Error& e) {
    if (stream) (void)cudaStreamDestroy(stream);
    return e.what();
  }
  cudaIpcMemHandle_t handle;
  const cudaError_t err = cudaIpcGetMemHandle(&handle, region_);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return str_cat("cudaIpcGetMemHandle failed: ", cudaGetErrorString(err));
  }
  std::memcpy(out->bytes, &handle, sizeof(handle));
  return "";
}

std::string CudaIpcMailboxes::open_peers(const std::vector<Export>& exports) {
  peer_regions_.assign(P_, nullptr);
  for (int q = 0; q < P_; ++q) {
    if (q == rank_) continue;
    cudaIpcMemHandle_t handle;
    std::memcpy(&handle, exports[q].bytes, sizeof(handle));
    void* p = nullptr;
    const cudaError_t err = cudaIpcOpenMemHandle(&p, handle, cudaIpcMemLazyEnablePeerAccess);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      return str_cat("cudaIpcOpenMemHandle for rank ", q, "'s memory failed: ", cudaGetErrorString(err));
    }
    peer_regions_[q] = static_cast<uint8_t*>(p);
  }
  return "";
}

std::vector<MailboxLane> CudaIpcMailboxes::lanes() const {
  std::vector<MailboxLane> lanes(static_cast<size_t>(P_) * channels_);
  for (int q = 0; q < P_; ++q) {
    if (q == rank_) continue;
    uint8_t* peer = peer_regions_[q];
    for (uint32_t c = 0; c < channels_; ++c) {
      MailboxLane& l = lanes[box(q, c)];
      l.send_slots = peer + inbox_off(rank_, c);
      l.send_headers = reinterpret_cast<uint64_t*>(peer + headers_off(rank_, c));
      l.recv_headers = reinterpret_cast<const uint64_t*>(region_ + headers_off(q, c));
      l.send_posted = reinterpret_cast<uint64_t*>(peer + posted_off(rank_, c));
      l.send_consumed = reinterpret_cast<const uint64_t*>(region_ + consumed_off(q, c));
      l.recv_slots = region_ + inbox_off(q, c);
      l.recv_posted = reinterpret_cast<const uint64_t*>(region_ + posted_off(q, c));
      l.recv_consumed = reinterpret_cast<uint64_t*>(peer + consumed_off(rank_, c));
      l.peer_stop = reinterpret_cast<uint64_t*>(peer + stop_off(rank_));
      l.send_call = reinterpret_cast<uint64_t*>(peer + calls_off(rank_));
      l.recv_call = reinterpret_cast<const uint64_t*>(region_ + calls_off(q));
    }
  }
  return lanes;
}

uint64_t* CudaIpcMailboxes::stop_words() const { return reinterpret_cast<uint64_t*>(region_ + stop_off(0)); }

uint64_t* CudaIpcMailboxes::peer_stop_word(int q) const {
  if (q == rank_ || q >= static_cast<int>(peer_regions_.size()) || !peer_regions_[q]) return nullptr;
  return reinterpret_cast<uint64_t*>(peer_regions_[q] + stop_off(rank_));
}

void CudaIpcMailboxes::use_layout(uint64_t slot_bytes, uint32_t slots, uint32_t channels) {
  slot_bytes_ = slot_bytes;
  slots_ = slots;
  channels_ = channels;
  RT_CHECK(!region_ || region_bytes() <= allocated_bytes_, Error, "internal error: the agreed mailbox layout (",
           region_bytes(), " bytes) exceeds this rank's region (", allocated_bytes_, " bytes)");
}

void CudaIpcMailboxes::unmap_peers() {
  for (uint8_t* p : peer_regions_)
    if (p) (void)cudaIpcCloseMemHandle(p);
  peer_regions_.clear();
}

void CudaIpcMailboxes::release(bool keep) {
  if (region_ && !keep) (void)cudaFree(region_);
  region_ = nullptr;
}

}  // namespace ringtree
