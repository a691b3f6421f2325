#include "runtime/persist/hf_checkpoint.h"

#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "cpu_optimizer/convert.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/temp_dir.h"

namespace strata::runtime {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

class TempDir : public strata::testing::TempDir {
 public:
  TempDir() : strata::testing::TempDir("strata-hfck-test") {}
};

void WriteAll(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// ---- safetensors files written by hand (nothing from runtime/persist) --------------------------

struct RawTensor {
  std::string name, dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};

// u64 little-endian header length, the JSON header, the tensors' bytes back to back.
std::string StFile(const std::vector<RawTensor>& tensors) {
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  h["__metadata__"] = {{"format", "pt"}};
  uint64_t off = 0;
  std::string data;
  for (const RawTensor& t : tensors) {
    h[t.name] = {
        {"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {off, off + t.bytes.size()}}};
    off += t.bytes.size();
    data += t.bytes;
  }
  const std::string json = h.dump();
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(uint64_t{json.size()} >> (8 * i));
  return out + json + data;
}

template <typename T>
std::string Bytes(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

std::vector<float> Floats(size_t n, float scale) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = scale * static_cast<float>(i) - 3.25f;
  return v;
}

void WriteIndex(const std::string& dir, const nlohmann::json& weight_map) {
  nlohmann::json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", weight_map}};
  WriteAll(dir + "/model.safetensors.index.json", index.dump(2));
}

uint32_t Bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

// ---- Opening ----------------------------------------------------------------------------------

TEST(HfCheckpointTest, SingleFile) {
  TempDir tmp;
  ASSERT_TRUE(tmp.ok());
  std::vector<float> w = Floats(6, 0.5f);
  std::vector<uint16_t> b = {0x3F80, 0xC000, 0x0000};  // bf16: 1, -2, 0
  std::vector<int64_t> step = {42};
  WriteAll(tmp.File("model.safetensors"), StFile({{"z.weight", "F32", {2, 3}, Bytes(w)},
                                                  {"a.bias", "BF16", {3}, Bytes(b)},
                                                  {"step", "I64", {}, Bytes(step)}}));
  auto ck = HfCheckpoint::Open(tmp.path() + "/");  // a trailing '/' is fine
  ASSERT_TRUE(ck.ok()) << ck.status().ToString();
  const std::string file = tmp.File("model.safetensors");
  EXPECT_THAT((*ck)->files(), ElementsAre(file));
  const auto& ts = (*ck)->tensors();
  ASSERT_EQ(ts.size(), 3u);
  EXPECT_EQ(ts[0].name, "a.bias");  // sorted by name, not by offset
  EXPECT_EQ(ts[1].name, "step");
  EXPECT_EQ(ts[2].name, "z.weight");
  EXPECT_EQ(ts[2].dtype, "F32");
  EXPECT_EQ(ts[2].shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(ts[2].numel(), 6u);
  EXPECT_EQ(ts[1].numel(), 1u);  // a scalar
  EXPECT_EQ(ts[2].file, file);
  EXPECT_EQ(ts[2].end - ts[2].begin, 24u);
  EXPECT_EQ(ts[0].begin, ts[2].end);  // the file's data order: z.weight, a.bias, step
  EXPECT_EQ(ts[1].end, fs::file_size(file));
  EXPECT_EQ((*ck)->Find("z.weight"), &ts[2]);
  EXPECT_EQ((*ck)->Find("nope"), nullptr);
  EXPECT_EQ((*ck)->dominant_dtype(), "F32");  // 24 bytes of F32, 8 of I64, 6 of BF16

  std::vector<float> got(6);
  ASSERT_TRUE((*ck)->ReadFloat32("z.weight", got.data()).ok());
  EXPECT_EQ(got, w);
  std::vector<float> bias(3);
  ASSERT_TRUE((*ck)->ReadFloat32("a.bias", bias.data()).ok());
  EXPECT_EQ(bias, (std::vector<float>{1.0f, -2.0f, 0.0f}));
  int64_t s = 0;
  ASSERT_TRUE((*ck)->ReadRaw("step", &s).ok());
  EXPECT_EQ(s, 42);
  EXPECT_EQ((*ck)->ReadRaw("nope", &s).code(), StatusCode::kNotFound);
}

TEST(HfCheckpointTest, ShardedWithIndex) {
  TempDir tmp;
  std::vector<float> a = Floats(10, 1.0f), c = Floats(4, -2.0f);
  std::vector<uint16_t> bh = {0x3C00, 0x7BFF, 0x0001, 0xC000};  // f16: 1, 65504, 2^-24, -2
  WriteAll(tmp.File("model-00001-of-00002.safetensors"),
           StFile({{"a", "F32", {10}, Bytes(a)}, {"b", "F16", {2, 2}, Bytes(bh)}}));
  WriteAll(tmp.File("model-00002-of-00002.safetensors"), StFile({{"c", "F32", {4}, Bytes(c)}}));
  WriteIndex(tmp.path(), {{"a", "model-00001-of-00002.safetensors"},
                          {"b", "model-00001-of-00002.safetensors"},
                          {"c", "model-00002-of-00002.safetensors"}});
  auto ck = HfCheckpoint::Open(tmp.path());
  ASSERT_TRUE(ck.ok()) << ck.status().ToString();
  EXPECT_THAT((*ck)->files(), ElementsAre(tmp.File("model-00001-of-00002.safetensors"),
                                          tmp.File("model-00002-of-00002.safetensors")));
  ASSERT_EQ((*ck)->tensors().size(), 3u);
  EXPECT_EQ((*ck)->Find("c")->file, tmp.File("model-00002-of-00002.safetensors"));
  EXPECT_EQ((*ck)->Find("b")->file, tmp.File("model-00001-of-00002.safetensors"));
  std::vector<float> got(10);
  ASSERT_TRUE((*ck)->ReadFloat32("c", got.data()).ok());
  EXPECT_EQ(std::vector<float>(got.begin(), got.begin() + 4), c);
  ASSERT_TRUE((*ck)->ReadFloat32("b", got.data()).ok());
  EXPECT_EQ(got[0], 1.0f);
  EXPECT_EQ(got[1], 65504.0f);
  EXPECT_EQ(got[2], std::ldexp(1.0f, -24));
  EXPECT_EQ(got[3], -2.0f);
  ASSERT_TRUE((*ck)->ReadFloat32("a", got.data()).ok());
  EXPECT_EQ(got, a);
}

TEST(HfCheckpointTest, SymlinkedShardsAsInTheHubCache) {
  TempDir tmp;
  fs::create_directories(tmp.File("blobs"));
  fs::create_directories(tmp.File("snapshot"));
  std::vector<float> a = Floats(3, 1.0f);
  WriteAll(tmp.File("blobs/1234"), StFile({{"a", "F32", {3}, Bytes(a)}}));
  fs::create_symlink("../blobs/1234", tmp.File("snapshot/model.safetensors"));
  auto ck = HfCheckpoint::Open(tmp.File("snapshot"));
  ASSERT_TRUE(ck.ok()) << ck.status().ToString();
  std::vector<float> got(3);
  ASSERT_TRUE((*ck)->ReadFloat32("a", got.data()).ok());
  EXPECT_EQ(got, a);
}

// transformers' from_pretrained checks model.safetensors before the index.
TEST(HfCheckpointTest, SingleFileWinsOverIndex) {
  TempDir tmp;
  WriteAll(tmp.File("model.safetensors"), StFile({{"single", "F32", {1}, Bytes(Floats(1, 1))}}));
  WriteAll(tmp.File("model-00001-of-00001.safetensors"),
           StFile({{"sharded", "F32", {1}, Bytes(Floats(1, 1))}}));
  WriteIndex(tmp.path(), {{"sharded", "model-00001-of-00001.safetensors"}});
  auto ck = HfCheckpoint::Open(tmp.path());
  ASSERT_TRUE(ck.ok()) << ck.status().ToString();
  ASSERT_EQ((*ck)->tensors().size(), 1u);
  EXPECT_EQ((*ck)->tensors()[0].name, "single");
}

TEST(HfCheckpointTest, ConversionsAreExactForEverySixteenBitPattern) {
  TempDir tmp;
  std::vector<uint16_t> all(65536);
  for (uint32_t i = 0; i < 65536; ++i) all[i] = static_cast<uint16_t>(i);
  // Bigger than one 8 MiB read chunk: 4.5M elements of 2 bytes, 3M floats.
  std::vector<uint16_t> big(4'500'000);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<uint16_t>(i * 40503u);
  std::vector<float> big32(3'000'000);
  for (size_t i = 0; i < big32.size(); ++i) big32[i] = static_cast<float>(i) * 1e-3f;
  WriteAll(tmp.File("model.safetensors"), StFile({{"bf16", "BF16", {65536}, Bytes(all)},
                                                  {"f16", "F16", {256, 256}, Bytes(all)},
                                                  {"big", "BF16", {4'500'000}, Bytes(big)},
                                                  {"big32", "F32", {3'000'000}, Bytes(big32)}}));
  auto ck = HfCheckpoint::Open(tmp.path());
  ASSERT_TRUE(ck.ok()) << ck.status().ToString();
  EXPECT_EQ((*ck)->dominant_dtype(), "F32");  // 12 MB of F32, 9.26 MB of BF16
  std::vector<float> got(65536);
  ASSERT_TRUE((*ck)->ReadFloat32("bf16", got.data()).ok());
  for (uint32_t i = 0; i < 65536; ++i) {
    ASSERT_EQ(Bits(got[i]), Bits(cpu_optimizer::Bf16ToFloat(static_cast<uint16_t>(i)))) << i;
    ASSERT_EQ(Bits(got[i]), i << 16) << i;  // bf16 is the top half of a float, always
  }
  ASSERT_TRUE((*ck)->ReadFloat32("f16", got.data()).ok());
  for (uint32_t i = 0; i < 65536; ++i) {
    ASSERT_EQ(Bits(got[i]), Bits(cpu_optimizer::HalfToFloat(static_cast<uint16_t>(i)))) << i;
  }
  EXPECT_EQ(got[0x3C00], 1.0f);
  EXPECT_EQ(got[0xBC00], -1.0f);
  EXPECT_EQ(got[0x3555], 0.333251953125f);
  EXPECT_EQ(got[0x03FF], std::ldexp(1023.0f, -24));  // the largest subnormal
  EXPECT_TRUE(std::isinf(got[0x7C00]) && got[0x7C00] > 0);
  EXPECT_TRUE(std::isnan(got[0x7E00]));

  std::vector<float> g(big.size());
  ASSERT_TRUE((*ck)->ReadFloat32("big", g.data()).ok());
  for (size_t i = 0; i < big.size(); ++i) {
    ASSERT_EQ(Bits(g[i]), uint32_t{big[i]} << 16) << i;
  }
  std::vector<float> g32(big32.size());
  ASSERT_TRUE((*ck)->ReadFloat32("big32", g32.data()).ok());
  EXPECT_EQ(g32, big32);
  std::vector<uint16_t> raw(big.size());
  ASSERT_TRUE((*ck)->ReadRaw("big", raw.data()).ok());
  EXPECT_EQ(raw, big);
}

TEST(HfCheckpointTest, ConcurrentReadsAgree) {
  TempDir tmp;
  std::vector<float> a = Floats(1 << 20, 0.25f);
  std::vector<uint16_t> b(1 << 20);
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<uint16_t>(i * 7);
  WriteAll(tmp.File("model.safetensors"),
           StFile({{"a", "F32", {1 << 20}, Bytes(a)}, {"b", "BF16", {1 << 20}, Bytes(b)}}));
  auto ck = HfCheckpoint::Open(tmp.path());
  ASSERT_TRUE(ck.ok()) << ck.status().ToString();
  const HfCheckpoint& c = **ck;
  std::vector<int> bad(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&c, &a, &b, &bad, t] {
      std::vector<float> out(1 << 20);
      for (int round = 0; round < 3; ++round) {
        const bool read_a = (t + round) % 2 == 0;
        if (!c.ReadFloat32(read_a ? "a" : "b", out.data()).ok()) ++bad[t];
        for (size_t i = 0; i < out.size(); ++i) {
          const float want = read_a ? a[i] : cpu_optimizer::Bf16ToFloat(b[i]);
          if (Bits(out[i]) != Bits(want)) {
            ++bad[t];
            break;
          }
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad, (std::vector<int>{0, 0, 0, 0}));
}

// ---- Refusals ---------------------------------------------------------------------------------

class HfCheckpointRefusalTest : public ::testing::Test {
 protected:
  // Shard A holds a, b; shard B holds c (F32 scalars and vectors).
  void WriteShards() {
    WriteAll(A(), StFile({{"a", "F32", {2}, Bytes(Floats(2, 1))},
                          {"b", "F32", {1}, Bytes(Floats(1, 1))}}));
    WriteAll(B(), StFile({{"c", "F32", {3}, Bytes(Floats(3, 1))}}));
  }
  std::string A() const { return tmp_.File("model-00001-of-00002.safetensors"); }
  std::string B() const { return tmp_.File("model-00002-of-00002.safetensors"); }
  nlohmann::json GoodMap() const {
    return {{"a", "model-00001-of-00002.safetensors"},
            {"b", "model-00001-of-00002.safetensors"},
            {"c", "model-00002-of-00002.safetensors"}};
  }
  Status Open() { return HfCheckpoint::Open(tmp_.path()).status(); }
  TempDir tmp_;
};

TEST_F(HfCheckpointRefusalTest, BaselineOpens) {
  WriteShards();
  WriteIndex(tmp_.path(), GoodMap());
  EXPECT_TRUE(Open().ok()) << Open().ToString();
}

TEST_F(HfCheckpointRefusalTest, NeitherFile) {
  Status s = Open();
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_THAT(s.ToString(), AllOf(HasSubstr(tmp_.path()), HasSubstr("model.safetensors"),
                                  HasSubstr("model.safetensors.index.json")));
  s = HfCheckpoint::Open(tmp_.File("does-not-exist")).status();
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_THAT(s.ToString(), HasSubstr("does-not-exist"));
}

TEST_F(HfCheckpointRefusalTest, TruncatedShard) {
  WriteShards();
  WriteIndex(tmp_.path(), GoodMap());
  fs::resize_file(B(), fs::file_size(B()) - 1);
  Status s = Open();
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_THAT(s.ToString(), HasSubstr(B()));
  // Single file, cut inside the header.
  TempDir single;
  WriteAll(single.File("model.safetensors"), StFile({{"a", "F32", {2}, Bytes(Floats(2, 1))}}));
  fs::resize_file(single.File("model.safetensors"), 20);
  s = HfCheckpoint::Open(single.path()).status();
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_THAT(s.ToString(), HasSubstr(single.File("model.safetensors")));
}

TEST_F(HfCheckpointRefusalTest, IndexedTensorMissingFromItsShard) {
  WriteShards();
  nlohmann::json map = GoodMap();
  map["d"] = "model-00002-of-00002.safetensors";
  WriteIndex(tmp_.path(), map);
  Status s = Open();
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_THAT(s.ToString(),
              AllOf(HasSubstr("tensor 'd'"), HasSubstr(B()), HasSubstr("does not hold it")));
}

TEST_F(HfCheckpointRefusalTest, TensorInAnotherShardThanIndexed) {
  WriteShards();
  nlohmann::json map = GoodMap();
  map["c"] = "model-00001-of-00002.safetensors";
  map["extra"] = "model-00002-of-00002.safetensors";  // keeps shard B named
  WriteAll(B(), StFile({{"c", "F32", {3}, Bytes(Floats(3, 1))},
                        {"extra", "F32", {1}, Bytes(Floats(1, 1))}}));
  WriteIndex(tmp_.path(), map);
  Status s = Open();
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_THAT(s.ToString(), AllOf(HasSubstr("tensor 'c'"), HasSubstr(A()), HasSubstr(B())));
}

TEST_F(HfCheckpointRefusalTest, TensorTheIndexDoesNotList) {
  WriteShards();
  nlohmann::json map = GoodMap();
  map.erase("b");
  WriteIndex(tmp_.path(), map);
  Status s = Open();
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_THAT(s.ToString(),
              AllOf(HasSubstr("tensor 'b'"), HasSubstr(A()), HasSubstr("does not list")));
}

TEST_F(HfCheckpointRefusalTest, SameTensorInTwoShards) {
  WriteShards();
  WriteAll(B(), StFile({{"c", "F32", {3}, Bytes(Floats(3, 1))},
                        {"a", "F32", {2}, Bytes(Floats(2, 1))}}));
  WriteIndex(tmp_.path(), GoodMap());
  Status s = Open();
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_THAT(s.ToString(),
              AllOf(HasSubstr("tensor 'a' is in two shards"), HasSubstr(A()), HasSubstr(B())));
}

TEST_F(HfCheckpointRefusalTest, MissingShardFile) {
  WriteShards();
  fs::remove(B());
  WriteIndex(tmp_.path(), GoodMap());
  Status s = Open();
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_THAT(s.ToString(), AllOf(HasSubstr(B()), HasSubstr("tensor 'c'")));
}

TEST_F(HfCheckpointRefusalTest, ShardNamesMustStayInTheDirectory) {
  WriteShards();
  // A real file outside the directory: the reader must not even look at it.
  fs::create_directories(tmp_.File("sub"));
  WriteAll(tmp_.File("sub/x.safetensors"), StFile({{"c", "F32", {3}, Bytes(Floats(3, 1))}}));
  for (const std::string bad :
       {"../model-00002-of-00002.safetensors", "sub/x.safetensors", "/etc/passwd", "..", ".", ""}) {
    nlohmann::json map = GoodMap();
    map["c"] = bad;
    WriteIndex(tmp_.path(), map);
    Status s = Open();
    EXPECT_EQ(s.code(), StatusCode::kDataLoss) << bad;
    EXPECT_THAT(s.ToString(), AllOf(HasSubstr("tensor 'c'"), HasSubstr("'" + bad + "'")));
  }
}

TEST_F(HfCheckpointRefusalTest, MalformedIndex) {
  WriteShards();
  const std::string index = tmp_.File("model.safetensors.index.json");
  auto expect = [&](const std::string& text, const std::string& why) {
    WriteAll(index, text);
    Status s = Open();
    EXPECT_EQ(s.code(), StatusCode::kDataLoss) << text;
    EXPECT_THAT(s.ToString(), AllOf(HasSubstr(index), HasSubstr(why))) << text;
  };
  expect("{\"weight_map\": {", "not valid JSON");
  expect("[]", "not a JSON object");
  expect("{\"metadata\": {}}", "\"weight_map\" missing");
  expect("{\"weight_map\": []}", "\"weight_map\" missing or not an object");
  expect("{\"weight_map\": {\"a\": 3}}", "tensor 'a' is not a file name");
  expect(R"({"weight_map": {"a": "model-00001-of-00002.safetensors",
                            "a": "model-00002-of-00002.safetensors"}})",
         "duplicate key \"a\" in weight_map");
}

TEST_F(HfCheckpointRefusalTest, UnsupportedDtypeAndShortReads) {
  std::vector<int32_t> ids = {1, 2, 3};
  std::vector<float> w = Floats(1000, 1.0f);
  WriteAll(tmp_.File("model.safetensors"),
           StFile({{"ids", "I32", {3}, Bytes(ids)}, {"w", "F32", {1000}, Bytes(w)}}));
  auto ck = HfCheckpoint::Open(tmp_.path());
  ASSERT_TRUE(ck.ok()) << ck.status().ToString();
  std::vector<float> out(1000);
  Status s = (*ck)->ReadFloat32("ids", out.data());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.ToString(), AllOf(HasSubstr("tensor 'ids'"), HasSubstr("I32"),
                                  HasSubstr(tmp_.File("model.safetensors"))));
  std::vector<int32_t> got(3);
  ASSERT_TRUE((*ck)->ReadRaw("ids", got.data()).ok());  // raw bytes of any dtype
  EXPECT_EQ(got, ids);
  EXPECT_EQ((*ck)->ReadFloat32("nope", out.data()).code(), StatusCode::kNotFound);

  // The file shrinks under an open checkpoint: a short read names the file and the offset.
  const uint64_t size = fs::file_size(tmp_.File("model.safetensors"));
  fs::resize_file(tmp_.File("model.safetensors"), size - 100);
  s = (*ck)->ReadFloat32("w", out.data());
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_THAT(s.ToString(),
              AllOf(HasSubstr("tensor 'w'"), HasSubstr(tmp_.File("model.safetensors")),
                    HasSubstr("truncated"), HasSubstr(std::to_string(size - 100))));
}

}  // namespace
}  // namespace strata::runtime
