// DeepSpeed configs as real projects ship them (tests/data/deepspeed_configs, see its README.md):
// `strata train` must train on every file DeepSpeed accepts and refuse, cleanly and naming the
// key, every file DeepSpeed itself rejects. The expected outcome of each file is in expected.json.
// Files stay byte for byte as shipped; only "nvme_path" values are rewritten (textually) to a
// temporary directory, since the shipped paths (/local_nvme, ...) do not exist here.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "tests/testing/cli_run.h"

namespace {

namespace fs = std::filesystem;

using strata::testing::CliRun;
using strata::testing::Shell;

CliRun Strata(const std::string& args) { return Shell(std::string(STRATA_BINARY) + " " + args); }

std::string ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

const std::string kCorpus = STRATA_CONFIG_CORPUS;

struct Case {
  std::string file;
  bool trains = true;
  std::string key;  // for a refusal: the dotted key the error must name
};

// gtest prints the parameter of a failing test with this (instead of its bytes).
void PrintTo(const Case& c, std::ostream* os) {
  *os << c.file << (c.trains ? " (trains)" : " (refused: " + c.key + ")");
}

// expected.json, read once at startup (test registration); an unreadable file yields no cases,
// which the ExpectedCoversFolder test reports.
std::vector<Case> LoadCases() {
  std::vector<Case> cases;
  std::ifstream f(kCorpus + "/expected.json");
  if (!f) return cases;
  nlohmann::json j = nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return cases;
  for (auto& [file, e] : j.items()) {
    Case c;
    c.file = file;
    const std::string outcome = e.value("outcome", "");
    c.trains = outcome == "trains";
    if (!c.trains) c.key = e.value("key", "");
    cases.push_back(c);
  }
  return cases;
}

std::string TestName(const ::testing::TestParamInfo<Case>& info) {
  std::string n = info.param.file;
  if (n.size() > 5 && n.compare(n.size() - 5, 5, ".json") == 0) n.resize(n.size() - 5);
  for (char& ch : n)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return n;
}

// Every "nvme_path": "..." (at any depth) now names `dir`; the rest of the text is untouched.
std::string RewriteNvmePaths(const std::string& text, const std::string& dir) {
  static const std::regex re(R"re("nvme_path"\s*:\s*"[^"]*")re");
  return std::regex_replace(text, re, "\"nvme_path\": \"" + dir + "\"");
}

class ConfigCorpusTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/strata-config-corpus-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    fs::create_directories(dir_ + "/nvme");
    std::ofstream data(dir_ + "/data.txt");
    for (int i = 0; i < 400; ++i)
      data << "The quick brown fox " << i << " jumps over the lazy dog.\n";
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string dir_;
};

TEST_P(ConfigCorpusTest, AsDeepSpeedWould) {
  const Case& c = GetParam();
  const std::string src = kCorpus + "/" + c.file;
  ASSERT_TRUE(fs::is_regular_file(src)) << src << " is listed in expected.json but missing";
  const std::string shipped = ReadAll(src);
  ASSERT_FALSE(shipped.empty()) << src;
  const std::string copy = dir_ + "/" + c.file;
  {
    std::ofstream out(copy, std::ios::binary);
    out << RewriteNvmePaths(shipped, dir_ + "/nvme");
  }
  const CliRun r = Strata("train --config " + copy + " --model tiny --steps 2 --data " + dir_ +
                          "/data.txt --quiet");
  if (c.trains) {
    EXPECT_EQ(r.rc, 0) << c.file << ": DeepSpeed accepts this config, strata did not:\n" << r.out;
  } else {
    ASSERT_FALSE(c.key.empty()) << c.file << ": a refusal in expected.json needs a \"key\"";
    EXPECT_TRUE(r.rc == 1 || r.rc == 2)
        << c.file << ": expected a clean refusal (exit code 1 or 2), got rc=" << r.rc
        << (r.rc == 0       ? " (it trained)"
            : r.signal != 0 ? " (killed by signal " + std::to_string(r.signal) + ")"
                            : "")
        << ":\n"
        << r.out;
    EXPECT_NE(r.out.find(c.key), std::string::npos)
        << c.file << ": the error should name " << c.key << ":\n"
        << r.out;
  }
}

INSTANTIATE_TEST_SUITE_P(Corpus, ConfigCorpusTest, ::testing::ValuesIn(LoadCases()), TestName);

// Every .json file of the folder has an expected outcome, and every listed file exists.
TEST(ConfigCorpusFolder, ExpectedCoversFolder) {
  std::ifstream f(kCorpus + "/expected.json");
  ASSERT_TRUE(f) << kCorpus << "/expected.json is missing";
  nlohmann::json j = nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
  ASSERT_TRUE(j.is_object()) << "expected.json is not a JSON object";
  std::set<std::string> listed;
  for (auto& [file, e] : j.items()) {
    listed.insert(file);
    EXPECT_TRUE(fs::is_regular_file(kCorpus + "/" + file)) << file << " is listed but missing";
    const std::string outcome = e.value("outcome", "");
    EXPECT_TRUE(outcome == "trains" || outcome == "refused") << file << ": outcome " << outcome;
    if (outcome == "refused") {
      EXPECT_FALSE(e.value("key", "").empty()) << file;
    }
  }
  size_t files = 0;
  for (const auto& entry : fs::directory_iterator(kCorpus)) {
    const std::string name = entry.path().filename().string();
    if (entry.path().extension() != ".json" || name == "expected.json") continue;
    ++files;
    EXPECT_TRUE(listed.count(name)) << name << " has no expected outcome in expected.json";
  }
  EXPECT_GE(files, 30u);
}

}  // namespace
