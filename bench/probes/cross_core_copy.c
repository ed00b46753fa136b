// Where do this machine's two cores sit relative to each other, and what does that do to a
// shared-memory ring? Two processes on CPUs A and B (default 0 and 1):
//   pingpong_ns        round trip of one cache line between them (~50 ns: one core complex,
//                      ~350 ns: two, on the EPYC VM of bench/RESULTS.md)
//   ring_plain_GBps    256 KiB pieces through a 1 MiB ring, written with memcpy
//   ring_stream_GBps   the same, written with streaming stores (what RINGTREE_SHM_STREAM_STORES
//                      chooses when plain copies measure slow)
//   ring_*_read_GBps   the reader's copy-out rate alone
// Build and run:  cc -O2 -mavx512f -o /tmp/cross_core_copy bench/probes/cross_core_copy.c
//                 for i in $(seq 10); do /tmp/cross_core_copy; sleep 5; done
#define _GNU_SOURCE
#include <immintrin.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { kPiece = 256 << 10, kSlots = 4, kTotal = 64 << 20, kPingPongs = 20000 };

struct control {
  _Atomic long ping __attribute__((aligned(64)));
  _Atomic long head __attribute__((aligned(64)));
  _Atomic long tail __attribute__((aligned(64)));
  _Atomic long go __attribute__((aligned(64)));
};

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static void stream_copy(char* d, const char* s, size_t n) {
  for (size_t i = 0; i < n; i += 64) _mm512_stream_si512((void*)(d + i), _mm512_loadu_si512((const void*)(s + i)));
  _mm_sfence();
}

static void pin(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (sched_setaffinity(0, sizeof set, &set) != 0) perror("sched_setaffinity");
}

int main(int argc, char** argv) {
  const int cpu_writer = argc > 1 ? atoi(argv[1]) : 0, cpu_reader = argc > 2 ? atoi(argv[2]) : 1;
  struct control* ctl = mmap(0, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  char* ring = mmap(0, (size_t)kPiece * kSlots, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  memset(ring, 0, (size_t)kPiece * kSlots);
  const pid_t child = fork();
  const int writer = child != 0;
  pin(writer ? cpu_writer : cpu_reader);
  char* buf = aligned_alloc(4096, 16 << 20);
  memset(buf, writer ? 1 : 2, 16 << 20);

  if (writer) {
    const double t = now();
    for (long i = 0; i < kPingPongs; i++) {
      atomic_store(&ctl->ping, 2 * i + 1);
      while (atomic_load(&ctl->ping) != 2 * i + 2) {}
    }
    printf("pingpong_ns %.0f\n", (now() - t) / kPingPongs * 1e9);
  } else {
    for (long i = 0; i < kPingPongs; i++) {
      while (atomic_load(&ctl->ping) != 2 * i + 1) {}
      atomic_store(&ctl->ping, 2 * i + 2);
    }
  }
  for (int round = 0; round < 4; round++) {  // plain, plain, stream, stream: the first of each warms up
    const int streaming = round >= 2, report = round % 2;
    if (writer) {
      atomic_store(&ctl->head, 0);
      atomic_store(&ctl->tail, 0);
      atomic_store(&ctl->go, 2 * round + 1);
      while (atomic_load(&ctl->go) != 2 * round + 2) {}
    } else {
      while (atomic_load(&ctl->go) != 2 * round + 1) {}
      atomic_store(&ctl->go, 2 * round + 2);
    }
    const long pieces = kTotal / kPiece;
    const double t = now();
    double busy = 0;
    for (long i = 0; i < pieces; i++) {
      char* slot = ring + (i % kSlots) * (size_t)kPiece;
      if (writer) {
        while (i - atomic_load(&ctl->tail) >= kSlots) {}
        if (streaming) stream_copy(slot, buf, kPiece);
        else memcpy(slot, buf, kPiece);
        atomic_store(&ctl->head, i + 1);
      } else {
        while (atomic_load(&ctl->head) <= i) {}
        const double t0 = now();
        memcpy(buf + (i * (size_t)kPiece) % (16 << 20), slot, kPiece);
        busy += now() - t0;
        atomic_store(&ctl->tail, i + 1);
      }
    }
    if (writer) while (atomic_load(&ctl->tail) != pieces) {}
    if (report && writer) printf("ring_%s_GBps %.1f\n", streaming ? "stream" : "plain", kTotal / (now() - t) / 1e9);
    if (report && !writer) printf("ring_%s_read_GBps %.1f\n", streaming ? "stream" : "plain", kTotal / busy / 1e9);
    fflush(stdout);
  }
  if (!writer) _exit(0);
  waitpid(child, 0, 0);
  return 0;
}
