// `strata plot LOG.jsonl --output curves.svg`: the training curves of a `strata train --log-json`
// file as one SVG a browser opens (runtime/metrics/svg_plot.h), for people without TensorBoard.
// Four panels over the step: the loss (and the eval loss where records carry "eval_loss"), the
// learning rate ("lr"), the throughput ("tokens_per_second") and the NVMe bytes read and written
// per step ("nvme_read_bytes", "nvme_written_bytes").
//
// Reading the log: one JSON object per line; blank lines are skipped; an object without an integer
// "step" is not a step record and is skipped. A resumed run appends to the same log, so steps
// repeat: the last record of a step wins (it is what the checkpointed run went on from). A field
// that is absent, null (how --log-json writes NaN) or not finite leaves no point.
//
// Errors: a line that is not a JSON object (named by its line number) or a log without any step
// record is kInvalidArgument (exit 2); an output that cannot be written is the write's error
// (exit 1), naming the file. The SVG is written to OUTPUT.tmp and renamed over OUTPUT, so a failed
// run leaves no partial file.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "base/file_util.h"
#include "runtime/commands/command.h"
#include "runtime/commands/commands.h"
#include "runtime/commands/flag_checks.h"
#include "runtime/metrics/svg_plot.h"

namespace strata::runtime {
namespace {

using nlohmann::json;

// One curve: the --log-json field it plots, under the name its legend shows.
struct CurveSpec {
  const char* name;
  const char* field;
  bool markers;
};
struct PanelSpec {
  const char* title;
  std::vector<CurveSpec> curves;
};

const std::vector<PanelSpec>& Panels() {
  static const std::vector<PanelSpec> panels = {
      {"Loss", {{"train loss", "loss", false}, {"eval loss", "eval_loss", true}}},
      {"Learning rate", {{"learning rate", "lr", false}}},
      {"Throughput (tokens/s)", {{"tokens/s", "tokens_per_second", false}}},
      {"NVMe bytes per step",
       {{"read", "nvme_read_bytes", false}, {"written", "nvme_written_bytes", false}}},
  };
  return panels;
}

// The integer "step" of a record, if it has one.
std::optional<int64_t> StepOf(const json& record) {
  auto it = record.find("step");
  if (it == record.end()) return std::nullopt;
  if (it->is_number_integer()) return it->get<int64_t>();
  if (it->is_number_float()) {
    const double v = it->get<double>();
    // Within int64's range (a cast of 1e30 is undefined behaviour).
    if (std::isfinite(v) && v == std::floor(v) && std::abs(v) < 9.2e18) {
      return static_cast<int64_t>(v);
    }
  }
  return std::nullopt;
}

std::optional<double> FiniteField(const json& record, const char* field) {
  auto it = record.find(field);
  if (it == record.end() || !it->is_number()) return std::nullopt;
  const double v = it->get<double>();
  if (!std::isfinite(v)) return std::nullopt;
  return v;
}

// The last record of each step of the log at `path`.
Status ReadLog(const std::string& path, std::map<int64_t, json>* by_step, int64_t* records) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return IoErrorFromErrno(errno, "opening " + path);
  int64_t line_no = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    json record = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (record.is_discarded() || !record.is_object()) {
      return InvalidArgumentError(path + ":" + std::to_string(line_no) + ": not a JSON object" +
                                  " (a --log-json file has one per line)");
    }
    if (auto it = record.find("step"); it != record.end() && it->is_number_unsigned() &&
                                       it->get<uint64_t>() > uint64_t{INT64_MAX}) {
      return InvalidArgumentError(path + ":" + std::to_string(line_no) + ": step " + it->dump() +
                                  " is beyond any step a run counts (at most 2^63 - 1)");
    }
    std::optional<int64_t> step = StepOf(record);
    if (!step) continue;
    ++*records;
    (*by_step)[*step] = std::move(record);
  }
  if (in.bad()) return IoErrorFromErrno(errno, "reading " + path);
  return Status::Ok();
}

class PlotCommand final : public Command {
 public:
  PlotCommand()
      : Command("plot",
                "Draw the training curves of a `strata train --log-json` file (loss and eval "
                "loss, learning rate, tokens/s, NVMe bytes per step) as one SVG a browser "
                "opens") {}

  void AddFlags(CLI::App& cmd) override {
    cmd.add_option("log", log_, "The --log-json file (JSON lines)")
        ->required()
        ->check(flags::InputFile());
    cmd.add_option("--output,-o", output_, "The SVG file to write")
        ->required()
        ->check(flags::OutputFile());
  }

  Status Run(CommandContext& /*ctx*/, json& j) override {
    std::map<int64_t, json> by_step;
    int64_t records = 0;
    STRATA_RETURN_IF_ERROR(ReadLog(log_, &by_step, &records));
    if (by_step.empty()) {
      return InvalidArgumentError(log_ +
                                  ": no step records (objects with an integer \"step\"), nothing "
                                  "to plot");
    }
    std::vector<metrics::PlotPanel> panels;
    j["series"] = json::array();
    for (const PanelSpec& spec : Panels()) {
      metrics::PlotPanel panel{.title = spec.title};
      for (const CurveSpec& curve : spec.curves) {
        metrics::PlotSeries series{.name = curve.name, .markers = curve.markers};
        for (const auto& [step, record] : by_step) {
          if (std::optional<double> v = FiniteField(record, curve.field)) {
            series.x.push_back(static_cast<double>(step));
            series.y.push_back(*v);
          }
        }
        json entry = {{"panel", spec.title},
                      {"name", curve.name},
                      {"field", curve.field},
                      {"points", series.x.size()}};
        if (!series.y.empty()) {
          entry["min"] = *std::min_element(series.y.begin(), series.y.end());
          entry["max"] = *std::max_element(series.y.begin(), series.y.end());
          entry["last"] = series.y.back();
        }
        j["series"].push_back(std::move(entry));
        panel.series.push_back(std::move(series));
      }
      panels.push_back(std::move(panel));
    }
    const std::string svg = metrics::RenderSvg("strata training curves: " + log_, panels);
    STRATA_RETURN_IF_ERROR(CheckOutputPath(output_, "--output", {{"the log plotted", log_}}));
    Status written = [&]() -> Status {
      STRATA_ASSIGN_OR_RETURN(AtomicFileWriter out, AtomicFileWriter::Create(output_));
      STRATA_RETURN_IF_ERROR(out.Append(svg));
      return out.Commit();
    }();
    if (!written.ok()) return std::move(written).WithContext("writing --output " + output_);
    j["log"] = log_;
    j["output"] = output_;
    j["records"] = records;
    j["steps"] = by_step.size();
    j["first_step"] = by_step.begin()->first;
    j["last_step"] = by_step.rbegin()->first;
    return Status::Ok();
  }

  void PrintText(const json& j, std::FILE* out) const override {
    std::fprintf(out, "wrote %s: %lld steps (%lld to %lld) from %s\n",
                 j["output"].get<std::string>().c_str(), j["steps"].get<long long>(),
                 j["first_step"].get<long long>(), j["last_step"].get<long long>(),
                 j["log"].get<std::string>().c_str());
    for (const json& s : j["series"]) {
      std::fprintf(out, "  %-22s %-14s %lld points\n", s["panel"].get<std::string>().c_str(),
                   s["name"].get<std::string>().c_str(), s["points"].get<long long>());
    }
  }

 private:
  std::string log_;
  std::string output_;
};

}  // namespace

std::unique_ptr<Command> NewPlotCommand() { return std::make_unique<PlotCommand>(); }

}  // namespace strata::runtime
