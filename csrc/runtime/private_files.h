// Files a rank writes or reads where other users may be (dump directories, the machine probe's
// cache), made so that nobody else can read them, plant them or redirect them:
//   - a directory is made with mode 0700 and used only if it belongs to this user and nobody
//     else may write in it (a symlink to it must be this user's or root's);
//   - a file is written to a fresh temporary name, created exclusively, mode 0600, never through
//     a symlink, then renamed over its name: a symlink planted at the name is replaced, not
//     followed, and readers never see half a file;
//   - a file is read only if it is a regular file of this user's that nobody else may write.
#pragma once
#include <cstddef>
#include <string>

namespace ringtree {

// Makes `dir` (and missing parents, each 0700) and checks it; throws InvalidArgument saying
// what is wrong with it.
void ensure_private_dir(const std::string& dir);
// Writes `text` to dir/name as above (making dir); returns the path.
std::string write_private_file(const std::string& dir, const std::string& name, const std::string& text);
// The first max_bytes of a file that passes the checks above; false (with why) otherwise.
bool read_private_file(const std::string& path, size_t max_bytes, std::string& text, std::string* why = nullptr);

}  // namespace ringtree
