#include "runtime/private_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include "bootstrap/crypto.h"
#include "common/check.h"

namespace ringtree {

namespace {

std::string mode_text(mode_t mode) {
  char buf[8];
  std::snprintf(buf, sizeof(buf), "%04o", static_cast<unsigned>(mode & 07777));
  return buf;
}

bool write_all(int fd, const char* p, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

}  // namespace

void ensure_private_dir(const std::string& dir) {
  RT_CHECK(!dir.empty(), InvalidArgument, "an empty directory name");
  for (size_t at = 1; at <= dir.size(); ++at) {
    if (at != dir.size() && dir[at] != '/') continue;
    const std::string part = dir.substr(0, at);
    if (mkdir(part.c_str(), 0700) != 0 && errno != EEXIST) throw_system_error("mkdir " + part, errno);
  }
  struct stat link{}, st{};
  if (lstat(dir.c_str(), &link) != 0) throw_system_error("lstat " + dir, errno);
  if (stat(dir.c_str(), &st) != 0) throw_system_error("stat " + dir, errno);
  const uid_t me = geteuid();
  RT_CHECK(S_ISDIR(st.st_mode), InvalidArgument, dir, " is not a directory");
  RT_CHECK(!S_ISLNK(link.st_mode) || link.st_uid == me || link.st_uid == 0, InvalidArgument, dir,
           " is a symlink that belongs to uid ", link.st_uid, ", not to this user (uid ", me,
           "): refusing to follow it; use a directory of your own");
  RT_CHECK(st.st_uid == me, InvalidArgument, "directory ", dir, " belongs to uid ", st.st_uid,
           ", not to this user (uid ", me, "): refusing to write there; use a directory of your own (it is made 0700)");
  RT_CHECK((st.st_mode & 022) == 0, InvalidArgument, "directory ", dir, " (mode ", mode_text(st.st_mode),
           ") is writable by other users, who could plant or replace files in it; use a directory only you can write "
           "(it is made 0700), or chmod go-w it");
}

std::string write_private_file(const std::string& dir, const std::string& name, const std::string& text) {
  RT_CHECK(!name.empty() && name.find('/') == std::string::npos, InvalidArgument, "bad file name '", name, "'");
  ensure_private_dir(dir);
  const std::string path = dir + "/" + name;
  uint8_t nonce[8];
  crypto::random_bytes(nonce, sizeof(nonce));
  const std::string tmp = str_cat(dir, "/.", name, ".", crypto::to_hex(nonce, sizeof(nonce)), ".tmp");
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) throw_system_error("create " + tmp, errno);
  const bool written = write_all(fd, text.data(), text.size());
  const int err = errno;
  if (::close(fd) != 0 || !written) {
    ::unlink(tmp.c_str());
    throw_system_error("write " + tmp, written ? errno : err);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    throw_system_error("rename " + tmp + " to " + path, e);
  }
  return path;
}

bool read_private_file(const std::string& path, size_t max_bytes, std::string& text, std::string* why) {
  auto refuse = [&](const std::string& reason) {
    if (why) *why = reason;
    return false;
  };
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return refuse(str_cat("cannot open ", path, ": ", std::strerror(errno)));
  struct stat st{};
  std::string reason;
  if (fstat(fd, &st) != 0)
    reason = str_cat("cannot stat ", path, ": ", std::strerror(errno));
  else if (!S_ISREG(st.st_mode))
    reason = str_cat(path, " is not a regular file");
  else if (st.st_uid != geteuid())
    reason = str_cat(path, " belongs to uid ", st.st_uid, ", not to this user");
  else if (st.st_mode & 022)
    reason = str_cat(path, " (mode ", mode_text(st.st_mode), ") is writable by other users");
  if (!reason.empty()) {
    ::close(fd);
    return refuse(reason);
  }
  text.assign(max_bytes, '\0');
  size_t got = 0;
  while (got < max_bytes) {
    const ssize_t n = ::read(fd, text.data() + got, max_bytes - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  text.resize(got);
  return true;
}

}  // namespace ringtree
