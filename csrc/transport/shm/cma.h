// Single-copy transfers between processes on one host (cross-memory attach, CMA).
//
// A shared-memory sender normally copies a message into the receiver's ring and the receiver
// copies it out again: two passes over memory. For a large message the sender instead puts only
// the header into the ring, marked as single-copy and carrying the payload's address in the
// sender; the receiver copies the payload straight out of the sender's memory with
// process_vm_readv and only then consumes the header, which is the sender's acknowledgement:
// its send (and so its call) is not complete, and its buffer not released, before the receiver
// has read every byte. A call that fails returns without it: it first marks its rings to those
// peers withdrawn (ShmRing::withdrawn), and a receiver that sees the mark after its read raises
// rather than return what the caller may have put in the buffer since.
//
// The kernel allows it only where the receiver may ptrace the sender (Yama's ptrace_scope,
// seccomp profiles of containers, different pid namespaces), so every rank tries it on a probe
// word of each peer on its host during set-up, and the ranks of a host use it only if every one
// of them succeeded.
#pragma once
#include <sys/types.h>
#include <cstdint>
#include <optional>
#include <string>

namespace ringtree {

// MsgHeader::reserved[1] of a single-copy message; reserved[0] holds the payload's address.
constexpr uint64_t kSingleCopyMarker = 0x434d413150415932ull;

// Probe verdicts besides 0 (the peer's word was read and matched) and an errno value.
constexpr int32_t kCmaVerdictPending = -1;    // not probed yet
constexpr int32_t kCmaVerdictOff = -2;        // RINGTREE_CMA=0 on this rank
constexpr int32_t kCmaVerdictMismatch = -3;   // read something, but not the peer's probe word
constexpr int32_t kCmaVerdictSimulated = -4;  // the test hook RINGTREE_TEST_CMA_PROBE_FAIL

// Reads the 8-byte word at `addr` in process `pid` and compares it with `expected`: 0 when it
// matches, else a verdict above.
int32_t cma_probe(pid_t pid, uint64_t addr, uint64_t expected);

// Copies `bytes` from `remote` in process `pid` to `local`; returns the bytes copied (a partial
// read is possible at a page boundary; call again for the rest). Throws PeerFailure when the
// process is gone, Error otherwise; `peer` names the rank in the message.
uint64_t cma_read(pid_t pid, void* local, uint64_t remote, uint64_t bytes, int peer);

// Whether this process's memory [p, p + bytes) lies at least half on huge pages, as the kernel's
// page-table scan (PAGEMAP_SCAN, Linux 6.7+) reports it in about a microsecond (it stops once
// the answer is no). process_vm_readv pins every page it reads: at P=2 on the 2-core VM measured,
// from 4 KiB pages all_gather and all_to_all of 2-32 MiB ran 1.2-1.7x and broadcast 3.2-3.6x slower
// than through the ring; from huge pages as fast or faster. An array numpy or torch allocates
// starts anywhere in a huge page, so up to its first 2 MiB lie on small pages; all_gather blocks
// with their first half on small pages read single-copy against the ring: 1.1-1.2x faster at P=2
// from 4 MiB blocks, 1.1-1.3x at P=4 from 1-2 MiB ones, 1.1x slower at P=2 from 2 MiB ones.
// Where the scan is not available: no answer (a sender then reads single-copy, as before).
std::optional<bool> cma_source_on_huge_pages(const void* p, uint64_t bytes);
// Whether a buffer of this process may lie on transparent huge pages: the kernel's setting is not
// "never" (false where the kernel has none).
bool transparent_huge_pages_possible();

// "Operation not permitted (ptrace_scope 1)" and the like, for a verdict.
std::string cma_verdict_text(int32_t verdict);

}  // namespace ringtree
