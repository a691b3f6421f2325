#include "runtime/persist/checkpoint_store.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/temp_dir.h"

namespace strata::runtime {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

// The shared helper, with this suite's prefix.
class TempDir : public strata::testing::TempDir {
 public:
  TempDir() : strata::testing::TempDir("strata-ckpt-test") {}
};

std::vector<uint8_t> Pattern(size_t n, uint64_t seed) {
  std::vector<uint8_t> v(n);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 0x1234567;
  for (size_t i = 0; i < n; ++i) {
    if (i % 8 == 0) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
    }
    v[i] = static_cast<uint8_t>(x >> ((i % 8) * 8));
  }
  return v;
}

// Hidden names (temporary, swapped-out or deleting directories and files) in `root`.
std::vector<std::string> HiddenEntries(const std::string& root) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(root)) {
    std::string name = e.path().filename().string();
    if (!name.empty() && name[0] == '.') out.push_back(name);
  }
  return out;
}

std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
void WriteText(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  out << text;
}

// Saves a checkpoint whose content is a function of `step`, in chunks.
constexpr size_t kWeightBytes = 3 << 20;
constexpr size_t kMomentBytes = 512 << 10;

std::string TagFor(uint64_t step) { return "step" + std::to_string(step % 3); }

Status SaveStep(const std::string& root, uint64_t step) {
  STRATA_ASSIGN_OR_RETURN(auto w, CheckpointWriter::Begin(root, TagFor(step)));
  std::vector<uint8_t> weights = Pattern(kWeightBytes, step);
  STRATA_ASSIGN_OR_RETURN(EntryWriter * e, w->AddEntry("weights.bin"));
  for (size_t off = 0; off < weights.size(); off += 256 << 10) {
    STRATA_RETURN_IF_ERROR(
        e->Append(weights.data() + off, std::min<size_t>(256 << 10, weights.size() - off)));
  }
  std::vector<uint8_t> m = Pattern(kMomentBytes, step + 1000000);
  STRATA_ASSIGN_OR_RETURN(EntryWriter * me, w->AddEntry("optim/adam_m.bin"));
  STRATA_RETURN_IF_ERROR(me->Append(m.data(), m.size()));
  STRATA_RETURN_IF_ERROR(w->WriteJson("state.json", {{"step", step}, {"lr", 0.5 * step}}));
  return w->Commit();
}

// Checks that `root`'s latest checkpoint opens, verifies and holds a SaveStep(step); returns step.
uint64_t CheckLatest(const std::string& root) {
  auto r = CheckpointReader::Open(root);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  if (!r.ok()) return UINT64_MAX;
  Status v = r->Verify();
  EXPECT_TRUE(v.ok()) << v.ToString();
  auto state = r->ReadJson("state.json");
  EXPECT_TRUE(state.ok()) << state.status().ToString();
  if (!state.ok()) return UINT64_MAX;
  uint64_t step = (*state)["step"].get<uint64_t>();
  EXPECT_EQ(r->tag(), TagFor(step));
  std::vector<uint8_t> got(kWeightBytes);
  EXPECT_TRUE(r->ReadEntry("weights.bin", 0, got.data(), got.size()).ok());
  EXPECT_TRUE(got == Pattern(kWeightBytes, step)) << "weights of step " << step << " differ";
  std::vector<uint8_t> m(kMomentBytes);
  EXPECT_TRUE(r->ReadEntry("optim/adam_m.bin", 0, m.data(), m.size()).ok());
  EXPECT_TRUE(m == Pattern(kMomentBytes, step + 1000000)) << "moments of step " << step;
  return step;
}

// ---- Round trips -------------------------------------------------------------------------------

TEST(CheckpointStoreTest, RoundTrip) {
  TempDir tmp;
  ASSERT_FALSE(tmp.path().empty());
  const std::string root = tmp.path() + "/ckpts/run1";  // created by Begin
  std::vector<uint8_t> big = Pattern(3 * 1000 * 1000 + 17, 7);
  {
    auto w = CheckpointWriter::Begin(root, "global_step10");
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    auto e = (*w)->AddEntry("model/weights.bin");
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    // Irregular chunks.
    size_t off = 0, chunk = 1;
    while (off < big.size()) {
      size_t n = std::min(chunk, big.size() - off);
      ASSERT_TRUE((*e)->Append(big.data() + off, n).ok());
      off += n;
      chunk = chunk * 3 + 1;
    }
    EXPECT_EQ((*e)->size(), big.size());
    ASSERT_TRUE((*w)->AddEntry("empty.bin").ok());
    ASSERT_TRUE((*w)->WriteJson("client_state.json", {{"step", 10}, {"scale", 65536.0}}).ok());
    ASSERT_TRUE((*w)->Commit().ok());
  }
  EXPECT_EQ(ReadText(root + "/latest"), "global_step10");
  EXPECT_TRUE(HiddenEntries(root).empty());

  auto r = CheckpointReader::Open(root);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->tag(), "global_step10");
  EXPECT_THAT(r->entries(),
              ::testing::ElementsAre("model/weights.bin", "empty.bin", "client_state.json"));
  auto size = r->EntrySize("model/weights.bin");
  ASSERT_TRUE(size.ok());
  EXPECT_EQ(*size, big.size());
  EXPECT_EQ(*r->EntrySize("empty.bin"), 0u);
  EXPECT_EQ(r->EntrySize("nope").status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(r->Verify().ok());

  std::vector<uint8_t> got(big.size());
  ASSERT_TRUE(r->ReadEntry("model/weights.bin", 0, got.data(), got.size()).ok());
  EXPECT_TRUE(got == big);
  std::vector<uint8_t> part(1000);
  ASSERT_TRUE(r->ReadEntry("model/weights.bin", 123456, part.data(), part.size()).ok());
  EXPECT_TRUE(std::equal(part.begin(), part.end(), big.begin() + 123456));

  auto j = r->ReadJson("client_state.json");
  ASSERT_TRUE(j.ok()) << j.status().ToString();
  EXPECT_EQ((*j)["step"], 10);
  EXPECT_EQ((*j)["scale"], 65536.0);

  // Bounds.
  Status past = r->ReadEntry("model/weights.bin", big.size() - 10, part.data(), 11);
  EXPECT_EQ(past.code(), StatusCode::kOutOfRange);
  EXPECT_THAT(std::string(past.message()), HasSubstr("weights.bin"));
  EXPECT_EQ(r->ReadEntry("model/weights.bin", UINT64_MAX, part.data(), 2).code(),
            StatusCode::kOutOfRange);
  EXPECT_EQ(r->ReadEntry("empty.bin", 0, part.data(), 1).code(), StatusCode::kOutOfRange);

  // The same checkpoint by its tag.
  auto by_tag = CheckpointReader::Open(root, "global_step10");
  ASSERT_TRUE(by_tag.ok());
  EXPECT_EQ(by_tag->entries().size(), 3u);
}

TEST(CheckpointStoreTest, OverwriteSameTagAndLatestSwitching) {
  TempDir tmp;
  const std::string root = tmp.path();
  ASSERT_TRUE(SaveStep(root, 0).ok());  // tag step0
  ASSERT_TRUE(SaveStep(root, 1).ok());  // tag step1
  EXPECT_EQ(ReadText(root + "/latest"), "step1");
  EXPECT_EQ(CheckLatest(root), 1u);
  // The older one stays readable by tag.
  auto old = CheckpointReader::Open(root, "step0");
  ASSERT_TRUE(old.ok());
  EXPECT_EQ((*old->ReadJson("state.json"))["step"], 0);

  // Step 3 overwrites tag step0 (a non-empty directory) and becomes latest.
  ASSERT_TRUE(SaveStep(root, 3).ok());
  EXPECT_EQ(ReadText(root + "/latest"), "step0");
  EXPECT_EQ(CheckLatest(root), 3u);
  EXPECT_TRUE(HiddenEntries(root).empty()) << "the replaced directory was not deleted";
  // Overwriting the tag latest names, again.
  ASSERT_TRUE(SaveStep(root, 6).ok());
  EXPECT_EQ(CheckLatest(root), 6u);
  auto s1 = CheckpointReader::Open(root, "step1");
  ASSERT_TRUE(s1.ok());
  EXPECT_TRUE(s1->Verify().ok());
  EXPECT_TRUE(HiddenEntries(root).empty());
}

TEST(CheckpointStoreTest, AbandonedWriterLeavesPreviousCheckpoint) {
  TempDir tmp;
  const std::string root = tmp.path();
  ASSERT_TRUE(SaveStep(root, 1).ok());
  {
    auto w = CheckpointWriter::Begin(root, "step1");  // same tag, never committed
    ASSERT_TRUE(w.ok());
    EXPECT_TRUE(fs::is_directory((*w)->temp_dir()));
    auto e = (*w)->AddEntry("weights.bin");
    ASSERT_TRUE(e.ok());
    ASSERT_TRUE((*e)->Append("garbage", 7).ok());
  }
  EXPECT_TRUE(HiddenEntries(root).empty());
  EXPECT_EQ(CheckLatest(root), 1u);
}

TEST(CheckpointStoreTest, RejectsBadNames) {
  TempDir tmp;
  for (const char* tag : {"", ".hidden", "a/b", "latest", "..", "sp ace", "x\n"}) {
    auto w = CheckpointWriter::Begin(tmp.path(), tag);
    EXPECT_EQ(w.status().code(), StatusCode::kInvalidArgument) << "tag '" << tag << "'";
  }
  auto w = CheckpointWriter::Begin(tmp.path(), "ok_tag-1.0");
  ASSERT_TRUE(w.ok());
  for (const char* name :
       {"", "../x", "a//b", "/abs", "a/", "./a", "MANIFEST.json", "a b", "a\\b"}) {
    EXPECT_EQ((*w)->AddEntry(name).status().code(), StatusCode::kInvalidArgument)
        << "entry '" << name << "'";
  }
  ASSERT_TRUE((*w)->AddEntry("a/b").ok());
  EXPECT_EQ((*w)->AddEntry("a/b").status().code(), StatusCode::kAlreadyExists);
  EXPECT_EQ((*w)->AddEntry("a").status().code(), StatusCode::kAlreadyExists);        // a directory
  EXPECT_EQ((*w)->AddEntry("a/b/c").status().code(), StatusCode::kInvalidArgument);  // a file
  ASSERT_TRUE((*w)->AddEntry("a/c").ok());
  ASSERT_TRUE((*w)->Commit().ok());
  EXPECT_EQ((*w)->Commit().code(), StatusCode::kFailedPrecondition);
  auto r = CheckpointReader::Open(tmp.path(), "ok_tag-1.0");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_THAT(r->entries(), ::testing::ElementsAre("a/b", "a/c"));
  EXPECT_EQ(CheckpointReader::Open(tmp.path(), "../etc").status().code(),
            StatusCode::kInvalidArgument);
}

TEST(CheckpointStoreTest, PruneKeepsNewestLatestAndLiveWriters) {
  TempDir tmp;
  const std::string root = tmp.path();
  for (int i = 1; i <= 5; ++i) {
    auto w = CheckpointWriter::Begin(root, "s" + std::to_string(i));
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE((*w)->WriteJson("state.json", {{"i", i}}).ok());
    ASSERT_TRUE((*w)->Commit().ok());
  }
  fs::create_directory(root + "/notes");  // not a checkpoint: never touched
  ASSERT_TRUE(PruneCheckpoints(root, 2).ok());
  for (int i = 1; i <= 5; ++i) {
    EXPECT_EQ(fs::exists(root + "/s" + std::to_string(i)), i >= 4) << "s" << i;
  }
  EXPECT_TRUE(fs::exists(root + "/notes"));
  EXPECT_EQ(CheckpointReader::Open(root)->tag(), "s5");

  // `latest` names an older checkpoint: it survives even with keep = 0... and keep = 1.
  WriteText(root + "/latest", "s4\n");
  ASSERT_TRUE(PruneCheckpoints(root, 0).ok());
  EXPECT_TRUE(fs::exists(root + "/s4"));
  EXPECT_FALSE(fs::exists(root + "/s5"));
  EXPECT_EQ(CheckpointReader::Open(root)->tag(), "s4");

  // Stale temporaries: of a dead process, and of this process but no live writer; a live
  // writer's directory stays.
  pid_t dead = fork();
  if (dead == 0) _exit(0);
  ASSERT_GT(dead, 0);
  ASSERT_EQ(waitpid(dead, nullptr, 0), dead);
  const std::string stale1 = root + "/.s9.tmp-" + std::to_string(dead) + "-3";
  const std::string stale2 = root + "/.s9.tmp-" + std::to_string(getpid()) + "-999999";
  const std::string stale3 = root + "/.latest.tmp-" + std::to_string(dead) + "-1";
  fs::create_directories(stale1 + "/sub");
  fs::create_directories(stale2);
  WriteText(stale3, "s9");
  auto live = CheckpointWriter::Begin(root, "s6");
  ASSERT_TRUE(live.ok());
  ASSERT_TRUE(PruneCheckpoints(root, 1).ok());
  EXPECT_FALSE(fs::exists(stale1));
  EXPECT_FALSE(fs::exists(stale2));
  EXPECT_FALSE(fs::exists(stale3));
  EXPECT_TRUE(fs::is_directory((*live)->temp_dir()));
  ASSERT_TRUE((*live)->Commit().ok());
  EXPECT_EQ(CheckpointReader::Open(root)->tag(), "s6");
  EXPECT_EQ(PruneCheckpoints(root, -1).code(), StatusCode::kInvalidArgument);
}

TEST(CheckpointStoreTest, PruneRestoresACheckpointMovedAsideByADeadWriter) {
  TempDir tmp;
  const std::string root = tmp.path();
  ASSERT_TRUE(SaveStep(root, 1).ok());  // tag step1, named by latest
  pid_t dead = fork();
  if (dead == 0) _exit(0);
  ASSERT_GT(dead, 0);
  ASSERT_EQ(waitpid(dead, nullptr, 0), dead);
  // What a writer without RENAME_EXCHANGE leaves when killed between its two renames.
  const std::string aside = root + "/.step1.old-" + std::to_string(dead) + "-0";
  fs::rename(root + "/step1", aside);
  EXPECT_EQ(CheckpointReader::Open(root).status().code(), StatusCode::kNotFound);
  ASSERT_TRUE(PruneCheckpoints(root, 1).ok());
  EXPECT_FALSE(fs::exists(aside));
  EXPECT_EQ(CheckLatest(root), 1u);
}

// ---- Corruption --------------------------------------------------------------------------------

class CorruptCheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = tmp_.path();
    ASSERT_TRUE(SaveStep(root_, 1).ok());
    dir_ = root_ + "/" + TagFor(1);
  }
  Status OpenStatus() { return CheckpointReader::Open(root_).status(); }
  nlohmann::json Manifest() { return nlohmann::json::parse(ReadText(dir_ + "/MANIFEST.json")); }
  void SetManifest(const nlohmann::json& m) { WriteText(dir_ + "/MANIFEST.json", m.dump()); }
  void FlipByte(const std::string& path, off_t offset) {
    int fd = open(path.c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    unsigned char c;
    ASSERT_EQ(pread(fd, &c, 1, offset), 1);
    c ^= 0x10;
    ASSERT_EQ(pwrite(fd, &c, 1, offset), 1);
    close(fd);
  }

  TempDir tmp_;
  std::string root_, dir_;
};

TEST_F(CorruptCheckpointTest, TruncatedEntry) {
  fs::resize_file(dir_ + "/weights.bin", kWeightBytes - 100);
  Status s = OpenStatus();
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_THAT(s.ToString(),
              HasSubstr("weights.bin: truncated: expected " + std::to_string(kWeightBytes) +
                        " bytes, found " + std::to_string(kWeightBytes - 100)));
}

TEST_F(CorruptCheckpointTest, GrownEntry) {
  fs::resize_file(dir_ + "/optim/adam_m.bin", kMomentBytes + 1);
  EXPECT_THAT(OpenStatus().ToString(), HasSubstr("adam_m.bin: larger than the manifest says"));
}

TEST_F(CorruptCheckpointTest, FlippedByteCaughtByVerify) {
  FlipByte(dir_ + "/weights.bin", kWeightBytes / 2);
  auto r = CheckpointReader::Open(root_);
  ASSERT_TRUE(r.ok()) << r.status().ToString();  // sizes still match
  Status v = r->Verify();
  EXPECT_EQ(v.code(), StatusCode::kDataLoss);
  EXPECT_THAT(v.ToString(), HasSubstr("weights.bin: checksum mismatch"));
  EXPECT_TRUE(r->ReadJson("state.json").ok());  // other entries are fine
}

TEST_F(CorruptCheckpointTest, FlippedByteCaughtByReadJson) {
  FlipByte(dir_ + "/state.json", 3);
  auto r = CheckpointReader::Open(root_);
  ASSERT_TRUE(r.ok());
  auto j = r->ReadJson("state.json");
  EXPECT_EQ(j.status().code(), StatusCode::kDataLoss);
  EXPECT_THAT(j.status().ToString(), HasSubstr("state.json: checksum mismatch"));
  EXPECT_FALSE(r->Verify().ok());
}

TEST_F(CorruptCheckpointTest, MissingManifest) {
  fs::remove(dir_ + "/MANIFEST.json");
  Status s = OpenStatus();
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_THAT(s.ToString(), HasSubstr("MANIFEST.json: manifest missing"));
}

TEST_F(CorruptCheckpointTest, MissingEntry) {
  fs::remove(dir_ + "/optim/adam_m.bin");
  Status s = OpenStatus();
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_THAT(s.ToString(), HasSubstr("optim/adam_m.bin: entry missing"));
}

TEST_F(CorruptCheckpointTest, HugeSizesAreRefusedWithoutAllocating) {
  const nlohmann::json good = Manifest();
  nlohmann::json m = good;
  // Beyond any sane entry: malformed.
  m["entries"][0]["size"] = uint64_t{1} << 62;
  SetManifest(m);
  Status s = OpenStatus();
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_THAT(s.ToString(), HasSubstr("malformed at key entries[0].size"));
  // Large but within limits: the file is smaller, so truncated (nothing is allocated: under ASan
  // a 1 PiB allocation would abort).
  m["entries"][0]["size"] = kMaxEntryBytes;
  SetManifest(m);
  EXPECT_THAT(OpenStatus().ToString(),
              HasSubstr("truncated: expected " + std::to_string(kMaxEntryBytes) + " bytes"));
  // A JSON entry claiming a huge size with a matching (sparse) file: ReadJson refuses by size.
  m = good;
  for (auto& e : m["entries"]) {
    if (e["name"] == "state.json") e["size"] = kMaxJsonEntryBytes + 1;
  }
  SetManifest(m);
  fs::resize_file(dir_ + "/state.json", kMaxJsonEntryBytes + 1);
  auto r = CheckpointReader::Open(root_);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  auto j = r->ReadJson("state.json");
  EXPECT_EQ(j.status().code(), StatusCode::kDataLoss);
  EXPECT_THAT(j.status().ToString(), HasSubstr("more than the JSON entry limit"));
  // A huge manifest file (sparse): refused by its size before reading.
  fs::resize_file(dir_ + "/MANIFEST.json", kMaxManifestBytes + 1);
  EXPECT_THAT(OpenStatus().ToString(), HasSubstr("more than the limit"));
}

TEST_F(CorruptCheckpointTest, MalformedManifest) {
  nlohmann::json good = Manifest();
  WriteText(dir_ + "/MANIFEST.json", "{\"format\": ");
  EXPECT_THAT(OpenStatus().ToString(), HasSubstr("MANIFEST.json: not valid JSON"));
  struct Case {
    const char* pointer;
    nlohmann::json value;
    const char* key;
  };
  for (const Case& c : std::vector<Case>{{"/format", "other", "format"},
                                         {"/entries", 3, "entries"},
                                         {"/entries/1/size", -5, "entries[1].size"},
                                         {"/entries/1/size", "12", "entries[1].size"},
                                         {"/entries/0/xxh64", "xyz", "entries[0].xxh64"},
                                         {"/entries/2/name", "../../etc/passwd", "entries[2].name"},
                                         {"/entries/2/name", "weights.bin", "entries[2].name"}}) {
    nlohmann::json m = good;
    m[nlohmann::json::json_pointer(c.pointer)] = c.value;
    SetManifest(m);
    Status s = OpenStatus();
    EXPECT_EQ(s.code(), StatusCode::kDataLoss) << c.pointer;
    EXPECT_THAT(s.ToString(), HasSubstr(std::string("malformed at key ") + c.key)) << c.pointer;
  }
  nlohmann::json m = good;
  m["version"] = 99;
  SetManifest(m);
  EXPECT_THAT(OpenStatus().ToString(), HasSubstr("format version 99 is not supported"));
  SetManifest(good);
  EXPECT_TRUE(OpenStatus().ok());
}

TEST_F(CorruptCheckpointTest, WrongLatest) {
  WriteText(root_ + "/latest", "step2");
  Status s = OpenStatus();
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_THAT(s.ToString(), HasSubstr("step2 does not exist (named by"));
  WriteText(root_ + "/latest", "../../etc");
  EXPECT_THAT(OpenStatus().ToString(), HasSubstr("latest: does not hold a valid checkpoint tag"));
  WriteText(root_ + "/latest", "");
  EXPECT_EQ(OpenStatus().code(), StatusCode::kDataLoss);
  fs::remove(root_ + "/latest");
  s = OpenStatus();
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_THAT(s.ToString(), HasSubstr("latest does not exist"));
  // A directory without a manifest, named by latest (an interrupted copy, say).
  fs::create_directory(root_ + "/half");
  WriteText(root_ + "/latest", "half\n");
  EXPECT_THAT(OpenStatus().ToString(), HasSubstr("not a complete checkpoint"));
}

// ---- Write errors ------------------------------------------------------------------------------

TEST(CheckpointStoreTest, DiskFullLeavesPreviousCheckpoint) {
  TempDir tmp;
  std::string why = tmp.Mount("tmpfs", "size=6m");
  if (!why.empty()) GTEST_SKIP() << why << " (needs root or CAP_SYS_ADMIN)";
  const std::string root = tmp.path() + "/root";
  ASSERT_TRUE(SaveStep(root, 1).ok());  // ~3.5 MB of 6
  Status s = SaveStep(root, 2);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kIoError);
  EXPECT_EQ(s.sys_errno(), ENOSPC);
  EXPECT_THAT(s.ToString(), HasSubstr(".step2.tmp-"));  // names the file
  EXPECT_THAT(s.ToString(), HasSubstr("No space left on device"));
  EXPECT_TRUE(HiddenEntries(root).empty());
  EXPECT_EQ(CheckLatest(root), 1u);
}

// ---- Crash safety ------------------------------------------------------------------------------

const char* g_kill_phase = nullptr;
void KillAtPhase(const char* phase) {
  if (g_kill_phase != nullptr && std::strcmp(phase, g_kill_phase) == 0) raise(SIGKILL);
}

// Runs SaveStep(start), SaveStep(start+1), ... in a child, reporting each committed step on a
// pipe, until killed (by the parent after `delay`, or by itself at `phase` of its second save).
// Returns the largest step the child reported as committed, or -1.
int64_t RunAndKill(const std::string& root, uint64_t start, std::chrono::microseconds delay,
                   const char* phase) {
  int fds[2];
  EXPECT_EQ(pipe(fds), 0);
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    for (uint64_t s = start;; ++s) {
      if (phase != nullptr && s == start + 1) {
        g_kill_phase = phase;
        internal::SetCommitHookForTest(&KillAtPhase);
      }
      if (!SaveStep(root, s).ok()) _exit(2);
      if (write(fds[1], &s, sizeof(s)) != sizeof(s)) _exit(3);
      if (!PruneCheckpoints(root, 2).ok()) _exit(4);
    }
  }
  close(fds[1]);
  EXPECT_GT(pid, 0);
  if (phase == nullptr) {
    struct timespec ts = {static_cast<time_t>(delay.count() / 1000000),
                          static_cast<long>(delay.count() % 1000000) * 1000};
    nanosleep(&ts, nullptr);
    kill(pid, SIGKILL);
  }
  int wstatus = 0;
  EXPECT_EQ(waitpid(pid, &wstatus, 0), pid);
  EXPECT_TRUE(WIFSIGNALED(wstatus) && WTERMSIG(wstatus) == SIGKILL)
      << "child exited by itself with status " << wstatus;
  int64_t last = -1;
  uint64_t s;
  while (read(fds[0], &s, sizeof(s)) == sizeof(s)) last = static_cast<int64_t>(s);
  close(fds[0]);
  return last;
}

TEST(CheckpointCrashTest, SigkillAtRandomMomentsLeavesLatestLoadable) {
  TempDir tmp;
  const std::string root = tmp.path();
  ASSERT_TRUE(SaveStep(root, 0).ok());
  // The median of three saves, so one slow fsync does not stretch every delay.
  std::vector<std::chrono::microseconds> times;
  for (uint64_t step = 1; step <= 3; ++step) {
    auto t0 = std::chrono::steady_clock::now();
    ASSERT_TRUE(SaveStep(root, step).ok());
    times.push_back(std::chrono::duration_cast<std::chrono::microseconds>(
        std::chrono::steady_clock::now() - t0));
  }
  std::sort(times.begin(), times.end());
  auto save = times[1];
  save = std::max(save, std::chrono::microseconds(2000));
  const auto test_start = std::chrono::steady_clock::now();

  std::mt19937_64 rng(20261122);
  uint64_t latest = 3;
  int kills = 0, advanced = 0;
  constexpr int kKills = 48;
  for (int i = 0; i < kKills; ++i) {
    // Spread kills over the first two saves of the child (fork and start-up included).
    auto delay = std::chrono::microseconds(rng() % (2 * save.count() + 1));
    int64_t reported = RunAndKill(root, latest + 1, delay, nullptr);
    ++kills;
    uint64_t now = CheckLatest(root);
    ASSERT_NE(now, UINT64_MAX) << "after kill " << i << " (delay " << delay.count() << " us)";
    EXPECT_GE(now, latest) << "latest went backwards";
    if (reported >= 0) {
      EXPECT_GE(now, static_cast<uint64_t>(reported)) << "a reported commit was lost";
      EXPECT_LE(now, static_cast<uint64_t>(reported) + 1);
    } else {
      EXPECT_LE(now, latest + 1);
    }
    if (now > latest) ++advanced;
    latest = now;
  }
  EXPECT_EQ(kills, kKills);
  // Some kills landed after a commit (the delays reach past a whole save).
  EXPECT_GT(advanced, 0);
  ASSERT_TRUE(PruneCheckpoints(root, 2).ok());
  EXPECT_TRUE(HiddenEntries(root).empty()) << "stale temporaries of killed writers remain";
  RecordProperty("save_us", static_cast<int>(save.count()));
  RecordProperty("advanced", advanced);
  EXPECT_LT(std::chrono::steady_clock::now() - test_start, std::chrono::seconds(30));
}

TEST(CheckpointCrashTest, SigkillAtEveryCommitPhase) {
  TempDir tmp;
  const std::string root = tmp.path();
  ASSERT_TRUE(SaveStep(root, 0).ok());
  uint64_t latest = 0;
  for (const char* phase : {"entries_synced", "manifest_written", "dir_synced", "renamed",
                            "root_synced", "latest_written"}) {
    // The child commits latest+1, then dies in the middle of committing latest+2.
    int64_t reported = RunAndKill(root, latest + 1, {}, phase);
    ASSERT_EQ(reported, static_cast<int64_t>(latest + 1)) << phase;
    uint64_t now = CheckLatest(root);
    const bool visible = std::strcmp(phase, "latest_written") == 0;
    EXPECT_EQ(now, visible ? latest + 2 : latest + 1) << "killed at " << phase;
    latest = now;
  }
  ASSERT_TRUE(PruneCheckpoints(root, 3).ok());
  EXPECT_TRUE(HiddenEntries(root).empty());
  // Every checkpoint left under a tag is complete, committed or not yet named by latest.
  int complete = 0;
  for (const auto& e : fs::directory_iterator(root)) {
    if (!e.is_directory()) continue;
    auto r = CheckpointReader::Open(root, e.path().filename().string());
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_TRUE(r->Verify().ok());
    ++complete;
  }
  EXPECT_GE(complete, 2);
}

}  // namespace
}  // namespace strata::runtime
