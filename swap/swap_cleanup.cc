// The cleanup registry (swap_cleanup.h). A slot's state: 0 free, 1 claimed (being filled), 2
// active (the handler may read it). Names are published by storing nfiles with release after the
// name's bytes; the handler loads nfiles with acquire.
#include "swap/swap_cleanup.h"

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "swap/run_dir.h"
#include "swap/swap_space.h"

namespace strata {
namespace {

constexpr int kMaxSlots = 64;
constexpr int kMaxFilesPerSlot = 32;
constexpr size_t kDirChars = 1024;
constexpr size_t kNameChars = 96;

struct CleanupSlot {
  std::atomic<int> state{0};  // 0 free, 1 claimed, 2 active
  std::atomic<bool> keep{false};
  std::atomic<pid_t> pid{0};
  std::atomic<int> nfiles{0};
  char dir[kDirChars];
  char files[kMaxFilesPerSlot][kNameChars];
};

CleanupSlot g_slots[kMaxSlots];

void UnlinkIn(const char* dir, size_t dlen, const char* name) {
  char path[kDirChars + kNameChars + 2];
  const size_t flen = strnlen(name, kNameChars - 1);
  std::memcpy(path, dir, dlen);
  path[dlen] = '/';
  std::memcpy(path + dlen + 1, name, flen);
  path[dlen + 1 + flen] = '\0';
  unlink(path);
}

void CleanSlot(CleanupSlot& s) {
  const size_t dlen = strnlen(s.dir, kDirChars - 1);
  const int n = s.nfiles.load(std::memory_order_acquire);
  for (int i = 0; i < n; ++i) UnlinkIn(s.dir, dlen, s.files[i]);
  UnlinkIn(s.dir, dlen, kRunLockFile);  // last: see the file comment
  rmdir(s.dir);
}

void CleanAllSlots() {
  const pid_t me = getpid();
  for (CleanupSlot& s : g_slots) {
    if (s.state.load(std::memory_order_acquire) == 2 && s.pid.load() == me &&
        !s.keep.load(std::memory_order_acquire)) {
      CleanSlot(s);
    }
  }
}

}  // namespace

void RemoveSwapFilesForSignal() { CleanAllSlots(); }

void RemoveCleanupFilesAtExit() {
  static std::once_flag once;
  std::call_once(once, [] { std::atexit(CleanAllSlots); });
}

int ClaimCleanupSlot(const std::string& dir) {
  if (dir.size() >= kDirChars) return -1;
  for (int i = 0; i < kMaxSlots; ++i) {
    int expected = 0;
    if (g_slots[i].state.compare_exchange_strong(expected, 1)) {
      CleanupSlot& s = g_slots[i];
      std::memcpy(s.dir, dir.c_str(), dir.size() + 1);
      s.nfiles.store(0);
      s.keep.store(false);
      s.pid.store(getpid());
      s.state.store(2, std::memory_order_release);
      return i;
    }
  }
  return -1;
}

void AddCleanupFile(int slot, const std::string& name) {
  if (slot < 0 || name.size() >= kNameChars) return;
  CleanupSlot& s = g_slots[slot];
  const int n = s.nfiles.load();
  if (n >= kMaxFilesPerSlot) return;
  std::memcpy(s.files[n], name.c_str(), name.size() + 1);
  s.nfiles.store(n + 1, std::memory_order_release);
}

void SetCleanupKeep(int slot, bool keep) {
  if (slot >= 0) g_slots[slot].keep.store(keep, std::memory_order_release);
}

void ReleaseCleanupSlot(int slot) {
  if (slot >= 0) g_slots[slot].state.store(0, std::memory_order_release);
}

}  // namespace strata
