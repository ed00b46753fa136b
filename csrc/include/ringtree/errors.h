// One exception hierarchy for the whole runtime. Every error carries one ErrorKind, which names
// its class one to one: executors record failures as a kind and a text, the control plane sends
// the kind to the peers, and the bindings map each kind to its Python class.
#pragma once
#include <cstdint>
#include <exception>
#include <stdexcept>
#include <string>

namespace ringtree {

enum class ErrorKind : uint8_t {
  Error,               // anything else: an internal or system error
  InvalidArgument,     // bad arguments: raised before any traffic, the communicator stays usable
  Timeout,             // a deadline passed while waiting for a peer
  PeerFailure,         // a peer process died, its connection broke, or it stopped on an error
  CollectiveMismatch,  // ranks called different collectives, or the same one with different arguments
  Aborted,             // the communicator was aborted (by an earlier error or by close())
  Bootstrap,           // setting up the job failed: bad unique id, wrong rank/size, authentication
  Count
};

// "error", "invalid_argument", "timeout", "peer_failure", "collective_mismatch", "aborted", "bootstrap".
const char* error_kind_name(ErrorKind k);

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : Error(ErrorKind::Error, what) {}
  ErrorKind kind() const { return kind_; }

 protected:
  Error(ErrorKind kind, const std::string& what) : std::runtime_error(what), kind_(kind) {}

 private:
  ErrorKind kind_;
};

#define RT_ERROR_CLASS(Name, Kind)                                           \
  class Name : public Error {                                                \
   public:                                                                   \
    explicit Name(const std::string& what) : Error(ErrorKind::Kind, what) {} \
  };
RT_ERROR_CLASS(InvalidArgument, InvalidArgument)
RT_ERROR_CLASS(Timeout, Timeout)
RT_ERROR_CLASS(PeerFailure, PeerFailure)
RT_ERROR_CLASS(CollectiveMismatch, CollectiveMismatch)
RT_ERROR_CLASS(Aborted, Aborted)
RT_ERROR_CLASS(BootstrapError, Bootstrap)
#undef RT_ERROR_CLASS

// Throws the class of `kind` with `what`.
[[noreturn]] void throw_error(ErrorKind kind, const std::string& what);
// The same, as an exception_ptr (for errors raised later, on another thread or call).
std::exception_ptr make_error(ErrorKind kind, const std::string& what);

}  // namespace ringtree
