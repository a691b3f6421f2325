// The TensorBoard event-file writer against the format: CRC-32C against RFC 3720's test vectors,
// and every file it writes decoded by tests/testing/tfevents_reader.h (its own bitwise CRC, its
// own protobuf decoding).
#include "runtime/metrics/event_file.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "base/file_util.h"
#include "tests/testing/cli_run.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/tfevents_reader.h"

namespace strata::metrics {
namespace {

using strata::testing::ReadFileOrEmpty;
using strata::testing::ReadTfEvents;
using strata::testing::TempDir;
using strata::testing::TfEvent;

// RFC 3720 B.4 (iSCSI) CRC-32C examples, plus the customary "123456789" check value.
struct CrcVector {
  std::string name;
  std::string data;
  uint32_t crc;
};
std::vector<CrcVector> Rfc3720Vectors() {
  std::string ascending, descending;
  for (int i = 0; i < 32; ++i) {
    ascending.push_back(static_cast<char>(i));
    descending.push_back(static_cast<char>(31 - i));
  }
  return {{"32 zeros", std::string(32, '\0'), 0x8A9136AAu},
          {"32 0xff", std::string(32, '\xff'), 0x62A8AB43u},
          {"ascending", ascending, 0x46DD794Eu},
          {"descending", descending, 0x113FDB5Cu},
          {"123456789", "123456789", 0xE3069283u}};
}

TEST(Crc32cTest, MatchesRfc3720Vectors) {
  for (const CrcVector& v : Rfc3720Vectors()) {
    EXPECT_EQ(Crc32c(v.data), v.crc) << v.name;
    // The test reader's own CRC is the oracle below: it must agree with the RFC too.
    EXPECT_EQ(strata::testing::BitwiseCrc32c(v.data), v.crc) << v.name;
  }
  EXPECT_EQ(Crc32c(""), 0u);
}

TEST(Crc32cTest, MaskIsTensorFlowsRotateAndAdd) {
  EXPECT_EQ(MaskCrc(0), 0xa282ead8u);
  const uint32_t crc = 0xE3069283u;
  EXPECT_EQ(MaskCrc(crc), ((crc >> 15) | (crc << 17)) + 0xa282ead8u);
  EXPECT_NE(MaskCrc(crc), crc);
}

TEST(EventFileTest, RecordFramingHasBothMaskedCrcs) {
  const std::string data = "some bytes of an event";
  const std::string rec = EncodeRecord(data);
  ASSERT_EQ(rec.size(), 8 + 4 + data.size() + 4);
  uint64_t length = 0;
  for (int i = 0; i < 8; ++i) length |= uint64_t{static_cast<unsigned char>(rec[i])} << (8 * i);
  EXPECT_EQ(length, data.size());
  auto u32 = [&](size_t at) {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= uint32_t{static_cast<unsigned char>(rec[at + i])} << (8 * i);
    return v;
  };
  EXPECT_EQ(u32(8), strata::testing::MaskedCrc32c(rec.substr(0, 8)));
  EXPECT_EQ(rec.substr(12, data.size()), data);
  EXPECT_EQ(u32(12 + data.size()), strata::testing::MaskedCrc32c(data));
}

TEST(EventFileTest, ScalarEventDecodes) {
  const std::string bytes = EncodeRecord(EncodeScalarEvent(1700000000.25, 42, "train/loss", 2.5f));
  std::vector<TfEvent> events;
  ASSERT_EQ(ReadTfEvents(bytes, &events), "");
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].wall_time, 1700000000.25);
  EXPECT_EQ(events[0].step, 42);
  ASSERT_EQ(events[0].values.size(), 1u);
  EXPECT_EQ(events[0].values[0].tag, "train/loss");
  EXPECT_EQ(events[0].values[0].simple_value, 2.5f);
  // Steps beyond 32 bits take multi-byte varints.
  events.clear();
  ASSERT_EQ(ReadTfEvents(EncodeRecord(EncodeScalarEvent(1, int64_t{1} << 40, "t", 1)), &events),
            "");
  EXPECT_EQ(events.at(0).step, int64_t{1} << 40);
}

TEST(EventFileTest, WriterProducesAFileTensorBoardReads) {
  TempDir dir("strata-events");
  ASSERT_TRUE(dir.ok());
  const double before =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  Result<EventFileWriter> w = EventFileWriter::Create(dir.File("runs/a"));
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  char host[256] = {};
  ASSERT_EQ(::gethostname(host, sizeof(host) - 1), 0);
  const std::string name = std::filesystem::path(w->path()).filename().string();
  // events.out.tfevents.<10-digit unix time>.<hostname>
  const std::string prefix = "events.out.tfevents.";
  ASSERT_EQ(name.substr(0, prefix.size()), prefix) << name;
  const std::string rest = name.substr(prefix.size());
  ASSERT_GT(rest.size(), 11u) << name;
  EXPECT_TRUE(std::all_of(rest.begin(), rest.begin() + 10, [](char c) {
    return c >= '0' && c <= '9';
  })) << name;
  EXPECT_EQ(rest.substr(10), "." + std::string(host)) << name;
  ASSERT_TRUE(w->WriteScalars(1, {{"train/loss", 3.25f}, {"train/learning_rate", 1e-4f}}).ok());
  ASSERT_TRUE(w->WriteScalars(2, {{"train/loss", NAN}}).ok());
  // Written through: readable before Close.
  std::vector<TfEvent> events;
  ASSERT_EQ(ReadTfEvents(ReadFileOrEmpty(w->path()), &events), "");
  ASSERT_TRUE(w->Close().ok());
  ASSERT_EQ(events.size(), 4u);
  EXPECT_EQ(events[0].file_version, "brain.Event:2");
  EXPECT_FALSE(events[0].has_summary);
  EXPECT_GE(events[0].wall_time, std::floor(before));
  EXPECT_LT(events[0].wall_time, before + 60);
  EXPECT_EQ(events[1].step, 1);
  EXPECT_EQ(events[1].values.at(0).tag, "train/loss");
  EXPECT_EQ(events[1].values.at(0).simple_value, 3.25f);
  EXPECT_EQ(events[2].step, 1);
  EXPECT_EQ(events[2].values.at(0).tag, "train/learning_rate");
  EXPECT_EQ(events[2].values.at(0).simple_value, 1e-4f);
  EXPECT_EQ(events[3].step, 2);
  EXPECT_TRUE(std::isnan(events[3].values.at(0).simple_value));
  for (const TfEvent& e : events) EXPECT_GE(e.wall_time, events[0].wall_time);
}

TEST(EventFileTest, ReaderCatchesACorruptByte) {
  TempDir dir("strata-events");
  ASSERT_TRUE(dir.ok());
  Result<EventFileWriter> w = EventFileWriter::Create(dir.path());
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  ASSERT_TRUE(w->WriteScalars(7, {{"train/loss", 1.0f}}).ok());
  std::string bytes = ReadFileOrEmpty(w->path());
  bytes[bytes.size() - 6] ^= 0x01;  // inside the last record's data
  std::vector<TfEvent> events;
  EXPECT_NE(ReadTfEvents(bytes, &events).find("bad data CRC"), std::string::npos);
}

TEST(EventFileTest, ANewWriterNeverReusesAFile) {
  TempDir dir("strata-events");
  ASSERT_TRUE(dir.ok());
  std::vector<std::string> paths;
  std::vector<EventFileWriter> writers;
  for (int i = 0; i < 3; ++i) {  // within one second: the same time stamp
    Result<EventFileWriter> w = EventFileWriter::Create(dir.path());
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    ASSERT_TRUE(w->WriteScalars(i, {{"x", static_cast<float>(i)}}).ok());
    paths.push_back(w->path());
    writers.push_back(std::move(*w));
  }
  EXPECT_NE(paths[0], paths[1]);
  EXPECT_NE(paths[1], paths[2]);
  EXPECT_NE(paths[0], paths[2]);
  for (int i = 0; i < 3; ++i) {
    std::vector<TfEvent> events;
    ASSERT_EQ(ReadTfEvents(ReadFileOrEmpty(paths[i]), &events), "");
    ASSERT_EQ(events.size(), 2u) << paths[i];
    EXPECT_EQ(events[1].step, i);
  }
}

TEST(EventFileTest, ErrorsNameThePath) {
  TempDir dir("strata-events");
  ASSERT_TRUE(dir.ok());
  const std::string file = dir.File("plain");
  ASSERT_TRUE(WriteFileAtomically(dir.path(), "plain", "x").ok());
  Result<EventFileWriter> w = EventFileWriter::Create(file);
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find(file), std::string::npos) << w.status().ToString();
  w = EventFileWriter::Create("/proc/strata-no-such-dir");
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("/proc/strata-no-such-dir"), std::string::npos)
      << w.status().ToString();
}

TEST(EventFileTest, DiskFullIsAnErrorNamingTheFile) {
  TempDir dir("strata-events-full");
  ASSERT_TRUE(dir.ok());
  if (std::string why = dir.Mount("tmpfs", "size=4k"); !why.empty()) GTEST_SKIP() << why;
  Result<EventFileWriter> w = EventFileWriter::Create(dir.path());
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  Status s;
  for (int step = 1; step <= 1000 && s.ok(); ++step)
    s = w->WriteScalars(step, {{"a", 1}, {"b", 2}});
  ASSERT_FALSE(s.ok()) << "4 KiB of tmpfs never filled";
  EXPECT_NE(s.message().find(w->path()), std::string::npos) << s.ToString();
  EXPECT_EQ(s.sys_errno(), ENOSPC) << s.ToString();
}

}  // namespace
}  // namespace strata::metrics
