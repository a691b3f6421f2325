// The command framework: see command.h.
//
// Running a command: CLI11 parses the line and calls the chosen subcommand's callback, which
// builds a CommandContext, calls Command::Run under a catch-all (an exception escaping a command
// must not reach std::terminate), then prints the result (JSON or PrintText) or the error line
// and records the exit code that CommandLine::Run returns.
//
// Signals: CatchInterrupts opens an InterruptScope of the process's signal owner (base/signals.h),
// which keeps the one stop flag and decides what a first and a second signal do.
#include "runtime/commands/command.h"

#include <CLI/CLI.hpp>
#include <exception>
#include <nlohmann/json.hpp>

#include "base/logging.h"
#include "base/signals.h"
#include "swap/swap_space.h"

namespace strata::runtime {
namespace {}  // namespace

int ExitCode(const Status& status) {
  switch (status.code()) {
    case StatusCode::kOk:
      return kExitOk;
    case StatusCode::kInvalidArgument:
    case StatusCode::kNotFound:
      return kExitBadInput;
    case StatusCode::kCancelled:
      return kExitInterrupted;
    default:
      return kExitFailed;
  }
}

// ---- CommandContext
// ------------------------------------------------------------------------------

CommandContext::~CommandContext() = default;

void CommandContext::CatchInterrupts() {
  if (interrupts_ != nullptr) return;
  // A second interrupt removes the swap files of every live swap space, also those that did not
  // register their own cleanup.
  RegisterSignalCleanup(&RemoveSwapFilesForSignal);
  interrupts_ = std::make_unique<InterruptScope>();
}

bool CommandContext::stop_requested() const { return InterruptFlag()->load(); }

const std::atomic<bool>* CommandContext::stop_flag() const { return InterruptFlag(); }

// ---- CommandLine
// ---------------------------------------------------------------------------------

struct CommandLine::Entry {
  std::unique_ptr<Command> command;
  std::string path;  // "bench io": how errors name it
  bool json = false;
};

CommandLine::CommandLine(std::string description, std::string version)
    : app_(std::make_unique<CLI::App>(std::move(description))) {
  app_->require_subcommand(1);
  app_->set_version_flag("--version", std::move(version));
  app_->add_option("--log-level", log_level_,
                   "debug|info|warning|error (default: STRATA_LOG_LEVEL or info)")
      ->check(CLI::IsMember({"debug", "info", "warning", "error"}));
  // Before any subcommand callback runs, so the command's own logging honours the flag.
  app_->parse_complete_callback([this] {
    LogLevel level;
    if (!log_level_.empty() && ParseLogLevel(log_level_, &level)) SetLogLevel(level);
  });
}

CommandLine::~CommandLine() = default;

CLI::App& CommandLine::app() { return *app_; }

void CommandLine::AddGroup(const std::string& name, const std::string& description) {
  app_->add_subcommand(name, description)->require_subcommand(1);
}

void CommandLine::Add(std::unique_ptr<Command> command, std::string_view group) {
  CLI::App* parent = group.empty() ? app_.get() : app_->get_subcommand(std::string(group));
  auto entry = std::make_unique<Entry>();
  entry->path = (group.empty() ? "" : std::string(group) + " ") + command->name();
  CLI::App* cmd = parent->add_subcommand(command->name(), command->description());
  command->AddFlags(*cmd);
  if (command->has_json()) {
    cmd->add_flag("--json", entry->json, "Print one JSON object instead of text");
  }
  Entry* e = entry.get();
  cmd->callback([this, e] { RunEntry(*e); });
  entry->command = std::move(command);
  entries_.push_back(std::move(entry));
}

void CommandLine::RunEntry(Entry& entry) {
  nlohmann::json result = nlohmann::json::object();
  Status status;
  {
    CommandContext ctx(entry.json);
    try {
      status = entry.command->Run(ctx, result);
    } catch (const std::exception& e) {
      status = InternalError(std::string("uncaught exception: ") + e.what());
    }
  }
  exit_code_ = ExitCode(status);
  // Stopped by a signal: report it as a shell does for a process the signal ended (128 + N), so a
  // scheduler that sent SIGTERM sees 143 and one that sent SIGINT 130.
  if (status.code() == StatusCode::kCancelled && InterruptSignal() != 0) {
    exit_code_ = 128 + InterruptSignal();
  }
  if (!status.ok()) {
    if (status.code() != StatusCode::kCancelled) {
      std::fprintf(stderr, "%sstrata %s: %s\n", LogPrefix().c_str(), entry.path.c_str(),
                   status.ToString().c_str());
    }
    return;
  }
  if (entry.json) {
    // Replace invalid UTF-8 (a CPU model string, a file name) rather than throw out of dump.
    const std::string text = result.dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
    std::fprintf(stdout, "%s\n", text.c_str());
  } else {
    entry.command->PrintText(result, stdout);
  }
  std::fflush(stdout);
}

int CommandLine::Run(int argc, const char* const* argv) {
  try {
    app_->parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version arrive here too, as successes.
    return app_->exit(e) == 0 ? kExitOk : kExitBadInput;
  }
  return exit_code_;
}

}  // namespace strata::runtime
