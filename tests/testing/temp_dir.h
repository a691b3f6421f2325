// TempDir: a fresh directory for one test, removed with everything in it when the test ends.
//
// It lives under $TMPDIR (or /tmp), so CI can point the I/O tests at a real disk. Creation can
// fail (a full or read-only $TMPDIR); tests check ok() first. Mount() puts a small filesystem on
// the directory to provoke ENOSPC; it needs root (or CAP_SYS_ADMIN), so callers skip without it.
//
// Thread-safety: a TempDir is owned by one test; its accessors are const and may be read from any
// thread.
#pragma once

#include <sys/mount.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>

namespace strata::testing {

class TempDir {
 public:
  // `prefix` names the directory (handy when a failing test leaves one behind, e.g. under -k).
  explicit TempDir(std::string_view prefix = "strata-test") {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base != nullptr && base[0] != '\0' ? base : "/tmp") + "/" +
                       std::string(prefix) + "-XXXXXX";
    if (::mkdtemp(tmpl.data()) != nullptr) path_ = tmpl;
  }
  ~TempDir() {
    if (mounted_) ::umount2(path_.c_str(), MNT_DETACH);
    std::error_code ec;  // best effort: a test that failed half-way may have left anything
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  bool ok() const { return !path_.empty(); }
  const std::string& path() const { return path_; }
  // `path()`/`name`.
  std::string File(std::string_view name) const { return path_ + "/" + std::string(name); }

  // Mounts a filesystem of `type` ("tmpfs", "ramfs") with `data` (e.g. "size=8m") on this
  // directory. Returns an empty string on success, else why not (the caller skips).
  std::string Mount(const char* type, const char* data) {
    if (::mount("strata-test", path_.c_str(), type, 0, data) != 0) {
      return std::string("cannot mount ") + type + " (" + std::strerror(errno) +
             "); needs root or CAP_SYS_ADMIN";
    }
    mounted_ = true;
    return "";
  }

 private:
  std::string path_;
  bool mounted_ = false;
};

}  // namespace strata::testing
