// The one owner of SIGINT and SIGTERM in the process: nothing else in strata calls sigaction for
// them. Components register what must happen on a fatal signal (cleanups) or open a scope that
// changes what a signal means; the owner's handler decides, in one place, in this order:
//
//   a ForwardScope is open      (the `--nproc` launcher) the signal is recorded for the scope's
//                               loop to forward to the ranks (TakeForwardedSignal); nothing else.
//   an InterruptScope is open   (a command that can stop cleanly) the first signal sets the stop
//                               flag and is remembered (InterruptSignal); a second one runs the
//                               cleanups and ends the process with the signal's disposition from
//                               before strata (an ignored signal: _exit(128 + N)).
//   neither                     the cleanups run, then the signal's disposition from before strata
//                               takes over (the default action ends the process). A signal the
//                               process ignored before strata stays ignored (no cleanup either),
//                               unless the program took the signals at its start
//                               (TakeSignalsAtStart: the `strata` binary): then it too runs the
//                               cleanups and ends the process with 128 + N, so that a command is
//                               stopped by an interrupt at every moment, not only once it opened
//                               its InterruptScope (a script's `&` job inherits SIGINT ignored).
//
// Cleanups are async-signal-safe functions (e.g. the swap space's removal of its files), run in
// registration order. The handlers are installed on first use (a cleanup registered or a scope
// opened) and stay installed; the dispositions they replaced are what a fatal signal re-raises to.
//
//   RegisterSignalCleanup(&RemoveMyFiles);                 // once, from any thread
//   { InterruptScope scope;  while (!scope.stop_requested()) Work(); }
//
// Threads: registration and scopes from any thread (scopes nest; they are process-wide, not per
// thread); the handler touches only lock-free atomics, sigaction, raise and _exit.
#pragma once

#include <atomic>

namespace strata {

// Adds `cleanup` (async-signal-safe, idempotent) to what a fatal SIGINT/SIGTERM runs. Registering
// the same function again does nothing. At most 8 distinct cleanups (a CHECK).
void RegisterSignalCleanup(void (*cleanup)());

// Runs every registered cleanup now (async-signal-safe), e.g. before a deliberate _exit.
void RunSignalCleanups();

// For a program's main, first thing: installs the handlers now and obeys SIGINT/SIGTERM even where
// the process inherited them ignored (see the file comment). A signal sent before main runs
// (while the dynamic loader maps libtorch, ~0.3 s) meets the inherited disposition: an ignored one
// is discarded by the kernel, which nothing in the process can undo.
void TakeSignalsAtStart();

// While one is open, SIGINT/SIGTERM ask the process to stop (see the file comment). Opening the
// outermost one clears the stop flag and the remembered signal.
class InterruptScope {
 public:
  InterruptScope();
  ~InterruptScope();
  InterruptScope(const InterruptScope&) = delete;
  InterruptScope& operator=(const InterruptScope&) = delete;
};

// The flag the first signal under an InterruptScope sets: one per process (a signal handler can
// reach nothing else), valid for its life; any thread may poll it.
const std::atomic<bool>* InterruptFlag();
// The first signal received under the open scopes (SIGINT or SIGTERM), or 0.
int InterruptSignal();

// While one is open, SIGINT/SIGTERM are recorded for the scope's owner to forward (the launcher
// relays them to its ranks) instead of acting on this process.
class ForwardScope {
 public:
  ForwardScope();
  ~ForwardScope();
  ForwardScope(const ForwardScope&) = delete;
  ForwardScope& operator=(const ForwardScope&) = delete;
};
// The last signal recorded under a ForwardScope and not taken yet (then cleared), or 0.
int TakeForwardedSignal();

// SIGPIPE ignored from now on: a write to a socket whose peer is gone (a lost rank's Gloo or
// TCPStore connection) fails with EPIPE, which the caller reports naming the rank, instead of
// killing this process with no message. Python does this at start-up, so every PyTorch program
// runs so; a C++ program that opens connections to other ranks calls this first. Idempotent.
void IgnoreBrokenPipes();

}  // namespace strata
