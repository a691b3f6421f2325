// Helpers for the swap/ tests: temporary directories, test files, patterns, small mounts.
#pragma once

#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>

#include "swap/direct_io.h"

namespace strata::testing {

// A fresh directory under $TMPDIR (or /tmp), removed with its contents on destruction.
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base != nullptr && base[0] != '\0' ? base : "/tmp") +
                       "/strata-swap-test-XXXXXX";
    char* made = mkdtemp(tmpl.data());
    if (made != nullptr) path_ = made;
  }
  ~TempDir() {
    if (mounted_) umount2(path_.c_str(), MNT_DETACH);
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  bool ok() const { return !path_.empty(); }
  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

  // Mounts a filesystem of `type` ("tmpfs", "ramfs") with `data` (e.g. "size=8m") on this
  // directory. Returns an empty string on success, else why not (the caller skips).
  std::string Mount(const char* type, const char* data) {
    if (mount("strata-test", path_.c_str(), type, 0, data) != 0) {
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

// Fills `n` bytes at `p` with a pattern that depends on the position and `seed`.
inline void FillPattern(std::byte* p, size_t n, uint64_t seed) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < n; ++i) {
    if (i % 8 == 0) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
    }
    p[i] = static_cast<std::byte>(x >> ((i % 8) * 8));
  }
}

}  // namespace strata::testing
