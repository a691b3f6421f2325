// The signal owner (signals.h).
//
// State: process-wide atomics, because a signal handler can reach nothing else. The handler reads
// the scope depths and the cleanup table and writes the stop flag, the remembered signal and the
// forwarded signal; everything it touches is a lock-free atomic or was written before the handler
// was installed (the original dispositions, written once under std::call_once, before the
// sigaction that installs the handler).
//
// Install: once, on the first registration or scope; both signals together. A signal ignored
// before strata keeps its original disposition recorded as SIG_IGN: the handler then treats it as
// ignored outside an InterruptScope (as before strata) and as "end now" on a second interrupt.
#include "base/signals.h"

#include <signal.h>
#include <unistd.h>

#include <mutex>

#include "base/logging.h"

namespace strata {
namespace {

constexpr int kMaxCleanups = 8;
std::atomic<void (*)()> g_cleanups[kMaxCleanups];
static_assert(std::atomic<void (*)()>::is_always_lock_free, "read by the signal handler");

std::atomic<int> g_interrupt_depth{0};
std::atomic<int> g_forward_depth{0};
std::atomic<bool> g_stop{false};
std::atomic<int> g_interrupt_signal{0};
std::atomic<int> g_forwarded{0};
std::atomic<bool> g_obey_ignored{false};  // TakeSignalsAtStart
static_assert(std::atomic<bool>::is_always_lock_free && std::atomic<int>::is_always_lock_free,
              "set by the signal handler");

struct sigaction g_original[2];  // SIGINT, SIGTERM before strata installed its handler
std::once_flag g_install_once;

int Index(int sig) { return sig == SIGINT ? 0 : 1; }

// Hands `sig` to the disposition it had before strata: blocked until the handler returns, then
// delivered to it (the default action ends the process).
void ReraiseToOriginal(int sig) {
  sigaction(sig, &g_original[Index(sig)], nullptr);
  raise(sig);
}

void OnSignal(int sig) {
  if (g_forward_depth.load() > 0) {
    g_forwarded.store(sig);
    return;
  }
  const bool ignored_before = g_original[Index(sig)].sa_handler == SIG_IGN;
  if (g_interrupt_depth.load() > 0) {
    if (!g_stop.exchange(true)) {  // the first: the command finishes what it is doing
      g_interrupt_signal.store(sig);
      return;
    }
    // The second: the user means it. A signal ignored before strata (a background job of a
    // script inherits SIGINT ignored) ends the process with 128 + N.
    RunSignalCleanups();
    if (ignored_before) _exit(128 + sig);
    ReraiseToOriginal(sig);
    return;
  }
  if (ignored_before && !g_obey_ignored.load()) return;  // as before strata
  RunSignalCleanups();
  if (ignored_before) _exit(128 + sig);
  ReraiseToOriginal(sig);
}

void Install() {
  std::call_once(g_install_once, [] {
    for (int sig : {SIGINT, SIGTERM}) {
      struct sigaction sa {};
      sa.sa_handler = OnSignal;
      sigemptyset(&sa.sa_mask);
      sa.sa_flags = 0;  // no SA_RESTART: a blocking call sees EINTR and its loop checks the flag
      sigaction(sig, &sa, &g_original[Index(sig)]);
    }
  });
}

}  // namespace

void RegisterSignalCleanup(void (*cleanup)()) {
  Install();
  for (std::atomic<void (*)()>& slot : g_cleanups) {
    void (*expected)() = nullptr;
    if (slot.load() == cleanup) return;
    if (slot.compare_exchange_strong(expected, cleanup)) return;
    if (expected == cleanup) return;
  }
  STRATA_CHECK(false) << "more than " << kMaxCleanups << " signal cleanups registered";
}

void TakeSignalsAtStart() {
  g_obey_ignored.store(true);
  Install();
}

void RunSignalCleanups() {
  for (std::atomic<void (*)()>& slot : g_cleanups) {
    if (void (*cleanup)() = slot.load(); cleanup != nullptr) cleanup();
  }
}

InterruptScope::InterruptScope() {
  Install();
  if (g_interrupt_depth.load() == 0) {
    g_stop.store(false);
    g_interrupt_signal.store(0);
  }
  g_interrupt_depth.fetch_add(1);
}

InterruptScope::~InterruptScope() { g_interrupt_depth.fetch_sub(1); }

const std::atomic<bool>* InterruptFlag() { return &g_stop; }

int InterruptSignal() { return g_interrupt_signal.load(); }

ForwardScope::ForwardScope() {
  Install();
  if (g_forward_depth.load() == 0) g_forwarded.store(0);
  g_forward_depth.fetch_add(1);
}

ForwardScope::~ForwardScope() { g_forward_depth.fetch_sub(1); }

int TakeForwardedSignal() { return g_forwarded.exchange(0); }

void IgnoreBrokenPipes() { ::signal(SIGPIPE, SIG_IGN); }

}  // namespace strata
