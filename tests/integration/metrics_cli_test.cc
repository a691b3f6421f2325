// Logs people plot, through the binary: `strata train --tensorboard DIR` (the event file decoded by
// tests/testing/tfevents_reader.h and, where python3 has the tensorboard module, by TensorBoard's
// own EventAccumulator; its scalars equal the --log-json figures as float32; a resumed run adds a
// file), and `strata plot LOG --output SVG` (parsed by python3's xml.etree: four panels, one
// point per step; the last record of a repeated step wins; bad logs and outputs refused).
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "tests/testing/cli_run.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/tfevents_reader.h"

namespace {

using nlohmann::json;
using strata::testing::CliRun;
using strata::testing::JsonLines;
using strata::testing::ReadFileOrEmpty;
using strata::testing::ReadTfEvents;
using strata::testing::Shell;
using strata::testing::Strata;
using strata::testing::TempDir;
using strata::testing::TfEvent;

constexpr const char* kPython = "/usr/bin/python3";

// tag -> (step, value) in file order.
using Scalars = std::map<std::string, std::vector<std::pair<int64_t, float>>>;

// The event files of `dir`, in name order (TensorBoard's reading order).
std::vector<std::string> EventFiles(const std::string& dir) {
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().filename().string().rfind("events.out.tfevents.", 0) == 0) {
      files.push_back(e.path().string());
    }
  }
  std::sort(files.begin(), files.end());
  return files;
}

// Decodes one event file; the first event must be the file version.
Scalars ReadScalars(const std::string& path) {
  std::vector<TfEvent> events;
  const std::string err = ReadTfEvents(ReadFileOrEmpty(path), &events);
  EXPECT_EQ(err, "") << path;
  Scalars out;
  if (events.empty()) {
    ADD_FAILURE() << path << " holds no event";
    return out;
  }
  EXPECT_EQ(events[0].file_version, "brain.Event:2") << path;
  for (size_t i = 1; i < events.size(); ++i) {
    EXPECT_TRUE(events[i].has_summary) << path << " event " << i;
    for (const auto& v : events[i].values) out[v.tag].emplace_back(events[i].step, v.simple_value);
  }
  return out;
}

class MetricsCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(dir_.ok());
    std::ofstream data(dir_.File("data.txt"));
    for (int i = 0; i < 300; ++i)
      data << "The quick brown fox " << i << " jumps over the lazy dog.\n";
    std::ofstream cfg(dir_.File("ds.json"));
    cfg << R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
      "gradient_clipping": 1.0,
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
      "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 3}},
      "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 100,
        "offload_param": {"device": "nvme", "nvme_path": ")"
        << dir_.File("nvme") << R"("},
        "offload_optimizer": {"device": "nvme", "nvme_path": ")"
        << dir_.File("nvme") << R"("}}})";
  }

  std::string Train(const std::string& extra) const {
    return "train --model tiny --config " + dir_.File("ds.json") + " --data " +
           dir_.File("data.txt") + " --threads 1 --quiet " + extra;
  }

  // Runs python3 on `script` (written to a file) with `args`.
  CliRun Python(const std::string& script, const std::string& args) const {
    const std::string path = dir_.File("check.py");
    std::ofstream(path) << script;
    return Shell(std::string(kPython) + " " + path + " " + args);
  }

  TempDir dir_{"strata-metrics-cli"};
};

// `strata train` exists only in libtorch builds; `strata plot` in all.
#define SKIP_WITHOUT_TRAIN()                                                     \
  if (Strata("train --help").out.find("--steps") == std::string::npos) {         \
    GTEST_SKIP() << "this strata has no train command (built without libtorch)"; \
  }
#define SKIP_WITHOUT_PYTHON()                                                             \
  if (!std::filesystem::exists(kPython)) {                                                \
    GTEST_SKIP() << kPython << " is missing: the SVG is parsed with python3's xml.etree"; \
  }

// A float as TensorBoard stores it.
float F(const json& v) { return static_cast<float>(v.get<double>()); }

TEST_F(MetricsCliTest, TensorBoardScalarsEqualTheLoggedOnes) {
  SKIP_WITHOUT_TRAIN();
  const std::string tb = dir_.File("tb"), log = dir_.File("log.jsonl");
  CliRun r = Strata(Train("--steps 5 --tensorboard " + tb + " --log-json " + log));
  ASSERT_EQ(r.rc, 0) << r.out;
  const std::vector<json> records = JsonLines(log);
  ASSERT_EQ(records.size(), 5u);
  const std::vector<std::string> files = EventFiles(tb);
  ASSERT_EQ(files.size(), 1u);
  Scalars s = ReadScalars(files[0]);
  // The tags Hugging Face's Trainer writes, and strata's own, each once per step.
  const std::vector<std::pair<std::string, std::string>> tag_field = {
      {"train/loss", "loss"},
      {"train/learning_rate", "lr"},
      {"train/grad_norm", "grad_norm"},
      {"train/tokens_per_second", "tokens_per_second"},
      {"train/step_seconds", "step_seconds"},
      {"train/nvme_read_bytes", "nvme_read_bytes"},
      {"train/nvme_written_bytes", "nvme_written_bytes"}};
  for (const auto& [tag, field] : tag_field) {
    ASSERT_EQ(s[tag].size(), 5u) << tag;
    for (size_t i = 0; i < 5; ++i) {
      EXPECT_EQ(s[tag][i].first, records[i]["step"].get<int64_t>()) << tag;
      EXPECT_EQ(s[tag][i].first, static_cast<int64_t>(i + 1)) << tag;
      EXPECT_EQ(s[tag][i].second, F(records[i][field])) << tag << " at step " << i + 1;
    }
  }
  // The curves are not flat: the loss moves and NVMe offload moves bytes.
  EXPECT_NE(s["train/loss"][0].second, s["train/loss"][4].second);
  EXPECT_GT(s["train/nvme_read_bytes"][4].second + s["train/nvme_written_bytes"][4].second, 0.0f);
  // No --eval-data: no eval curve.
  EXPECT_EQ(s.count("eval/loss"), 0u);
  for (const auto& [step, epoch] : s["train/epoch"]) EXPECT_GT(epoch, 0.0f) << step;
}

// --eval-data: eval/loss and eval/perplexity at the evaluated steps (every 2 and the last), equal
// to what the checkpoint records for its step; train/epoch grows with the samples consumed.
TEST_F(MetricsCliTest, EvalCurvesAreWrittenAtTheEvaluatedSteps) {
  SKIP_WITHOUT_TRAIN();
  const std::string tb = dir_.File("tb");
  CliRun r =
      Strata(Train("--steps 5 --tensorboard " + tb + " --eval-data " + dir_.File("data.txt") +
                   " --eval-every 2 --eval-max-batches 2 --save " + dir_.File("ck")));
  ASSERT_EQ(r.rc, 0) << r.out;
  const std::vector<std::string> files = EventFiles(tb);
  ASSERT_EQ(files.size(), 1u);
  Scalars s = ReadScalars(files[0]);
  ASSERT_EQ(s["eval/loss"].size(), 3u);
  ASSERT_EQ(s["eval/perplexity"].size(), 3u);
  EXPECT_EQ(s["eval/loss"][0].first, 2);
  EXPECT_EQ(s["eval/loss"][1].first, 4);
  EXPECT_EQ(s["eval/loss"][2].first, 5);
  const json t = json::parse(ReadFileOrEmpty(dir_.File("ck/step-5/trainer.json")), nullptr, false);
  ASSERT_TRUE(t.is_object()) << r.out;
  EXPECT_EQ(s["eval/loss"][2].second, F(t["eval"]["loss"]));
  EXPECT_EQ(s["eval/perplexity"][2].second, F(t["eval"]["perplexity"]));
  ASSERT_EQ(s["train/epoch"].size(), 5u);
  EXPECT_LT(s["train/epoch"][0].second, s["train/epoch"][4].second);
  EXPECT_FLOAT_EQ(s["train/epoch"][4].second, 5 * s["train/epoch"][0].second);
}

TEST_F(MetricsCliTest, TensorBoardReadsTheFile) {
  SKIP_WITHOUT_TRAIN();
  if (Shell(std::string(kPython) + " -c 'import tensorboard'").rc != 0) {
    GTEST_SKIP()
        << kPython
        << " has no tensorboard module (pip install tensorboard); the format is checked by "
           "the test's own reader in TensorBoardScalarsEqualTheLoggedOnes";
  }
  const std::string tb = dir_.File("tb"), log = dir_.File("log.jsonl");
  CliRun r = Strata(Train("--steps 3 --tensorboard " + tb + " --log-json " + log));
  ASSERT_EQ(r.rc, 0) << r.out;
  CliRun py = Python(
      "import sys\n"
      "from tensorboard.backend.event_processing.event_accumulator import EventAccumulator\n"
      "ea = EventAccumulator(sys.argv[1]); ea.Reload()\n"
      "for e in ea.Scalars('train/loss'): print(e.step, repr(e.value))\n",
      tb);
  ASSERT_EQ(py.rc, 0) << py.out;
  const std::vector<json> records = JsonLines(log);
  ASSERT_EQ(records.size(), 3u);
  std::istringstream lines(py.out);
  for (const json& rec : records) {
    int64_t step = 0;
    double value = 0;
    ASSERT_TRUE(lines >> step >> value) << py.out;
    EXPECT_EQ(step, rec["step"].get<int64_t>());
    EXPECT_EQ(static_cast<float>(value), F(rec["loss"]));
  }
}

TEST_F(MetricsCliTest, AResumedRunAddsAFile) {
  SKIP_WITHOUT_TRAIN();
  const std::string tb = dir_.File("tb"), save = dir_.File("ck");
  CliRun first = Strata(Train("--steps 3 --save " + save + " --tensorboard " + tb));
  ASSERT_EQ(first.rc, 0) << first.out;
  CliRun second = Strata(Train("--steps 5 --resume " + save + " --tensorboard " + tb));
  ASSERT_EQ(second.rc, 0) << second.out;
  const std::vector<std::string> files = EventFiles(tb);
  ASSERT_EQ(files.size(), 2u);
  std::vector<int64_t> steps;
  for (const std::string& f : files) {
    Scalars s = ReadScalars(f);
    for (const auto& [step, loss] : s["train/loss"]) steps.push_back(step);
  }
  std::sort(steps.begin(), steps.end());
  EXPECT_EQ(steps, (std::vector<int64_t>{1, 2, 3, 4, 5}));
}

TEST_F(MetricsCliTest, TensorBoardErrorsEndTheRun) {
  SKIP_WITHOUT_TRAIN();
  // A path that cannot be a directory: refused with the flags.
  std::ofstream(dir_.File("file")) << "x";
  CliRun file = Strata(Train("--steps 2 --tensorboard " + dir_.File("file")));
  EXPECT_EQ(file.rc, 2) << file.out;
  EXPECT_NE(file.out.find("--tensorboard"), std::string::npos) << file.out;
  // A directory that cannot be created: the run ends before training, naming it.
  CliRun proc = Strata(Train("--steps 2 --tensorboard /proc/strata-tb-test"));
  EXPECT_EQ(proc.rc, 1) << proc.out;
  EXPECT_NE(proc.out.find("--tensorboard /proc/strata-tb-test"), std::string::npos) << proc.out;
  EXPECT_EQ(proc.out.find("done after"), std::string::npos) << proc.out;
}

TEST_F(MetricsCliTest, ADiskFullEndsTheRunWithAnError) {
  SKIP_WITHOUT_TRAIN();
  TempDir small("strata-metrics-full");
  ASSERT_TRUE(small.ok());
  if (std::string why = small.Mount("tmpfs", "size=4k"); !why.empty()) GTEST_SKIP() << why;
  // ~300 bytes a step: 4 KiB fill within 15 steps.
  CliRun r = Strata(Train("--steps 15 --tensorboard " + small.path()));
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_NE(r.out.find("No space left on device"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(small.path() + "/events.out.tfevents."), std::string::npos) << r.out;
}

// Prints "panels N", then "series TITLE|NAME|POINTS" per polyline, for an SVG parsed as XML.
constexpr const char* kSvgCheck =
    "import sys, xml.etree.ElementTree as ET\n"
    "S = '{http://www.w3.org/2000/svg}'\n"
    "root = ET.parse(sys.argv[1]).getroot()\n"
    "assert root.tag == S + 'svg', root.tag\n"
    "panels = [g for g in root.iter(S + 'g') if g.get('class') == 'panel']\n"
    "print('panels', len(panels))\n"
    "for p in panels:\n"
    "  for pl in p.iter(S + 'polyline'):\n"
    "    print('series %s|%s|%d' % (p.get('data-title'), pl.get('data-series'),\n"
    "          len(pl.get('points').split())))\n";

TEST_F(MetricsCliTest, PlotDrawsTheRun) {
  SKIP_WITHOUT_TRAIN();
  SKIP_WITHOUT_PYTHON();
  const std::string log = dir_.File("log.jsonl"), svg = dir_.File("curves.svg");
  CliRun train = Strata(Train("--steps 5 --log-json " + log));
  ASSERT_EQ(train.rc, 0) << train.out;
  CliRun r = Strata("plot " + log + " --output " + svg + " --json");
  ASSERT_EQ(r.rc, 0) << r.out;
  const json j = json::parse(r.out);
  EXPECT_EQ(j["output"], svg);
  EXPECT_EQ(j["steps"], 5);
  EXPECT_EQ(j["first_step"], 1);
  EXPECT_EQ(j["last_step"], 5);
  std::map<std::string, int> points;
  for (const json& s : j["series"]) points[s["name"].get<std::string>()] = s["points"].get<int>();
  EXPECT_EQ(points["train loss"], 5);
  EXPECT_EQ(points["eval loss"], 0);
  EXPECT_EQ(points["learning rate"], 5);
  EXPECT_EQ(points["tokens/s"], 5);
  EXPECT_EQ(points["read"], 5);
  EXPECT_EQ(points["written"], 5);

  CliRun py = Python(kSvgCheck, svg);
  ASSERT_EQ(py.rc, 0) << py.out;
  EXPECT_NE(py.out.find("panels 4\n"), std::string::npos) << py.out;
  EXPECT_NE(py.out.find("series Loss|train loss|5\n"), std::string::npos) << py.out;
  EXPECT_NE(py.out.find("series Learning rate|learning rate|5\n"), std::string::npos) << py.out;
  EXPECT_NE(py.out.find("series Throughput (tokens/s)|tokens/s|5\n"), std::string::npos) << py.out;
  EXPECT_NE(py.out.find("series NVMe bytes per step|read|5\n"), std::string::npos) << py.out;
  EXPECT_NE(py.out.find("series NVMe bytes per step|written|5\n"), std::string::npos) << py.out;

  // The text form names the file and the steps.
  CliRun text = Strata("plot " + log + " -o " + dir_.File("again.svg"));
  ASSERT_EQ(text.rc, 0) << text.out;
  EXPECT_NE(text.out.find("wrote " + dir_.File("again.svg") + ": 5 steps (1 to 5)"),
            std::string::npos)
      << text.out;
}

TEST_F(MetricsCliTest, PlotTakesTheLastRecordOfEachStep) {
  SKIP_WITHOUT_PYTHON();
  // A run logged steps 1-2 (losses 100), was resumed from step 0 and logged 1-4 again; a NaN
  // loss (written as null), a record without a step and one whose step is no integer strata can
  // hold (1e30) leave no point.
  const std::string log = dir_.File("log.jsonl"), svg = dir_.File("curves.svg");
  std::ofstream(log) << R"({"step": 1, "loss": 100, "lr": 0.001}
{"step": 2, "loss": 100, "lr": 0.001}

{"step": 1, "loss": 4, "lr": 0.0005, "tokens_per_second": 10}
{"step": 2, "loss": 3, "lr": 0.001, "tokens_per_second": 12}
{"step": 3, "loss": null, "lr": 0.001, "tokens_per_second": 11}
{"note": "not a step record"}
{"step": 1e30, "loss": 1, "lr": 0.001}
{"step": 4, "loss": 2, "lr": 0.001, "eval_loss": 2.5}
)";
  CliRun r = Strata("plot " + log + " --output " + svg + " --json");
  ASSERT_EQ(r.rc, 0) << r.out;
  const json j = json::parse(r.out);
  EXPECT_EQ(j["steps"], 4);
  EXPECT_EQ(j["records"], 6);
  std::map<std::string, json> series;
  for (const json& s : j["series"]) series[s["name"].get<std::string>()] = s;
  EXPECT_EQ(series["train loss"]["points"], 3);
  EXPECT_EQ(series["train loss"]["max"], 4.0);
  EXPECT_EQ(series["train loss"]["min"], 2.0);
  EXPECT_EQ(series["eval loss"]["points"], 1);
  EXPECT_EQ(series["learning rate"]["points"], 4);
  EXPECT_EQ(series["learning rate"]["min"], 0.0005);
  EXPECT_EQ(series["tokens/s"]["points"], 3);
  EXPECT_EQ(series["read"]["points"], 0);
  CliRun py = Python(kSvgCheck, svg);
  ASSERT_EQ(py.rc, 0) << py.out;
  EXPECT_NE(py.out.find("panels 4\n"), std::string::npos) << py.out;
  EXPECT_NE(py.out.find("series Loss|train loss|3\n"), std::string::npos) << py.out;
  EXPECT_NE(py.out.find("series Loss|eval loss|1\n"), std::string::npos) << py.out;
  EXPECT_EQ(py.out.find("|read|"), std::string::npos) << py.out;  // no data: no polyline
}

TEST_F(MetricsCliTest, PlotRefusesBadLogsAndOutputs) {
  const std::string svg = dir_.File("out.svg");
  const std::string bad = dir_.File("bad.jsonl");
  std::ofstream(bad) << "{\"step\": 1, \"loss\": 2}\n\n{\"step\": 2, \"loss\"\n";
  CliRun r = Strata("plot " + bad + " --output " + svg);
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_NE(r.out.find(bad + ":3: not a JSON object"), std::string::npos) << r.out;
  EXPECT_FALSE(std::filesystem::exists(svg));

  const std::string no_steps = dir_.File("nosteps.jsonl");
  std::ofstream(no_steps) << "{\"loss\": 2}\n\n";
  r = Strata("plot " + no_steps + " --output " + svg);
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_NE(r.out.find("no step records"), std::string::npos) << r.out;

  std::ofstream(dir_.File("empty.jsonl")).flush();
  r = Strata("plot " + dir_.File("empty.jsonl") + " --output " + svg);
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_NE(r.out.find("no step records"), std::string::npos) << r.out;

  r = Strata("plot " + dir_.File("missing.jsonl") + " --output " + svg);
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_NE(r.out.find("missing.jsonl"), std::string::npos) << r.out;

  const std::string good = dir_.File("good.jsonl");
  std::ofstream(good) << "{\"step\": 1, \"loss\": 2}\n";
  // A file the filesystem will not create: refused naming it, nothing left behind.
  r = Strata("plot " + good + " --output /proc/strata-plot-test.svg");
  EXPECT_NE(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("--output /proc/strata-plot-test.svg"), std::string::npos) << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;  // one line

  r = Strata("plot " + good);  // --output is required
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_NE(r.out.find("--output"), std::string::npos) << r.out;
}

TEST_F(MetricsCliTest, PlotOnAFullDiskFails) {
  TempDir small("strata-plot-full");
  ASSERT_TRUE(small.ok());
  if (std::string why = small.Mount("tmpfs", "size=4k"); !why.empty()) GTEST_SKIP() << why;
  const std::string log = dir_.File("log.jsonl");
  {
    std::ofstream out(log);
    for (int step = 1; step <= 50; ++step) {
      out << json{{"step", step}, {"loss", 5.0 / step}, {"lr", 1e-4}}.dump() << "\n";
    }
  }
  const std::string svg = small.File("curves.svg");
  CliRun r = Strata("plot " + log + " --output " + svg);
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_NE(r.out.find("writing --output " + svg), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("No space left on device"), std::string::npos) << r.out;
  EXPECT_FALSE(std::filesystem::exists(svg));
  EXPECT_FALSE(std::filesystem::exists(svg + ".tmp"));
}

}  // namespace

namespace {

// Extreme values (issue: ±5e-324 looped for ever, 6.6 GB in 50 s): any finite values give a
// finite SVG at once, none drawn as nan; a step no run can count is refused naming its line.
TEST_F(MetricsCliTest, PlotOfExtremeValuesEndsWithAFiniteSvg) {
  const std::string svg = dir_.File("extreme.svg");
  const std::string log = dir_.File("extreme.jsonl");
  std::ofstream(log) << R"({"step": 1, "loss": -5e-324, "lr": 1e308, "tokens_per_second": 0}
{"step": 2, "loss": 5e-324, "lr": -1e308, "tokens_per_second": 1.7976931348623157e308}
{"step": 9223372036854775807, "loss": 4.9e-324, "lr": 1e-310, "nvme_read_bytes": 1e300}
)";
  CliRun r = Strata("plot " + log + " --output " + svg + " --json");
  ASSERT_EQ(r.rc, 0) << r.out;
  const std::string text = ReadFileOrEmpty(svg);
  ASSERT_FALSE(text.empty());
  EXPECT_LT(text.size(), 200000u);
  EXPECT_EQ(text.find("nan"), std::string::npos);
  EXPECT_EQ(text.find(">inf<"), std::string::npos);
  EXPECT_EQ(text.find("=\"inf"), std::string::npos);

  const std::string huge = dir_.File("huge-step.jsonl");
  std::ofstream(huge)
      << "{\"step\": 1, \"loss\": 2}\n{\"step\": 18446744073709551615, \"loss\": 1}\n";
  r = Strata("plot " + huge + " --output " + svg);
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_NE(r.out.find(huge + ":2: step 18446744073709551615"), std::string::npos) << r.out;
}

// Output paths: a directory, a FIFO or a symbolic link is not replaced, nor is one of the run's
// inputs (the log plotted; the training data or config under --trace and --log-json): each is
// refused naming the flag, and left as it was.
TEST_F(MetricsCliTest, OutputsThatAreNotRegularFilesOrAreInputsAreRefused) {
  const std::string log = dir_.File("good.jsonl");
  std::ofstream(log) << "{\"step\": 1, \"loss\": 2}\n";
  const std::string fifo = dir_.File("fifo"), link = dir_.File("link"), sub = dir_.File("sub");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  std::filesystem::create_symlink(log, link);
  std::filesystem::create_directory(sub);
  for (const std::string& target : {fifo, link, sub}) {
    CliRun r = Strata("plot " + log + " --output " + target);
    EXPECT_EQ(r.rc, 2) << target << "\n" << r.out;
    EXPECT_NE(r.out.find("--output"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(target), std::string::npos) << r.out;
  }
  EXPECT_TRUE(std::filesystem::is_fifo(fifo));
  EXPECT_TRUE(std::filesystem::is_symlink(link));
  EXPECT_TRUE(std::filesystem::is_directory(sub));
  CliRun r = Strata("plot " + log + " --output " + log);
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_NE(r.out.find("the log plotted"), std::string::npos) << r.out;
  EXPECT_EQ(ReadFileOrEmpty(log), "{\"step\": 1, \"loss\": 2}\n");

  SKIP_WITHOUT_TRAIN();
  const std::string data = ReadFileOrEmpty(dir_.File("data.txt"));
  const std::string config = ReadFileOrEmpty(dir_.File("ds.json"));
  for (const auto& [flag, target, input] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"--trace", dir_.File("data.txt"), "--data"},
           {"--log-json", dir_.File("ds.json"), "--config"},
           {"--log-json", fifo, "FIFO"},
           {"--trace", link, "symbolic link"}}) {
    r = Strata(Train("--steps 1 " + flag + " " + target));
    EXPECT_EQ(r.rc, 2) << flag << " " << target << "\n" << r.out;
    EXPECT_NE(r.out.find(flag), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(input), std::string::npos) << r.out;
  }
  EXPECT_EQ(ReadFileOrEmpty(dir_.File("data.txt")), data);
  EXPECT_EQ(ReadFileOrEmpty(dir_.File("ds.json")), config);
}

}  // namespace
