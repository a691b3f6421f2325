// `strata clean --path DIR`: removes the swap directories that runs killed without cleaning up
// (kill -9, the OOM killer) left under DIR, an nvme_path, as every new run on DIR does when it
// starts; never one whose owner is alive, one kept on purpose, or anything that is not only
// strata's (swap/run_dir.h has the rules). --dry-run says what it would remove. It lists what it
// removed and what it left alone, with why, and the bytes freed. A directory that should have been
// removed and could not be (permissions...) fails the command (exit 1), naming it. On the demo's
// scratch directory (demo_scratch.h), the directory itself is removed once empty and unused.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/bytes.h"
#include "runtime/commands/command.h"
#include "runtime/commands/commands.h"
#include "runtime/commands/demo_scratch.h"
#include "swap/run_dir.h"

namespace strata::runtime {
namespace {

using nlohmann::json;

class CleanCommand final : public Command {
 public:
  CleanCommand()
      : Command("clean",
                "Remove the swap directories of runs that were killed (kill -9, out of memory) "
                "from an nvme_path; live runs' and kept directories are never touched") {}
  void AddFlags(CLI::App& cmd) override {
    cmd.add_option("--path", path_, "The nvme_path to clean (a directory)")->required();
    cmd.add_flag("--dry-run", dry_run_, "List what would be removed; remove nothing");
  }
  Status Run(CommandContext& ctx, json& j) override;
  void PrintText(const json& j, std::FILE* out) const override;

 private:
  std::string path_;
  bool dry_run_ = false;
};

Status CleanCommand::Run(CommandContext& /*ctx*/, json& j) {
  if (path_.empty()) return InvalidArgumentError("--path is empty");
  Result<ReclaimReport> report = ReclaimOrphans(path_, {.dry_run = dry_run_});
  if (!report.ok()) return report.status().WithContext("--path");
  // Ranks r > 0 of a multi-rank run keep their swap in nvme_path/rank<r>/ (state_store.cc):
  // their orphans are listed and removed too, by the same rules, and an emptied rank directory
  // goes with them.
  std::error_code ec;
  std::vector<std::string> rank_dirs;
  for (const auto& e : std::filesystem::directory_iterator(path_, ec)) {
    const std::string name = e.path().filename().string();
    if (name.size() > 4 && name.rfind("rank", 0) == 0 &&
        name.find_first_not_of("0123456789", 4) == std::string::npos && !e.is_symlink() &&
        e.is_directory()) {
      rank_dirs.push_back(name);
    }
  }
  std::sort(rank_dirs.begin(), rank_dirs.end());
  for (const std::string& rank_dir : rank_dirs) {
    Result<ReclaimReport> sub = ReclaimOrphans(path_ + "/" + rank_dir, {.dry_run = dry_run_});
    if (!sub.ok()) continue;  // not readable: not ours to judge
    for (RunDirVerdict v : sub->dirs) {
      v.name = rank_dir + "/" + v.name;
      report->dirs.push_back(std::move(v));
    }
    report->removed += sub->removed;
    report->bytes_freed += sub->bytes_freed;
    if (!dry_run_) ::rmdir((path_ + "/" + rank_dir).c_str());  // only if now empty
  }
  std::string failures;
  j["path"] = report->path;
  j["dry_run"] = dry_run_;
  j["directories"] = json::array();
  for (const RunDirVerdict& v : report->dirs) {
    json d = {{"name", v.name},
              {"path", report->path + "/" + v.name},
              {"state", std::string(RunDirStateName(v.state))},
              {"bytes", v.bytes},
              {"message", DescribeVerdict(report->path, v)}};
    if (v.owner.pid != 0 || !v.owner.host.empty()) {
      d["owner"] = {{"pid", v.owner.pid}, {"host", v.owner.host}, {"started", v.owner.started}};
    }
    if (!v.detail.empty()) d["detail"] = v.detail;
    j["directories"].push_back(d);
    if (v.state == RunDirVerdict::State::kError) {
      failures += (failures.empty() ? "" : "; ") + DescribeVerdict(report->path, v);
    }
  }
  j["removed"] = report->removed;
  j["bytes_freed"] = report->bytes_freed;
  // The demo's scratch directory goes too once nothing is in it and no demo run holds it (what
  // scripts/run.sh relies on after a demo was killed).
  const bool is_demo_scratch = std::filesystem::equivalent(path_, DemoScratchPath(), ec);
  j["removed_demo_scratch"] = !dry_run_ && failures.empty() && is_demo_scratch &&
                              RemoveDemoScratchIfUnused(DemoScratchPath());
  if (!failures.empty()) {
    // Each failure already names the directory, the call and the errno.
    return Status(StatusCode::kIoError,
                  "removed " + std::to_string(report->removed) + " orphaned director" +
                      (report->removed == 1 ? "y" : "ies") + " (" +
                      FormatBytes(report->bytes_freed) + "), but " + failures);
  }
  return Status::Ok();
}

void CleanCommand::PrintText(const json& j, std::FILE* out) const {
  const std::string path = j["path"].get<std::string>();
  for (const json& d : j["directories"]) {
    std::fprintf(out, "%s\n", d["message"].get<std::string>().c_str());
  }
  const int removed = j["removed"].get<int>();
  const std::string dirs = std::to_string(removed) + (removed == 1 ? " directory" : " directories");
  const std::string bytes = FormatBytes(j["bytes_freed"].get<uint64_t>());
  if (j["dry_run"].get<bool>()) {
    std::fprintf(out, "dry run: would free %s in %s under %s; nothing was removed\n", bytes.c_str(),
                 dirs.c_str(), path.c_str());
  } else if (removed == 0) {
    std::fprintf(out, "no orphaned swap directories under %s\n", path.c_str());
  } else {
    std::fprintf(out, "freed %s in %s under %s\n", bytes.c_str(), dirs.c_str(), path.c_str());
  }
  if (j.value("removed_demo_scratch", false)) {
    std::fprintf(out, "removed %s (the demo's scratch directory: empty, no demo run using it)\n",
                 path.c_str());
  }
}

}  // namespace

std::unique_ptr<Command> NewCleanCommand() { return std::make_unique<CleanCommand>(); }

}  // namespace strata::runtime
