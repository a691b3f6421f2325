// Text for a terminal of a given width: what `strata train` shows while it runs (train_command.cc).
//
//   const int cols = TerminalColumns(STDERR_FILENO);                 // ioctl, $COLUMNS, 80
//   std::string bar = FitProgressLine({{"41/120", 0}, {"loss 2.34", 0}, {"12 tok/s", 1}},
//                                     41.0 / 120, cols);             // at most cols - 1 columns
//   std::string lines = WrapSegments({"step 40", "loss 2.3", ...}, cols, "  ");
//
// A progress line is redrawn in place ("\r" ... "\x1b[K"): it must fit in one terminal row, or
// the terminal wraps it and every redraw leaves the wrapped part behind. FitProgressLine keeps
// the fields of the lowest priority numbers that fit (0 first) and a bar in the room left.
//
// InterruptNotice says, the moment Ctrl-C is pressed, what the run does next; the command tells it
// the phase and the step in progress. Its thread polls the stop flag (a signal handler may only
// set the flag: printing from it is not async-signal-safe).
//
// Threads: the functions are pure (TerminalColumns reads the terminal and the environment).
// InterruptNotice's setters may be called from any thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace strata::runtime {

// The width of the terminal `fd` is on (TIOCGWINSZ); else $COLUMNS if it is a number >= 1; else 80.
int TerminalColumns(int fd);

// "4:05" under an hour, "1:02:03" from an hour on; "-" for a negative or non-finite time.
std::string FormatDuration(double seconds);

struct LineField {
  std::string text;
  int priority = 0;  // 0: always shown; higher numbers are dropped first as the width shrinks
};

// One line of at most `columns` - 1 characters (the last column stays free: a terminal that wraps
// on writing it would push the cursor to the next row): "[####....] " then the fields, in their
// order, separated by two spaces. The fields whose priority is above the largest that fits are
// left out; the bar (`fraction` done, 0..1) takes the room that remains, up to 24 cells, and goes
// when fewer than 6 remain. Priority-0 fields that do not fit alone are cut at the width.
std::string FitProgressLine(const std::vector<LineField>& fields, double fraction, int columns);

// `segments` joined by `separator` into lines of at most `columns` characters; a segment that does
// not fit on the current line starts a new one, after `indent`. A segment longer than a whole line
// gets a line of its own (not cut). No trailing newline.
std::string WrapSegments(const std::vector<std::string>& segments, int columns,
                         const std::string& indent, const std::string& separator = "  ");

// The expected time to the end of a run: steps left × the mean wall time of the last `window`
// steps (the time between successive reports, so saves and evaluations count).
class EtaEstimator {
 public:
  explicit EtaEstimator(int window = 20) : window_(window) {}
  // The run's elapsed seconds when `step` finished.
  void Add(int64_t step, double elapsed_seconds);
  // Seconds until `steps` are done; negative when unknown (fewer than one interval seen).
  double SecondsLeft(int64_t steps) const;

 private:
  const int window_;
  int64_t last_step_ = -1;
  double last_elapsed_ = 0;
  std::deque<double> per_step_;  // seconds per step of the last intervals
};

// Watches the stop flag and logs (a warning, once) what the run does after the first Ctrl-C:
//   set-up:    "interrupted during set-up: stopping after the current stage (...) — ..."
//   training:  "interrupted: finishing step 41, then saving to ck/ — Ctrl-C again to stop now"
//   finishing: "interrupted: finishing the save to ck/ — ..."
// `save_dir` empty: "... then stopping". A disabled notice (ranks other than 0) says nothing.
// Its thread looks every 100 ms; the command also calls Poll where the trainer is about to look
// at the flag itself (after each step, when Run returns), so that a step shorter than that is
// still named right.
class InterruptNotice {
 public:
  enum class Phase : int { kSetUp, kTraining, kFinishing };
  // Starts the watching thread when `enabled`. `stop` outlives this object.
  InterruptNotice(const std::atomic<bool>* stop, std::string save_dir, bool enabled);
  ~InterruptNotice();  // stops and joins the thread
  InterruptNotice(const InterruptNotice&) = delete;
  InterruptNotice& operator=(const InterruptNotice&) = delete;

  void set_phase(Phase phase) { phase_.store(static_cast<int>(phase)); }
  // The step the run finishes before it stops: the one in progress, or the one just done while
  // the run has not yet looked at the stop flag.
  void set_step(int64_t step) { step_.store(step); }
  // Logs the message if the flag is set and it was not said yet.
  void Poll();
  // The message for the current phase and step (what Poll logs; tests read it).
  std::string Message() const;

 private:
  void Watch();

  const std::atomic<bool>* stop_;
  const std::string save_dir_;
  std::atomic<int> phase_{static_cast<int>(Phase::kSetUp)};
  std::atomic<int64_t> step_{1};
  std::atomic<bool> said_{false};
  const bool enabled_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;  // guarded by mu_
  std::thread thread_;
};

}  // namespace strata::runtime
