// The one framework every `strata` subcommand is written against (runtime/ and bench/ alike), so
// that flags, output, errors, exit codes and Ctrl-C behave the same in all of them.
//
// A command is a class: its flags are members bound in AddFlags, Run does the work and returns a
// Status, and the result is one JSON object that Run fills. The framework then prints it: with
// --json as that object (pretty-printed, on stdout), otherwise through the command's PrintText.
// So the human text can never say something the JSON does not, and a command never formats its
// own errors. A command that reports while it runs (`strata train`: a progress bar, a line every
// few steps) says so with has_json() == false, prints from Run and leaves the result empty.
//
//   class HelloCommand final : public Command {
//    public:
//     HelloCommand() : Command("hello", "Greets") {}
//     void AddFlags(CLI::App& cmd) override { cmd.add_option("--who", who_, "Whom to greet"); }
//     Status Run(CommandContext&, nlohmann::json& result) override {
//       if (who_.empty()) return InvalidArgumentError("--who is empty");  // exit code 2
//       result["greeting"] = "hello " + who_;
//       return Status::Ok();
//     }
//     void PrintText(const nlohmann::json& r, std::FILE* out) const override {
//       std::fprintf(out, "%s\n", r["greeting"].get<std::string>().c_str());
//     }
//    private:
//     std::string who_ = "world";
//   };
//
//   CommandLine cli("strata: ...", "strata 0.1");   // tools/strata/main.cc
//   cli.AddGroup("bench", "Measure one part of the machine or of strata");
//   cli.Add(std::make_unique<HelloCommand>());           // strata hello
//   cli.Add(NewBenchIoCommand(), "bench");                // strata bench io
//   return cli.Run(argc, argv);
//
// Exit codes (ExitCode): 0 success; 2 bad input: a command line CLI11 refuses (unknown flag or
// command, bad or missing value, missing subcommand or required flag) or a Status of
// kInvalidArgument or kNotFound; 128 + the signal when interrupted (kCancelled after SIGINT: 130,
// SIGTERM: 143; 130 without a signal); 1 every other failure, including an exception escaping Run
// (reported as kInternal, never std::terminate). A failure prints one line on stderr,
// "strata <command path>: <Status>", e.g.
// "strata bench io: invalid_argument: --path /x is not an existing directory"; kCancelled prints
// nothing (the command has already said it stopped). A refused command line prints one line of
// the same shape, naming the command the mistake is in, with the closest spellings
// (suggest.h) or where to look:
//   strata train: unknown flag --stpes (did you mean --steps?)
//   strata: unknown command trian (did you mean train?)
//   strata bench: missing command: one of io, adam or tiers (see strata bench --help)
//   strata train: --steps: 'abc' is not a whole number      ("is not a number": a float flag)
//   strata train: --nproc: 0 is not in range 1 to 1024      (a validator's message, flag_checks.h)
//   strata train: --steps: missing its value
//   strata eval: --data is required
// With --json nothing is printed on stdout when the command fails. --help and --version exit 0.
//
// Ctrl-C: a command that can stop cleanly calls CommandContext::CatchInterrupts once it is ready
// to, then polls stop_requested() (or hands stop_flag() to a loop, as train does to its Trainer).
// From then on the first SIGINT or SIGTERM only sets the flag; a second one removes the swap files
// and ends the process at once (base/signals.h, the process's one owner of those signals, decides
// both). The scope ends when Run returns. Commands that never call CatchInterrupts keep the
// default: Ctrl-C ends them (after the registered cleanups).
//
// Threads: CommandLine and the commands are used from the main thread only; stop_flag() may be
// read from any thread.
#pragma once

#include <atomic>
#include <cstdio>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/signals.h"
#include "base/status.h"

namespace CLI {
class App;
}

namespace strata::runtime {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailed = 1;
inline constexpr int kExitBadInput = 2;
inline constexpr int kExitInterrupted = 130;  // 128 + SIGINT, what a shell reports for Ctrl-C

// The process exit code for a command that returned `status` (see the file comment).
int ExitCode(const Status& status);

// What Run may ask of the framework. Made by CommandLine for one run of one command.
class CommandContext {
 public:
  explicit CommandContext(bool json) : json_(json) {}
  CommandContext(const CommandContext&) = delete;
  CommandContext& operator=(const CommandContext&) = delete;
  ~CommandContext();  // closes the interrupt scope CatchInterrupts opened

  // --json was given: the result is printed as JSON (a command may skip work only text needs).
  bool json() const { return json_; }

  // From now on SIGINT/SIGTERM set the stop flag instead of ending the process (a second one
  // ends it). Call it as early as a command can stop cleanly; calling it again changes nothing
  // (and does not clear the flag).
  void CatchInterrupts();
  bool stop_requested() const;
  // The flag itself, for a loop that polls it (e.g. Trainer::Run). One per process (a signal
  // handler can reach nothing else), cleared by the first CatchInterrupts; valid for the process's
  // life.
  const std::atomic<bool>* stop_flag() const;

 private:
  bool json_;
  std::unique_ptr<InterruptScope> interrupts_;  // open once CatchInterrupts was called
};

class Command {
 public:
  // `name` as typed after its group ("io" for `strata bench io`); `description` is the one line
  // --help shows for it.
  Command(std::string name, std::string description)
      : name_(std::move(name)), description_(std::move(description)) {}
  virtual ~Command() = default;
  Command(const Command&) = delete;
  Command& operator=(const Command&) = delete;

  const std::string& name() const { return name_; }
  const std::string& description() const { return description_; }
  // Whether the command has a --json form (the framework adds the flag). See the file comment.
  virtual bool has_json() const { return true; }

  // Binds the command's flags to its members. Called once, before parsing.
  virtual void AddFlags(CLI::App& cmd) = 0;
  // Does the work after the flags are parsed, and fills `result` (an empty object on entry) when
  // has_json(). Returns why it failed; what it put in `result` is then discarded.
  virtual Status Run(CommandContext& ctx, nlohmann::json& result) = 0;
  // Writes the human form of a successful Run's `result` to `out` (without --json).
  virtual void PrintText(const nlohmann::json& result, std::FILE* out) const {}

 private:
  const std::string name_;
  const std::string description_;
};

// The `strata` command line: a CLI::App with --version and --log-level, groups of subcommands
// and the commands themselves. Owns the commands.
class CommandLine {
 public:
  CommandLine(std::string description, std::string version);
  ~CommandLine();
  CommandLine(const CommandLine&) = delete;
  CommandLine& operator=(const CommandLine&) = delete;

  // A group of subcommands (`strata bench ...`); the group itself requires one of them.
  void AddGroup(const std::string& name, const std::string& description);
  // Attaches `command` at the top level, or under `group` (REQUIRES: added with AddGroup).
  void Add(std::unique_ptr<Command> command, std::string_view group = "");

  // Parses `argv`, runs the chosen command, prints its result or error, and returns the exit
  // code. Call once.
  int Run(int argc, const char* const* argv);

  CLI::App& app();  // for tests and for options that belong to the whole binary

 private:
  struct Entry;
  void RunEntry(Entry& entry);

  std::unique_ptr<CLI::App> app_;
  std::vector<std::unique_ptr<Entry>> entries_;
  std::string log_level_;
  int exit_code_ = kExitOk;
};

}  // namespace strata::runtime
