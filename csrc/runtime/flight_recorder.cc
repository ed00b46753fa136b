#include "runtime/flight_recorder.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include "common/check.h"
#include "common/clock.h"

namespace ringtree {

namespace {

const char* state_name(uint8_t s) {
  static const char* names[] = {"queued", "running", "done", "failed"};
  return s < 4 ? names[s] : "unknown";
}

}  // namespace

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (const char ch : s) {
    const unsigned char c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

namespace {

std::string int_list(const std::vector<int>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += str_cat(i ? "," : "", v[i]);
  return out + "]";
}

std::string time_or_null(int64_t t) { return t ? std::to_string(t) : "null"; }

}  // namespace

// A (tick, ns) pair read together. A thread preempted between the two reads would shift every
// stamp mapped through the pair by the time it was away (microseconds to milliseconds on a busy
// machine, enough to put a rank's call on the wrong side of its peers'); so the pair is read
// between two tick reads, a few times, and the tightest bracket wins.
void FlightRecorder::paired_now(int64_t* tick, int64_t* ns) {
  int64_t best_width = INT64_MAX;
  for (int attempt = 0; attempt < 5; ++attempt) {
    const int64_t before = ticks(), n = now_ns(), after = ticks();
    if (after - before < best_width) {
      best_width = after - before;
      *tick = before + (after - before) / 2;
      *ns = n;
    }
  }
}

FlightRecorder::FlightRecorder(size_t capacity) : slots_(capacity), errors_(new std::array<char, 240>[capacity]) {
  paired_now(&origin_ticks_, &origin_ns_);
}

int64_t FlightRecorder::now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int64_t FlightRecorder::ticks() { return ringtree::ticks(); }

int64_t FlightRecorder::to_ns(int64_t t, int64_t now_ticks, int64_t now) const {
  if (!t) return 0;
  if (!invariant_tsc() || now_ticks == origin_ticks_) return t;  // ticks are ns already
  const double ns_per_tick = static_cast<double>(now - origin_ns_) / static_cast<double>(now_ticks - origin_ticks_);
  return now + static_cast<int64_t>(static_cast<double>(t - now_ticks) * ns_per_tick);
}

CallRecord* FlightRecorder::slot_of(uint64_t id) {
  CallRecord& r = slots_[(id - 1) % slots_.size()];
  // A call that outlived its slot (more than N calls queued behind it) is no longer recorded.
  return r.id.load(std::memory_order_relaxed) == id ? &r : nullptr;
}

uint64_t FlightRecorder::open(Collective coll, DataType dtype, ReduceOp op, Algo algo, int root, int peer,
                              int recv_peer, uint64_t count, int64_t label, uint64_t seq, uint64_t recv_seq) {
  if (slots_.empty()) return 0;  // the recorder is off
  const uint64_t id = next_id_.load(std::memory_order_relaxed) + 1;
  next_id_.store(id, std::memory_order_relaxed);
  CallRecord& r = slots_[(id - 1) % slots_.size()];
  r.id.store(0, std::memory_order_relaxed);  // a dump skips the slot while it is rewritten
  std::atomic_thread_fence(std::memory_order_release);
  r.seq = seq;
  r.recv_seq = recv_seq;
  r.coll = coll;
  r.dtype = dtype;
  r.op = op;
  r.algo = algo;
  r.root = root;
  r.peer = peer;
  r.recv_peer = recv_peer;
  r.count = count;
  r.label = label;
  r.enqueued = ticks();
  r.started = r.ended = 0;
  r.state.store(static_cast<uint8_t>(CallState::Queued), std::memory_order_relaxed);
  r.id.store(id, std::memory_order_release);
  return id;
}

void FlightRecorder::started(uint64_t id, bool at_enqueue) {
  if (!id) return;
  running_.store(id, std::memory_order_relaxed);
  if (CallRecord* r = slot_of(id)) {
    r->started = at_enqueue ? r->enqueued : ticks();
    r->state.store(static_cast<uint8_t>(CallState::Running), std::memory_order_release);
  }
}

void FlightRecorder::set_algo(uint64_t id, Algo algo) {
  if (CallRecord* r = id ? slot_of(id) : nullptr) r->algo = algo;
}

void FlightRecorder::finished(uint64_t id, const Error* error) {
  if (!id) return;
  running_.store(0, std::memory_order_relaxed);
  CallRecord* r = slot_of(id);
  if (!r) return;
  r->ended = ticks();
  if (!r->started) r->started = r->ended;  // refused before it started
  if (error) {
    r->error_kind = error->kind();
    std::array<char, 240>& text = errors_[(id - 1) % slots_.size()];
    std::strncpy(text.data(), error->what(), text.size() - 1);
    text.back() = '\0';
  }
  r->state.store(static_cast<uint8_t>(error ? CallState::Failed : CallState::Done), std::memory_order_release);
}

std::string FlightRecorder::calls_json(const std::vector<int>& waiting_sends,
                                       const std::vector<int>& waiting_recvs) const {
  if (slots_.empty()) return "[]";
  const uint64_t last = recorded();
  const uint64_t first = last > slots_.size() ? last - slots_.size() + 1 : 1;
  const uint64_t running = running_.load(std::memory_order_relaxed);
  int64_t now_t = 0, now = 0;
  paired_now(&now_t, &now);
  auto stamp = [&](int64_t t) { return time_or_null(to_ns(t, now_t, now)); };
  std::string out = "[";
  bool any = false;
  for (uint64_t id = first; id <= last && id > 0; ++id) {
    const CallRecord& r = slots_[(id - 1) % slots_.size()];
    if (r.id.load(std::memory_order_acquire) != id) continue;
    const uint8_t state = r.state.load(std::memory_order_acquire);
    out += any ? ",\n  " : "\n  ";
    any = true;
    out += str_cat("{\"id\": ", id, ", \"seq\": ", r.seq, ", \"recv_seq\": ", r.recv_seq,
                   ", \"coll\": ", json_string(collective_name(r.coll)), ", \"count\": ", r.count,
                   ", \"dtype\": ", json_string(dtype_name(r.dtype)),
                   ", \"op\": ", is_reduction(r.coll) ? json_string(op_name(r.op)) : std::string("null"),
                   ", \"algo\": ", json_string(algo_name(r.algo)), ", \"root\": ", r.root, ", \"peer\": ", r.peer,
                   ", \"recv_peer\": ", r.recv_peer, ", \"bytes\": ", r.count * dtype_size(r.dtype),
                   ", \"label\": ", r.label, ", \"state\": ", json_string(state_name(state)),
                   ", \"enqueued_ns\": ", stamp(r.enqueued), ", \"started_ns\": ", stamp(r.started),
                   ", \"ended_ns\": ", stamp(r.ended));
    if (state == static_cast<uint8_t>(CallState::Failed))
      out += str_cat(", \"error_kind\": ", json_string(error_kind_name(r.error_kind)),
                     ", \"error\": ", json_string(errors_[(id - 1) % slots_.size()].data()));
    else
      out += ", \"error_kind\": null, \"error\": null";
    if (id == running && state == static_cast<uint8_t>(CallState::Running))
      out += str_cat(", \"waiting_on\": {\"send\": ", int_list(waiting_sends), ", \"recv\": ", int_list(waiting_recvs),
                     "}");
    out += "}";
  }
  return out + (any ? "\n]" : "]");
}

}  // namespace ringtree
