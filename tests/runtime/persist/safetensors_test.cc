#include "runtime/persist/safetensors.h"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
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
  TempDir() : strata::testing::TempDir("strata-st-test") {}
};

std::vector<uint8_t> ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

void WriteAll(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// ---- An independent parser: nothing from runtime/safetensors.* ---------------------------------
//
// Written from the published format description: u64 little-endian N, N bytes of JSON, data.
struct ParsedTensor {
  std::string dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};
struct ParsedFile {
  uint64_t header_len = 0;
  std::string header_text;
  std::map<std::string, std::string> metadata;
  std::map<std::string, ParsedTensor> tensors;
  std::vector<std::string> data_order;  // names sorted by (begin, end) offsets
};

ParsedFile ParseIndependently(const std::string& path) {
  std::vector<uint8_t> file = ReadAll(path);
  ParsedFile out;
  EXPECT_GE(file.size(), 8u);
  if (file.size() < 8) return out;
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(file[i]) << (8 * i);
  out.header_len = n;
  EXPECT_LE(8 + n, file.size());
  out.header_text.assign(file.begin() + 8, file.begin() + 8 + static_cast<ptrdiff_t>(n));
  nlohmann::json h = nlohmann::json::parse(out.header_text);
  const size_t data_start = 8 + n;
  std::vector<std::tuple<uint64_t, uint64_t, std::string>> by_offset;
  for (auto& [name, v] : h.items()) {
    if (name == "__metadata__") {
      for (auto& [k, s] : v.items()) out.metadata[k] = s.get<std::string>();
      continue;
    }
    ParsedTensor t;
    t.dtype = v.at("dtype").get<std::string>();
    t.shape = v.at("shape").get<std::vector<int64_t>>();
    uint64_t b = v.at("data_offsets").at(0).get<uint64_t>();
    uint64_t e = v.at("data_offsets").at(1).get<uint64_t>();
    EXPECT_LE(b, e);
    EXPECT_LE(data_start + e, file.size());
    t.bytes.assign(file.begin() + static_cast<ptrdiff_t>(data_start + b),
                   file.begin() + static_cast<ptrdiff_t>(data_start + e));
    by_offset.emplace_back(b, e, name);
    out.tensors[name] = std::move(t);
  }
  std::sort(by_offset.begin(), by_offset.end());
  for (auto& [b, e, name] : by_offset) out.data_order.push_back(name);
  return out;
}

// Bytes per element as the format's documentation lists them (a second table on purpose).
size_t ElemSize(const std::string& d) {
  if (d == "F64" || d == "I64" || d == "U64") return 8;
  if (d == "F32" || d == "I32" || d == "U32") return 4;
  if (d == "F16" || d == "BF16" || d == "I16" || d == "U16") return 2;
  return 1;
}

std::vector<uint8_t> Bytes(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  uint32_t x = seed * 2654435761u + 1;
  for (auto& b : v) {
    x = x * 1664525u + 1013904223u;
    b = static_cast<uint8_t>(x >> 24);
  }
  return v;
}

TEST(SafetensorsTest, WrittenFileParsesIndependentlyAndEveryByteMatches) {
  TempDir tmp;
  const std::string path = tmp.File("model.safetensors");
  std::vector<TensorSpec> specs = {
      {"transformer.wte.weight", "F32", {64, 48}},
      {"transformer.h.0.attn.c_attn.weight", "F32", {48, 144}},
      {"transformer.h.0.ln_1.bias", "BF16", {48}},
      {"step", "I64", {}},       // scalar
      {"empty", "F16", {0, 5}},  // zero elements
      {"mask", "BOOL", {3, 7}},  // odd size: later tensors start unaligned
      {"lm_head.weight", "F32", {48, 64}},
  };
  std::map<std::string, std::vector<uint8_t>> data;
  std::vector<uint8_t> all;
  for (size_t i = 0; i < specs.size(); ++i) {
    size_t n = ElemSize(specs[i].dtype);
    for (int64_t d : specs[i].shape) n *= static_cast<size_t>(d);
    data[specs[i].name] = Bytes(n, static_cast<uint32_t>(i + 1));
    all.insert(all.end(), data[specs[i].name].begin(), data[specs[i].name].end());
  }
  std::map<std::string, std::string> meta = {{"format", "pt"}, {"producer", "strata"}};
  {
    auto w = SafetensorsWriter::Create(path, specs, meta);
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    EXPECT_EQ((*w)->data_bytes(), all.size());
    // Chunks that straddle tensor boundaries.
    for (size_t off = 0; off < all.size(); off += 1001) {
      ASSERT_TRUE((*w)->Append(all.data() + off, std::min<size_t>(1001, all.size() - off)).ok());
    }
    EXPECT_FALSE(fs::exists(path));  // only PATH.tmp until Finish
    ASSERT_TRUE((*w)->Finish().ok());
  }
  EXPECT_FALSE(fs::exists(path + ".tmp"));

  ParsedFile f = ParseIndependently(path);
  EXPECT_EQ(f.header_len % 8, 0u);
  EXPECT_EQ(f.header_text.front(), '{');
  EXPECT_EQ(f.header_text.find_first_not_of(' ', f.header_text.rfind('}') + 1), std::string::npos)
      << "padding must be spaces";
  EXPECT_EQ(f.metadata, meta);
  ASSERT_EQ(f.tensors.size(), specs.size());
  for (const TensorSpec& s : specs) {
    const ParsedTensor& t = f.tensors[s.name];
    EXPECT_EQ(t.dtype, s.dtype) << s.name;
    EXPECT_EQ(t.shape, s.shape) << s.name;
    EXPECT_TRUE(t.bytes == data[s.name]) << s.name << ": bytes differ";
  }
  // Contiguous, in the given order.
  std::vector<std::string> given;
  for (const TensorSpec& s : specs) given.push_back(s.name);
  EXPECT_EQ(f.data_order, given);
  size_t file_size = fs::file_size(path);
  EXPECT_EQ(file_size, 8 + f.header_len + all.size());
  std::vector<uint8_t> file = ReadAll(path);
  EXPECT_TRUE(std::equal(all.begin(), all.end(), file.begin() + 8 + f.header_len));

  // And the library's own index agrees with the independent reading.
  std::map<std::string, std::string> got_meta;
  auto index = ReadSafetensorsIndex(path, &got_meta);
  ASSERT_TRUE(index.ok()) << index.status().ToString();
  EXPECT_EQ(got_meta, meta);
  ASSERT_EQ(index->size(), specs.size());
  uint64_t cursor = 8 + f.header_len;
  for (const SafetensorsTensor& t : *index) {
    EXPECT_EQ(t.begin, cursor) << t.spec.name;
    cursor = t.end;
    EXPECT_TRUE(std::equal(file.begin() + static_cast<ptrdiff_t>(t.begin),
                           file.begin() + static_cast<ptrdiff_t>(t.end), data[t.spec.name].begin(),
                           data[t.spec.name].end()))
        << t.spec.name;
    EXPECT_EQ(t.spec.shape, f.tensors[t.spec.name].shape);
    EXPECT_EQ(t.spec.dtype, f.tensors[t.spec.name].dtype);
  }
  EXPECT_EQ(cursor, file_size);
}

TEST(SafetensorsTest, NoMetadataAndNoTensors) {
  TempDir tmp;
  const std::string path = tmp.File("empty.safetensors");
  auto w = SafetensorsWriter::Create(path, {});
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE((*w)->Finish().ok());
  ParsedFile f = ParseIndependently(path);
  EXPECT_TRUE(f.tensors.empty());
  EXPECT_EQ(f.header_len, 8u);  // "{}" padded
  EXPECT_EQ(nlohmann::json::parse(f.header_text), nlohmann::json::object());
  auto index = ReadSafetensorsIndex(path);
  ASSERT_TRUE(index.ok()) << index.status().ToString();
  EXPECT_TRUE(index->empty());
}

TEST(SafetensorsTest, WriterRefusesBadSpecsAndByteCounts) {
  TempDir tmp;
  const std::string path = tmp.File("x.safetensors");
  EXPECT_EQ(SafetensorsWriter::Create(path, {{"a", "F31", {2}}}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(SafetensorsWriter::Create(path, {{"a", "F32", {2}}, {"a", "F32", {2}}}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(SafetensorsWriter::Create(path, {{"__metadata__", "F32", {2}}}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(SafetensorsWriter::Create(path, {{"a", "F32", {-1}}}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(SafetensorsWriter::Create(path, {{"a", "F32", {1ll << 40, 1ll << 40}}}).status().code(),
            StatusCode::kInvalidArgument);

  // An existing file survives a writer that does not finish.
  WriteAll(path, "previous");
  {
    auto w = SafetensorsWriter::Create(path, {{"a", "F32", {4}}});
    ASSERT_TRUE(w.ok());
    std::vector<uint8_t> b(16, 1);
    ASSERT_TRUE((*w)->Append(b.data(), 8).ok());
    Status s = (*w)->Finish();
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
    EXPECT_THAT(s.ToString(), HasSubstr("8 of 16 tensor bytes"));
  }
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  EXPECT_EQ(fs::file_size(path), 8u);
  {
    auto w = SafetensorsWriter::Create(path, {{"a", "F32", {4}}});
    ASSERT_TRUE(w.ok());
    std::vector<uint8_t> b(17, 1);
    Status s = (*w)->Append(b.data(), b.size());
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(s.ToString(), HasSubstr("past the tensors' total of 16"));
  }
  EXPECT_EQ(fs::file_size(path), 8u);
}

// ---- Malformed files ---------------------------------------------------------------------------

// A file with header `json` (length field = its size unless `len` is given) followed by `data`.
std::string Build(const std::string& json, size_t data, int64_t len = -1) {
  uint64_t n = len < 0 ? json.size() : static_cast<uint64_t>(len);
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(n >> (8 * i));
  return out + json + std::string(data, 'x');
}

class MalformedSafetensorsTest : public ::testing::Test {
 protected:
  Status Index(const std::string& bytes) {
    WriteAll(path_, bytes);
    return ReadSafetensorsIndex(path_).status();
  }
  void ExpectRefused(const std::string& bytes, const std::string& why) {
    Status s = Index(bytes);
    EXPECT_EQ(s.code(), StatusCode::kDataLoss) << why;
    EXPECT_THAT(s.ToString(), HasSubstr(why));
    EXPECT_THAT(s.ToString(), HasSubstr(path_));
  }
  TempDir tmp_;
  std::string path_ = tmp_.File("bad.safetensors");
};

TEST_F(MalformedSafetensorsTest, ValidBaseline) {
  EXPECT_TRUE(Index(Build(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8)).ok());
}

TEST_F(MalformedSafetensorsTest, HeaderLengthAndFileSize) {
  ExpectRefused("1234", "truncated: expected at least 8 bytes, found 4");
  const std::string ok = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  ExpectRefused(Build(ok, 8, 1000), "header length 1000 runs past the end of the file");
  ExpectRefused(Build(ok, 8, INT64_MAX), "runs past the end of the file");
  ExpectRefused(Build(ok, 4), "are not within the 4 data bytes");  // data too short
  ExpectRefused(Build(ok, 12), "tensors end at data offset 8 but the file holds 12");
}

TEST_F(MalformedSafetensorsTest, BadJson) {
  ExpectRefused(Build(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})", 8),
                "header: not valid JSON");
  ExpectRefused(Build(R"([1,2,3])", 0), "header is not a JSON object");
  ExpectRefused(Build(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                      R"("a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                      8),
                "header: duplicate key \"a\" in the top-level object");
  ExpectRefused(Build(R"({"__metadata__":{"k":1}})", 0), "__metadata__.k is not a string");
  ExpectRefused(Build(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}})", 8),
                "unknown key 'x'");
  ExpectRefused(Build(R"({"a":{"shape":[2],"data_offsets":[0,8]}})", 8), "dtype missing");
  ExpectRefused(Build(R"({"a":{"dtype":"F32","data_offsets":[0,8]}})", 8), "shape missing");
  ExpectRefused(Build(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", 8),
                "data_offsets must be [begin, end]");
}

TEST_F(MalformedSafetensorsTest, BadDtypeAndShape) {
  ExpectRefused(Build(R"({"a":{"dtype":"F33","shape":[2],"data_offsets":[0,8]}})", 8),
                "unknown dtype 'F33'");
  ExpectRefused(Build(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8),
                "expected non-negative integers");
  ExpectRefused(Build(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8),
                "F32 [3] needs 12 bytes, data_offsets give 8");
  ExpectRefused(Build(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],)"
                      R"("data_offsets":[0,8]}})",
                      8),
                "needs more than 2^64 bytes");
}

TEST_F(MalformedSafetensorsTest, OverlapsGapsAndBounds) {
  ExpectRefused(Build(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                      R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                      12),
                "tensor 'b' overlaps the previous tensor");
  ExpectRefused(Build(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                      R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                      12),
                "gap of 4 bytes before tensor 'b'");
  ExpectRefused(Build(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}})", 4),
                "are not within");
  ExpectRefused(Build(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})", 4),
                "are not within the 4 data bytes");
  // Two tensors sharing bytes exactly (aliasing) is an overlap too.
  ExpectRefused(Build(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                      R"("b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
                      4),
                "overlaps");
}

}  // namespace
}  // namespace strata::runtime
