// The set-up's crypto primitives (for the tests, against Python's hashlib and hmac) and the
// private file writing that dumps use (for Communicator.dump).
#include <pybind11/pybind11.h>

#include <string>
#include "bindings/bindings.h"
#include "bootstrap/crypto.h"
#include "runtime/private_files.h"

namespace py = pybind11;

namespace ringtree {

namespace {

py::bytes digest_bytes(const crypto::Digest& d) { return py::bytes(reinterpret_cast<const char*>(d.data()), d.size()); }

}  // namespace

void register_security(py::module_& m) {
  m.def(
      "_sha256", [](const std::string& data) { return digest_bytes(crypto::sha256(data.data(), data.size())); },
      py::arg("data"), "SHA-256 of bytes, as the set-up computes it (for tests).");
  m.def(
      "_hmac_sha256",
      [](const std::string& key, const std::string& data) {
        return digest_bytes(crypto::HmacKey(key.data(), key.size()).mac(data.data(), data.size()));
      },
      py::arg("key"), py::arg("data"), "HMAC-SHA256, as the set-up computes it (for tests).");
  m.def(
      "_pbkdf2_sha256",
      [](const std::string& password, const std::string& salt, uint32_t iterations, size_t out_bytes) {
        std::string out(out_bytes, '\0');
        {
          py::gil_scoped_release release;
          crypto::pbkdf2_sha256(password.data(), password.size(), salt.data(), salt.size(), iterations,
                                reinterpret_cast<uint8_t*>(out.data()), out.size());
        }
        return py::bytes(out);
      },
      py::arg("password"), py::arg("salt"), py::arg("iterations"), py::arg("out_bytes"),
      "PBKDF2-HMAC-SHA256, as UniqueId.from_seed stretches a seed (for tests).");
  m.def("write_private_file", &write_private_file, py::arg("dir"), py::arg("name"), py::arg("text"),
        py::call_guard<py::gil_scoped_release>(),
        "Write text to dir/name as dumps are written: dir made 0700 and refused if another user owns it or may "
        "write in it; a fresh exclusive 0600 file renamed over the name (a symlink there is replaced, not "
        "followed). Returns the path.");
}

}  // namespace ringtree
