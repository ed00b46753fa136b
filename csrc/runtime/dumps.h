// Where flight-recorder dumps go, and the signal that asks every live communicator of this
// process for one (RINGTREE_DUMP_SIGNAL, SIGUSR1 by default; 0 turns it off). The signal handler
// only writes a byte to a pipe; a thread of its own writes the dumps, so a dump is taken even
// while every application thread is blocked inside a collective.
#pragma once
#include <functional>
#include <string>

namespace ringtree {

// RINGTREE_DUMP_DIR, or "" when automatic dumps are off.
std::string dump_dir_setting();
// Writes `json` to dir/name (making dir, 0700), atomically and privately (runtime/private_files.h:
// refused in a directory another user owns or may write; a symlink at the name is replaced, not
// followed); returns the path.
std::string write_dump_file(const std::string& dir, const std::string& name, const std::string& json);

// A live communicator's dump, as the signal thread asks for it: (file name, JSON).
using DumpSource = std::function<std::pair<std::string, std::string>(const std::string& reason)>;
// Registers a source until unregister_dump_source(handle); installs the signal handler the first
// time (unless the signal already has a handler other than the default).
int register_dump_source(DumpSource source);
void unregister_dump_source(int handle);

}  // namespace ringtree
