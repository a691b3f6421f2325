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
#include <algorithm>
#include <cctype>
#include <cstdint>
#include <exception>
#include <nlohmann/json.hpp>
#include <regex>

#include "base/logging.h"
#include "base/signals.h"
#include "runtime/commands/suggest.h"
#include "swap/swap_space.h"

namespace strata::runtime {
namespace {

// ---- Parse errors as one line
//
// CLI11 throws one ParseError for the whole line and does not say which (sub)command it was in.
// Its state after the throw does: each App keeps the subcommands it entered and the words it could
// not place (remaining()). So the line is rebuilt from that state and the error's kind: a word
// no App placed is the first mistake (CLI11 may have thrown about something it caused, such as a
// missing subcommand after `strata trian`); otherwise the option named in CLI11's message, looked
// up in the Apps entered, gives the flag, its type and its values.

// The Apps CLI11 entered, the root first.
std::vector<CLI::App*> EnteredPath(CLI::App* root) {
  std::vector<CLI::App*> path = {root};
  while (true) {
    const std::vector<CLI::App*> subs = path.back()->get_subcommands();
    if (subs.empty()) break;
    path.push_back(subs.front());
  }
  return path;
}

// "strata", "strata bench", "strata bench io": how an error names the App at path[depth].
std::string PathName(const std::vector<CLI::App*>& path, size_t depth) {
  std::string name = "strata";
  for (size_t i = 1; i <= depth; ++i) name += " " + path[i]->get_name();
  return name;
}

// The named subcommands of `app` (not CLI11's nameless option groups).
std::vector<CLI::App*> NamedSubcommands(CLI::App* app) {
  return app->get_subcommands([](CLI::App* sub) { return !sub->get_name().empty(); });
}

// "-x" and "--name" are flags; "-1" and "-.5" are (negative) values.
bool LooksLikeFlag(const std::string& word) {
  return word.size() > 1 && word[0] == '-' && !std::isdigit(static_cast<unsigned char>(word[1])) &&
         word[1] != '.';
}

std::vector<std::string> OptionNames(const CLI::Option& opt) {
  std::vector<std::string> names;
  for (const std::string& l : opt.get_lnames()) names.push_back("--" + l);
  for (const std::string& s : opt.get_snames()) names.push_back("-" + s);
  return names;
}

const CLI::Option* FindOption(CLI::App* app, const std::string& flag) {
  for (const CLI::Option* opt : app->get_options()) {
    for (const std::string& name : OptionNames(*opt)) {
      if (name == flag) return opt;
    }
  }
  return nullptr;
}

// " (did you mean a or b?)", or " (see <where> --help)" when nothing is close.
std::string Hint(const std::vector<std::string>& suggestions, const std::string& where) {
  if (suggestions.empty()) return " (see " + where + " --help)";
  return " (did you mean " + JoinWithOr(suggestions) + "?)";
}

std::string UnknownFlag(const std::vector<CLI::App*>& path, size_t depth, const std::string& flag) {
  const std::string where = PathName(path, depth);
  // A flag of an enclosing command given after a subcommand (`strata train --log-level debug`).
  for (size_t up = depth; up-- > 0;) {
    if (FindOption(path[up], flag) != nullptr) {
      return where + ": " + flag + " is a flag of " + PathName(path, up) + ": give it before " +
             path[up + 1]->get_name();
    }
  }
  std::vector<std::vector<std::string>> choices;
  for (const CLI::Option* opt : path[depth]->get_options()) {
    std::vector<std::string> names = OptionNames(*opt);
    if (!names.empty()) choices.push_back(std::move(names));
  }
  // A one-letter flag is too short for a spelling to be guessed from.
  const bool short_flag = flag.rfind("--", 0) != 0;
  return where + ": unknown flag " + flag +
         Hint(short_flag ? std::vector<std::string>{} : Suggest(flag, choices), where);
}

std::string CommandChoices(CLI::App* app) {
  std::vector<std::string> names;
  for (CLI::App* sub : NamedSubcommands(app)) names.push_back(sub->get_name());
  return JoinWithOr(names);
}

std::string UnknownWord(const std::vector<CLI::App*>& path, size_t depth, const std::string& word) {
  const std::string where = PathName(path, depth);
  if (NamedSubcommands(path[depth]).empty()) {
    return where + ": unexpected argument '" + word + "' (flags start with --; see " + where +
           " --help)";
  }
  std::vector<std::vector<std::string>> choices;
  for (CLI::App* sub : NamedSubcommands(path[depth])) {
    std::vector<std::string> names = {sub->get_name()};
    for (const std::string& alias : sub->get_aliases()) names.push_back(alias);
    choices.push_back(std::move(names));
  }
  return where + ": unknown command " + word + Hint(Suggest(word, choices), where);
}

// The kind of value an option converts to, from CLI11's type name ("INT", "FLOAT:...").
// Unsigned options are kOther: CLI11 reads "-1" into them as 2^64 - 1 (flags::Seed refuses it).
enum class ValueKind { kWhole, kNumber, kOther };

ValueKind KindOf(const CLI::Option& opt) {
  const std::string type = opt.get_type_name();
  const std::string base = type.substr(0, type.find(':'));
  if (base == "INT") return ValueKind::kWhole;
  if (base == "FLOAT") return ValueKind::kNumber;
  return ValueKind::kOther;
}

// Why `value` is not even written as a value of `kind` ("" when it is: any further complaint is
// about its range, and says so). A whole number is what CLI11's conversion reads (strtoll, base
// 0: decimal, 0x hex, 0 octal), whatever its size.
// Checked by hand, not with std::regex: libstdc++ matches recursively, and a value of 60000 digits
// overflowed the stack.
bool IsWholeNumber(const std::string& value) {
  size_t i = value.empty() || (value[0] != '+' && value[0] != '-') ? 0 : 1;
  const std::string digits = value.substr(i);
  if (digits.empty()) return false;
  if (digits.size() > 2 && digits[0] == '0' && (digits[1] == 'x' || digits[1] == 'X')) {
    return std::all_of(digits.begin() + 2, digits.end(),
                       [](char c) { return std::isxdigit(static_cast<unsigned char>(c)) != 0; });
  }
  if (digits[0] == '0') {
    return std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '7'; });
  }
  return std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; });
}

std::string NotOfKind(ValueKind kind, const std::string& value) {
  double number = 0;
  switch (kind) {
    case ValueKind::kWhole:
      return IsWholeNumber(value) ? "" : "'" + value + "' is not a whole number";
    case ValueKind::kNumber:
      return CLI::detail::lexical_cast(value, number) ? "" : "'" + value + "' is not a number";
    case ValueKind::kOther:
      return {};
  }
  return {};
}

// The first of the option's values that is not of its kind, said as NotOfKind does; "" if none.
std::string FirstValueNotOfKind(const CLI::Option& opt) {
  for (const std::string& value : opt.results()) {
    std::string why = NotOfKind(KindOf(opt), value);
    if (!why.empty()) return why;
  }
  return {};
}

// CLI11's range message, "Value 0 not in range 1 to 8", as "0 is not in range 1 to 8".
std::string Tidy(std::string message) {
  const std::string head = "Value ", tail = " not in range ";
  const size_t at = message.find(tail);
  if (message.rfind(head, 0) != 0 || at == std::string::npos || at < head.size()) return message;
  return message.substr(head.size(), at - head.size()) + " is not in range " +
         message.substr(at + tail.size());
}

// The part of `message` after "<flag>: ", or all of it.
std::string AfterFlag(const std::string& message, const std::string& flag) {
  const std::string head = flag + ": ";
  return message.rfind(head, 0) == 0 ? message.substr(head.size()) : message;
}

// The one line for a parse error CLI11 threw after parsing into `root` (see above).
std::string DescribeParseError(CLI::App* root, const CLI::ParseError& error) {
  const std::vector<CLI::App*> path = EnteredPath(root);
  for (size_t depth = 0; depth < path.size(); ++depth) {
    for (const std::string& word : path[depth]->remaining(false)) {
      if (LooksLikeFlag(word)) return UnknownFlag(path, depth, word.substr(0, word.find('=')));
      return UnknownWord(path, depth, word);
    }
  }
  const std::string message = error.what();
  const size_t deepest = path.size() - 1;
  if (dynamic_cast<const CLI::RequiredError*>(&error) != nullptr &&
      path[deepest]->get_require_subcommand_min() > 0 && path[deepest]->get_subcommands().empty()) {
    const std::string where = PathName(path, deepest);
    return where + ": missing command: one of " + CommandChoices(path[deepest]) + " (see " + where +
           " --help)";
  }
  // The option the message names: its first flag-like word that an entered App has, innermost
  // first (an option's name is the first word of most of CLI11's messages).
  static const std::regex flag_word("(^|[^A-Za-z0-9_-])(--?[A-Za-z0-9][A-Za-z0-9_-]*)");
  // Flag names come first in CLI11's messages; a long value echoed after them is not searched
  // (std::regex recurses per character).
  const std::string head = message.substr(0, 512);
  for (auto it = std::sregex_iterator(head.begin(), head.end(), flag_word);
       it != std::sregex_iterator(); ++it) {
    const std::string flag = (*it)[2].str();
    for (size_t depth = path.size(); depth-- > 0;) {
      const CLI::Option* opt = FindOption(path[depth], flag);
      if (opt == nullptr) continue;
      const std::string where = PathName(path, depth) + ": ";
      if (dynamic_cast<const CLI::ArgumentMismatch*>(&error) != nullptr && message.size() >= 8 &&
          message.compare(message.size() - 8, 8, " missing") == 0) {
        return where + flag + ": missing its value";
      }
      if (dynamic_cast<const CLI::ValidationError*>(&error) != nullptr) {
        const std::string why = FirstValueNotOfKind(*opt);
        return where + flag + ": " + (why.empty() ? Tidy(AfterFlag(message, flag)) : why);
      }
      if (dynamic_cast<const CLI::ConversionError*>(&error) != nullptr) {
        if (opt->get_expected_max() == 0 || opt->get_type_size() == 0) {
          return where + flag + ": a flag takes no value";
        }
        const std::string why = FirstValueNotOfKind(*opt);
        if (!why.empty()) return where + flag + ": " + why;
        // Written as a whole number, yet not converted: too large for the option's type.
        return where + flag + ": '" + CLI::detail::join(opt->results()) + "' is out of range";
      }
      return where + message;  // "--data is required", "--a excludes --b"...
    }
  }
  return PathName(path, deepest) + ": " + message;
}

}  // namespace

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
    if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) return app_->exit(e);
    std::fprintf(stderr, "%s%s\n", LogPrefix().c_str(), DescribeParseError(app_.get(), e).c_str());
    return kExitBadInput;
  }
  return exit_code_;
}

}  // namespace strata::runtime
