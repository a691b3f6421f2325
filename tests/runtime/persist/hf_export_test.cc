#include "runtime/persist/hf_export.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "cpu_optimizer/convert.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/persist/hf_checkpoint.h"
#include "runtime/persist/safetensors.h"
#include "tests/testing/temp_dir.h"

namespace strata::runtime {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

class TempDir : public strata::testing::TempDir {
 public:
  TempDir() : strata::testing::TempDir("strata-hfex-test") {}
};

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void WriteAll(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// The names in `dir`, sorted.
std::vector<std::string> Listing(const std::string& dir) {
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.insert(e.path().filename().string());
  return {names.begin(), names.end()};
}

// An independent reading of a safetensors file's header: (JSON, data start).
std::pair<nlohmann::json, size_t> Header(const std::string& path) {
  std::string f = ReadAll(path);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t{static_cast<uint8_t>(f[i])} << (8 * i);
  return {nlohmann::json::parse(f.substr(8, n)), 8 + n};
}

std::string Pattern(size_t n, uint32_t seed) {
  std::string s(n, '\0');
  uint32_t x = seed * 2654435761u + 7;
  for (char& c : s) {
    x = x * 1664525u + 1013904223u;
    c = static_cast<char>(x >> 24);
  }
  return s;
}

uint32_t Bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

// ---- ParseShardSize ---------------------------------------------------------------------------

TEST(ParseShardSizeTest, AcceptedForms) {
  auto ok = [](const std::string& text) {
    Result<uint64_t> r = ParseShardSize(text);
    EXPECT_TRUE(r.ok()) << text << ": " << r.status().ToString();
    return r.ok() ? *r : 0;
  };
  EXPECT_EQ(ok("5GB"), 5'000'000'000u);
  EXPECT_EQ(ok("500MB"), 500'000'000u);
  EXPECT_EQ(ok("10KB"), 10'000u);
  EXPECT_EQ(ok("2TB"), 2'000'000'000'000u);
  EXPECT_EQ(ok("5GiB"), 5ull << 30);
  EXPECT_EQ(ok("100MiB"), 100ull << 20);
  EXPECT_EQ(ok("3KiB"), 3072u);
  EXPECT_EQ(ok("1TiB"), 1ull << 40);
  EXPECT_EQ(ok("5gib"), 5ull << 30);  // transformers upper-cases the unit
  EXPECT_EQ(ok("5gB"), 5'000'000'000u);
  EXPECT_EQ(ok("123"), 123u);
  EXPECT_EQ(ok("  5GB\t"), 5'000'000'000u);
  EXPECT_EQ(ok("5 GB"), 5'000'000'000u);
  EXPECT_EQ(ok("1.5GB"), 1'500'000'000u);  // huggingface_hub takes fractions
  EXPECT_EQ(ok("0.5KiB"), 512u);
  EXPECT_EQ(ok(".25MB"), 250'000u);
  EXPECT_EQ(ok("1.0000001KB"), 1000u);  // rounded down, as int(float) does
  EXPECT_EQ(ok("18446744073709551615"), std::numeric_limits<uint64_t>::max());
}

TEST(ParseShardSizeTest, Refusals) {
  for (const std::string bad : {"", "  ", "GB", "5XB", "5 bytes", "-5GB", "5B", "1.5", ".", "0",
                                "0GB", "0.0001KB", "5Gb", "5gb", "5G B", "18446744073709551616",
                                "20000000TB", "99999999999999999999999999GB", "5GB5"}) {
    Result<uint64_t> r = ParseShardSize(bad);
    ASSERT_FALSE(r.ok()) << "'" << bad << "' parsed as " << *r;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(r.status().ToString(),
                AllOf(HasSubstr("'" + bad + "'"), HasSubstr("GiB"), HasSubstr("MB")));
  }
  EXPECT_THAT(ParseShardSize("5Gb").status().ToString(), HasSubstr("bits"));
}

// ---- Planning ---------------------------------------------------------------------------------

// F32 tensors of the given element counts, named t0, t1, ...
std::vector<HfExportTensor> F32Tensors(const std::vector<int64_t>& numels) {
  std::vector<HfExportTensor> out;
  for (size_t i = 0; i < numels.size(); ++i) {
    out.push_back({"t" + std::to_string(i), "F32", {numels[i]}});
  }
  return out;
}

TEST(HfExportPlanTest, HuggingfaceHubSplit) {
  TempDir tmp;
  // max 400 bytes; tensor bytes 160, 240, 4, 400, 404, 120.
  //   t0+t1 = 400 fits exactly; t2 starts shard 2; t3 (= max, not oversize) does not fit after
  //   t2, so it starts a new run; t4 (> max) is alone and numbered where it is met, before t3's
  //   run is closed; t5 does not fit after t3.
  auto w = HfExportWriter::Create(tmp.path(), F32Tensors({40, 60, 1, 100, 101, 30}), 400);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_THAT((*w)->shard_of(), ElementsAre(0, 0, 1, 3, 2, 4));
  ASSERT_EQ((*w)->files().size(), 5u);
  EXPECT_EQ((*w)->files()[0], tmp.File("model-00001-of-00005.safetensors"));
  EXPECT_EQ((*w)->files()[4], tmp.File("model-00005-of-00005.safetensors"));
}

TEST(HfExportPlanTest, BoundaryAndSingleShard) {
  TempDir tmp;
  // Exactly max: one shard, named model.safetensors.
  auto one = HfExportWriter::Create(tmp.path(), F32Tensors({25, 25, 50}), 400);
  ASSERT_TRUE(one.ok());
  EXPECT_THAT((*one)->files(), ElementsAre(tmp.File("model.safetensors")));
  EXPECT_THAT((*one)->shard_of(), ElementsAre(0, 0, 0));
  // One byte less: the last tensor moves on.
  auto two = HfExportWriter::Create(tmp.path(), F32Tensors({25, 25, 50}), 399);
  ASSERT_TRUE(two.ok());
  EXPECT_THAT((*two)->shard_of(), ElementsAre(0, 0, 1));
  // Every tensor oversize: one shard each. Zero-byte tensors join the current run.
  auto each = HfExportWriter::Create(tmp.path(), F32Tensors({10, 0, 10, 10}), 39);
  ASSERT_TRUE(each.ok());
  EXPECT_THAT((*each)->shard_of(), ElementsAre(0, 3, 1, 2));
  // No tensors at all: one empty model.safetensors.
  auto none = HfExportWriter::Create(tmp.path(), {}, 1);
  ASSERT_TRUE(none.ok());
  EXPECT_THAT((*none)->files(), ElementsAre(tmp.File("model.safetensors")));
}

TEST(HfExportPlanTest, CreateRefusesBadInput) {
  TempDir tmp;
  auto code = [&](std::vector<HfExportTensor> ts, uint64_t max = 100) {
    return HfExportWriter::Create(tmp.path(), std::move(ts), max).status().code();
  };
  EXPECT_EQ(code({{"a", "F32", {1}}, {"a", "F32", {1}}}), StatusCode::kInvalidArgument);
  EXPECT_EQ(code({{"", "F32", {1}}}), StatusCode::kInvalidArgument);
  EXPECT_EQ(code({{"__metadata__", "F32", {1}}}), StatusCode::kInvalidArgument);
  EXPECT_EQ(code({{"a", "F31", {1}}}), StatusCode::kInvalidArgument);
  EXPECT_EQ(code({{"a", "F32", {-1}}}), StatusCode::kInvalidArgument);
  EXPECT_EQ(code({{"a", "F32", {1ll << 40, 1ll << 40}}}), StatusCode::kInvalidArgument);
  EXPECT_EQ(code({{"a", "F32", {1}}}, 0), StatusCode::kInvalidArgument);
  EXPECT_EQ(HfExportWriter::Create("", {}, 1).status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Listing(tmp.path()).empty());
}

// ---- Writing ----------------------------------------------------------------------------------

TEST(HfExportTest, ShardNamesIndexAndHeaders) {
  TempDir tmp;
  const std::string dir = tmp.File("out/nested");                           // created
  std::vector<HfExportTensor> ts = {{"model.embed.weight", "F32", {4, 5}},  // 80 bytes
                                    {"model.norm.weight", "BF16", {10}},    // 20
                                    {"lm_head.weight", "F16", {30}}};       // 60
  auto w = HfExportWriter::Create(dir, ts, 100, {{"format", "pt"}, {"producer", "strata"}});
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  std::vector<std::string> data = {Pattern(80, 1), Pattern(20, 2), Pattern(60, 3)};
  for (size_t i = 0; i < ts.size(); ++i) {
    ASSERT_TRUE((*w)->WriteRaw(ts[i].name, data[i].data(), data[i].size()).ok());
  }
  EXPECT_FALSE(fs::exists(dir + "/model-00001-of-00002.safetensors"));  // nothing before Finish
  ASSERT_TRUE((*w)->Finish().ok());
  EXPECT_THAT(Listing(dir),
              ElementsAre("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                          "model.safetensors.index.json"));
  // Byte for byte what transformers' json.dumps(index, indent=2, sort_keys=True) + "\n" gives.
  EXPECT_EQ(ReadAll(dir + "/model.safetensors.index.json"),
            "{\n"
            "  \"metadata\": {\n"
            "    \"total_parameters\": 60,\n"
            "    \"total_size\": 160\n"
            "  },\n"
            "  \"weight_map\": {\n"
            "    \"lm_head.weight\": \"model-00002-of-00002.safetensors\",\n"
            "    \"model.embed.weight\": \"model-00001-of-00002.safetensors\",\n"
            "    \"model.norm.weight\": \"model-00001-of-00002.safetensors\"\n"
            "  }\n"
            "}\n");
  auto [h1, start1] = Header(dir + "/model-00001-of-00002.safetensors");
  EXPECT_EQ(h1["__metadata__"], nlohmann::json({{"format", "pt"}, {"producer", "strata"}}));
  EXPECT_EQ(h1["model.embed.weight"]["data_offsets"], nlohmann::json({0, 80}));
  EXPECT_EQ(h1["model.norm.weight"]["dtype"], "BF16");
  EXPECT_EQ(h1["model.norm.weight"]["data_offsets"], nlohmann::json({80, 100}));
  EXPECT_EQ(h1.size(), 3u);
  std::string f1 = ReadAll(dir + "/model-00001-of-00002.safetensors");
  EXPECT_EQ(f1.substr(start1), data[0] + data[1]);
  auto [h2, start2] = Header(dir + "/model-00002-of-00002.safetensors");
  EXPECT_EQ(h2["lm_head.weight"]["shape"], nlohmann::json({30}));
  EXPECT_EQ(ReadAll(dir + "/model-00002-of-00002.safetensors").substr(start2), data[2]);
}

TEST(HfExportTest, RoundTripThroughHfCheckpointIsByteIdentical) {
  TempDir tmp;
  std::vector<HfExportTensor> ts = {
      {"a", "F32", {1000}}, {"b", "BF16", {3, 333}}, {"c", "F16", {7}},     {"big", "F32", {3000}},
      {"step", "I64", {}},  {"mask", "BOOL", {5}},   {"empty", "F32", {0}}, {"z", "BF16", {100}}};
  auto w = HfExportWriter::Create(tmp.path(), ts, 4096);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  std::vector<std::string> data;
  for (size_t i = 0; i < ts.size(); ++i) {
    uint64_t n = SafetensorsDtypeSize(ts[i].dtype);
    for (int64_t d : ts[i].shape) n *= static_cast<uint64_t>(d);
    data.push_back(Pattern(n, static_cast<uint32_t>(i)));
    ASSERT_TRUE((*w)->WriteRaw(ts[i].name, data[i].data(), data[i].size()).ok()) << ts[i].name;
  }
  ASSERT_TRUE((*w)->Finish().ok());
  ASSERT_GT((*w)->files().size(), 2u);

  auto ck = HfCheckpoint::Open(tmp.path());
  ASSERT_TRUE(ck.ok()) << ck.status().ToString();
  ASSERT_EQ((*ck)->tensors().size(), ts.size());
  std::vector<std::string> sorted_files = (*w)->files();
  std::sort(sorted_files.begin(), sorted_files.end());
  EXPECT_EQ((*ck)->files(), sorted_files);
  for (size_t i = 0; i < ts.size(); ++i) {
    const HfTensorInfo* t = (*ck)->Find(ts[i].name);
    ASSERT_NE(t, nullptr) << ts[i].name;
    EXPECT_EQ(t->dtype, ts[i].dtype);
    EXPECT_EQ(t->shape, ts[i].shape);
    EXPECT_EQ(t->file, (*w)->files()[(*w)->shard_of()[i]]);
    std::string got(t->end - t->begin, '\0');
    ASSERT_TRUE((*ck)->ReadRaw(ts[i].name, got.data()).ok());
    EXPECT_TRUE(got == data[i]) << ts[i].name << ": bytes differ";
  }
  EXPECT_EQ((*ck)->dominant_dtype(), "F32");
}

TEST(HfExportTest, WriteFloat32RoundsToNearestEven) {
  TempDir tmp;
  // Over the 4 MiB staging (2M 16-bit values), plus hand-checked edge cases up front.
  const size_t n = 2'500'000;
  std::vector<float> v(n);
  const float edges[] = {1.0f,
                         1.00390625f /* 1+2^-8: bf16 tie -> even 0x3F80 */,
                         1.01171875f /* 1+3*2^-8: tie -> even 0x3F82 */,
                         65504.0f,
                         65520.0f,
                         -0.0f,
                         std::ldexp(1.0f, -24),
                         std::ldexp(1.0f, -25),
                         std::numeric_limits<float>::infinity(),
                         std::numeric_limits<float>::quiet_NaN(),
                         3.14159265f,
                         -1e-8f};
  std::memcpy(v.data(), edges, sizeof(edges));
  uint32_t x = 12345;
  for (size_t i = std::size(edges); i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    v[i] = std::ldexp(static_cast<float>(static_cast<int32_t>(x)), -static_cast<int>(x % 40) - 10);
  }
  std::vector<HfExportTensor> ts = {{"bf", "BF16", {static_cast<int64_t>(n)}},
                                    {"h", "F16", {static_cast<int64_t>(n)}},
                                    {"f", "F32", {static_cast<int64_t>(n)}}};
  auto w = HfExportWriter::Create(tmp.path(), ts, ParseShardSize("5GB").value());
  ASSERT_TRUE(w.ok());
  for (const auto& t : ts) ASSERT_TRUE((*w)->WriteFloat32(t.name, v.data(), n).ok()) << t.name;
  ASSERT_TRUE((*w)->Finish().ok());

  auto ck = HfCheckpoint::Open(tmp.path());
  ASSERT_TRUE(ck.ok()) << ck.status().ToString();
  std::vector<uint16_t> raw(n);
  ASSERT_TRUE((*ck)->ReadRaw("bf", raw.data()).ok());
  EXPECT_EQ(raw[0], 0x3F80);
  EXPECT_EQ(raw[1], 0x3F80);
  EXPECT_EQ(raw[2], 0x3F82);
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(raw[i], cpu_optimizer::FloatToBf16(v[i])) << i << ": " << v[i];
  }
  ASSERT_TRUE((*ck)->ReadRaw("h", raw.data()).ok());
  EXPECT_EQ(raw[0], 0x3C00);
  EXPECT_EQ(raw[3], 0x7BFF);  // 65504, the largest half
  EXPECT_EQ(raw[4], 0x7C00);  // 65520 rounds to inf
  EXPECT_EQ(raw[5], 0x8000);
  EXPECT_EQ(raw[6], 0x0001);  // 2^-24, the smallest subnormal
  EXPECT_EQ(raw[7], 0x0000);  // 2^-25: a tie, to even (zero)
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(raw[i], cpu_optimizer::FloatToHalf(v[i])) << i << ": " << v[i];
  }
  std::vector<float> f(n);
  ASSERT_TRUE((*ck)->ReadFloat32("f", f.data()).ok());
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(Bits(f[i]), Bits(v[i])) << i;
  ASSERT_TRUE((*ck)->ReadFloat32("bf", f.data()).ok());
  for (size_t i = 0; i < 1000; ++i) {
    ASSERT_EQ(Bits(f[i]), Bits(cpu_optimizer::Bf16ToFloat(cpu_optimizer::FloatToBf16(v[i])))) << i;
  }
}

TEST(HfExportTest, WritesOutOfOrderTwiceOrWrongAreRefusedAndHarmless) {
  TempDir tmp;
  std::vector<HfExportTensor> ts = {{"a", "F32", {4}}, {"b", "BF16", {2}}, {"ids", "I64", {1}}};
  auto w = HfExportWriter::Create(tmp.path(), ts, 1 << 20);
  ASSERT_TRUE(w.ok());
  float four[4] = {1, 2, 3, 4};
  auto& x = **w;
  Status s = x.WriteFloat32("b", four, 2);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.ToString(), HasSubstr("'a' comes next"));
  EXPECT_EQ(x.WriteFloat32("nope", four, 4).code(), StatusCode::kInvalidArgument);
  s = x.WriteFloat32("a", four, 3);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.ToString(), HasSubstr("holds 4 elements, 3 given"));
  EXPECT_EQ(x.WriteRaw("a", four, 15).code(), StatusCode::kInvalidArgument);
  s = x.Finish();
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.ToString(), HasSubstr("0 of 3 tensors written"));
  ASSERT_TRUE(x.WriteFloat32("a", four, 4).ok());
  EXPECT_EQ(x.WriteFloat32("a", four, 4).code(), StatusCode::kFailedPrecondition);  // twice
  ASSERT_TRUE(x.WriteFloat32("b", four, 2).ok());
  s = x.WriteFloat32("ids", four, 1);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.ToString(), AllOf(HasSubstr("'ids'"), HasSubstr("I64")));
  int64_t id = 7;
  ASSERT_TRUE(x.WriteRaw("ids", &id, 8).ok());
  ASSERT_TRUE(x.Finish().ok());
  EXPECT_EQ(x.Finish().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(x.WriteRaw("ids", &id, 8).code(), StatusCode::kFailedPrecondition);

  auto ck = HfCheckpoint::Open(tmp.path());
  ASSERT_TRUE(ck.ok()) << ck.status().ToString();
  std::vector<float> b(2);
  ASSERT_TRUE((*ck)->ReadFloat32("b", b.data()).ok());
  EXPECT_EQ(b, (std::vector<float>{1, 2}));
}

// A previous export of another shard count: its files go at Finish, unrelated files stay.
TEST(HfExportTest, ReplacesAPreviousExportAndRemovesItsLeftovers) {
  TempDir tmp;
  const std::string dir = tmp.path();
  for (const char* keep : {"config.json", "tokenizer.json", "model.fp16-00001-of-00002.safetensors",
                           "pytorch_model-00001-of-00002.bin", "model-1-of-2.safetensors"}) {
    WriteAll(dir + "/" + keep, "keep");
  }
  const std::vector<std::string> unrelated = {"config.json", "model-1-of-2.safetensors",
                                              "model.fp16-00001-of-00002.safetensors",
                                              "pytorch_model-00001-of-00002.bin", "tokenizer.json"};
  // Writes F32 tensors t0..t{count-1} of 10 floats valued `value`, in shards of `per` tensors.
  auto export_ = [&](int count, int per, float value) {
    std::vector<HfExportTensor> ts;
    for (int i = 0; i < count; ++i) ts.push_back({"t" + std::to_string(i), "F32", {10}});
    auto w = HfExportWriter::Create(dir, ts, static_cast<uint64_t>(40 * per));
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    std::vector<float> v(10, value);
    for (const auto& t : ts) ASSERT_TRUE((*w)->WriteFloat32(t.name, v.data(), 10).ok());
    ASSERT_TRUE((*w)->Finish().ok());
  };
  auto check = [&](int count, float value, std::vector<std::string> weight_files) {
    std::vector<std::string> want = unrelated;
    want.insert(want.end(), weight_files.begin(), weight_files.end());
    std::sort(want.begin(), want.end());
    EXPECT_EQ(Listing(dir), want);
    auto ck = HfCheckpoint::Open(dir);
    ASSERT_TRUE(ck.ok()) << ck.status().ToString();
    EXPECT_EQ((*ck)->tensors().size(), static_cast<size_t>(count));
    std::vector<float> got(10);
    ASSERT_TRUE((*ck)->ReadFloat32("t0", got.data()).ok());
    EXPECT_EQ(got[0], value);
  };
  export_(6, 2, 1.0f);
  check(6, 1.0f,
        {"model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
         "model-00003-of-00003.safetensors", "model.safetensors.index.json"});
  export_(6, 3, 2.0f);
  check(6, 2.0f,
        {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
         "model.safetensors.index.json"});
  export_(4, 4, 3.0f);  // single file: the shards and the index go
  check(4, 3.0f, {"model.safetensors"});
  export_(2, 1, 4.0f);  // sharded again: model.safetensors goes (transformers would load it first)
  check(2, 4.0f,
        {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
         "model.safetensors.index.json"});
  EXPECT_EQ(ReadAll(dir + "/config.json"), "keep");
}

TEST(HfExportTest, AnUnfinishedExportLeavesThePreviousOneIntact) {
  TempDir tmp;
  std::vector<HfExportTensor> ts = {{"a", "F32", {10}}, {"b", "F32", {10}}};
  std::vector<float> ones(10, 1.0f), twos(10, 2.0f);
  {
    auto w = HfExportWriter::Create(tmp.path(), ts, 40);
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE((*w)->WriteFloat32("a", ones.data(), 10).ok());
    ASSERT_TRUE((*w)->WriteFloat32("b", ones.data(), 10).ok());
    ASSERT_TRUE((*w)->Finish().ok());
  }
  const std::vector<std::string> before = Listing(tmp.path());
  const std::string shard1 = ReadAll(tmp.File("model-00001-of-00002.safetensors"));
  {
    auto w = HfExportWriter::Create(tmp.path(), ts, 40);
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE((*w)->WriteFloat32("a", twos.data(), 10).ok());  // shard 1 complete, not renamed
    EXPECT_TRUE(fs::exists(tmp.File("model-00001-of-00002.safetensors.tmp")));
  }                                        // abandoned
  EXPECT_EQ(Listing(tmp.path()), before);  // no .tmp left
  EXPECT_EQ(ReadAll(tmp.File("model-00001-of-00002.safetensors")), shard1);
}

TEST(HfExportTest, EmptyExportIsALoadableEmptyFile) {
  TempDir tmp;
  auto w = HfExportWriter::Create(tmp.path(), {}, 100);
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE((*w)->Finish().ok());
  EXPECT_THAT(Listing(tmp.path()), ElementsAre("model.safetensors"));
  auto [h, start] = Header(tmp.File("model.safetensors"));
  EXPECT_EQ(h, nlohmann::json({{"__metadata__", {{"format", "pt"}}}}));
  auto ck = HfCheckpoint::Open(tmp.path());
  ASSERT_TRUE(ck.ok()) << ck.status().ToString();
  EXPECT_TRUE((*ck)->tensors().empty());
  EXPECT_EQ((*ck)->dominant_dtype(), "");
}

}  // namespace
}  // namespace strata::runtime
