// One exception hierarchy for the whole runtime; the bindings map it class-for-class to Python.
#pragma once
#include <stdexcept>
#include <string>

namespace ringtree {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
// Bad arguments: raised before any traffic, the communicator stays usable.
class InvalidArgument : public Error { public: using Error::Error; };
// A deadline passed while waiting for a peer.
class Timeout : public Error { public: using Error::Error; };
// A peer process died or its connection broke.
class PeerFailure : public Error { public: using Error::Error; };
// Ranks called different collectives, or the same one with different arguments.
class CollectiveMismatch : public Error { public: using Error::Error; };
// The communicator was aborted (by an earlier error or by close()) and cannot run collectives.
class Aborted : public Error { public: using Error::Error; };
// Setting up the job failed: bad unique id, wrong rank/size, authentication.
class BootstrapError : public Error { public: using Error::Error; };

}  // namespace ringtree
