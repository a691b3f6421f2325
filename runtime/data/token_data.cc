// TokenData: a .bin is mapped and scanned once for ids >= vocab_size (in chunks: the maximum of
// each chunk first, the offending position only when a chunk fails), then read in place by Copy.
// A text file is mapped too and walked line by line with memchr; each record goes through the
// Tokenizer and its ids are appended to one vector of uint32.
#include "runtime/data/token_data.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <algorithm>
#include <bit>
#include <cassert>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <utility>

#include "base/file_util.h"
#include "runtime/data/tokenizer.h"

namespace strata::runtime {

static_assert(std::endian::native == std::endian::little,
              "token .bin files are little-endian and read in place");

namespace {

constexpr uint64_t kProgressEveryBytes = 4ull << 20;
constexpr std::string_view kAccepted =
    ".bin (token ids: uint16 when vocab_size <= 65536, else uint32), .jsonl (a \"text\" field "
    "per line) or .txt (a record per line)";

std::string Extension(const std::string& path) {
  std::string ext = std::filesystem::path(path).extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return ext;
}

// A whole file mapped read-only (no mapping for an empty file). Move-only.
class MappedFile {
 public:
  // kNotFound when `path` does not exist; kInvalidArgument for a directory.
  static Result<MappedFile> Open(const std::string& path) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) {
      if (errno == ENOENT) return NotFoundError(path + ": no such file");
      return IoErrorFromErrno(errno, "stat " + path);
    }
    if (S_ISDIR(st.st_mode)) {
      return InvalidArgumentError(path + " is a directory, not a data file");
    }
    STRATA_ASSIGN_OR_RETURN(UniqueFd fd, OpenFile(path, O_RDONLY));
    if (::fstat(fd.get(), &st) != 0) return IoErrorFromErrno(errno, "fstat " + path);
    MappedFile f;
    f.size_ = static_cast<uint64_t>(st.st_size);
    if (f.size_ == 0) return f;
    void* p = ::mmap(nullptr, f.size_, PROT_READ, MAP_PRIVATE, fd.get(), 0);
    if (p == MAP_FAILED) return IoErrorFromErrno(errno, "mmap " + path);
    f.addr_ = p;
    return f;  // the mapping outlives the fd
  }
  MappedFile(MappedFile&& o) noexcept
      : addr_(std::exchange(o.addr_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  MappedFile& operator=(MappedFile&&) = delete;
  ~MappedFile() {
    if (addr_ != nullptr) ::munmap(addr_, size_);
  }

  const char* data() const { return static_cast<const char*>(addr_); }
  uint64_t size() const { return size_; }
  void Advise(int advice) const {
    if (addr_ != nullptr) ::madvise(addr_, size_, advice);
  }

 private:
  MappedFile() = default;
  void* addr_ = nullptr;
  uint64_t size_ = 0;
};

// The first id >= `vocab` in `ids[0, n)`, or n. Chunked so the common case is a max-reduction.
template <typename T>
uint64_t FirstOutOfRange(const T* ids, uint64_t n, uint64_t vocab) {
  constexpr uint64_t kChunk = 1 << 16;
  for (uint64_t begin = 0; begin < n; begin += kChunk) {
    const uint64_t end = std::min(n, begin + kChunk);
    T max = 0;
    for (uint64_t i = begin; i < end; ++i) max = std::max(max, ids[i]);
    if (max < vocab) continue;
    for (uint64_t i = begin; i < end; ++i) {
      if (ids[i] >= vocab) return i;
    }
  }
  return n;
}

// "a string", "an array", "null"... for messages.
std::string JsonTypeName(const nlohmann::json& j) {
  if (j.is_null()) return "null";
  const std::string name = j.type_name();
  return (name == "array" || name == "object" ? "an " : "a ") + name;
}

}  // namespace

struct TokenData::Mapping {
  MappedFile file;
};

TokenData::TokenData() = default;
TokenData::~TokenData() = default;

std::string_view DefaultBinDtype(int64_t vocab_size) {
  return vocab_size <= 65536 ? "uint16" : "uint32";
}

Result<TextTokens> TokenizeTextFile(const std::string& path, const Tokenizer& tokenizer,
                                    int64_t vocab_size, const TokenizeProgress& progress) {
  const std::string ext = Extension(path);
  const bool jsonl = ext == ".jsonl";
  if (!jsonl && ext != ".txt") {
    return InvalidArgumentError(path + ": a text data file must be .jsonl or .txt");
  }
  STRATA_ASSIGN_OR_RETURN(MappedFile file, MappedFile::Open(path));
  file.Advise(MADV_SEQUENTIAL);
  const uint64_t bytes = file.size();
  const char* const data = file.data();
  const char* const end = data + bytes;

  TextTokens out;
  out.ids.reserve(bytes / 4);
  std::vector<int32_t> ids;
  std::string record_buf;
  uint64_t line_no = 0;
  uint64_t reported = 0;
  for (const char* p = data; p < end;) {
    const char* nl = static_cast<const char*>(std::memchr(p, '\n', end - p));
    const char* next = nl != nullptr ? nl + 1 : end;
    std::string_view line(p, (nl != nullptr ? nl : end) - p);
    const std::string_view with_break(p, next - p);
    p = next;
    ++line_no;
    const bool crlf = !line.empty() && line.back() == '\r';
    if (crlf) line.remove_suffix(1);

    std::string_view record;
    std::string text;
    if (jsonl) {
      if (line.find_first_not_of(" \t\r\f\v") == std::string_view::npos) continue;  // blank
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(line);
      } catch (const nlohmann::json::exception& e) {
        return InvalidArgumentError(path + " line " + std::to_string(line_no) +
                                    ": not JSON: " + e.what());
      }
      if (!j.is_object()) {
        return InvalidArgumentError(path + " line " + std::to_string(line_no) +
                                    ": expected a JSON object with a \"text\" string, got " +
                                    JsonTypeName(j));
      }
      auto it = j.find("text");
      if (it == j.end()) {
        return InvalidArgumentError(path + " line " + std::to_string(line_no) +
                                    ": no \"text\" field");
      }
      if (!it->is_string()) {
        return InvalidArgumentError(path + " line " + std::to_string(line_no) + ": \"text\" is " +
                                    JsonTypeName(*it) + ", expected a string");
      }
      text = it->get<std::string>();
      record = text;
    } else {
      if (line.empty()) continue;
      if (crlf) {  // "\r\n" reads as "\n", as Python's universal newlines do
        record_buf.assign(line);
        record_buf.push_back('\n');
        record = record_buf;
      } else {
        record = with_break;  // the line and its "\n" (none on a last line without one)
      }
    }

    ids.clear();
    STRATA_RETURN_IF_ERROR(tokenizer.EncodeAppend(record, &ids));
    for (size_t i = 0; i < ids.size(); ++i) {
      if (ids[i] < 0 || (vocab_size > 0 && ids[i] >= vocab_size)) {
        return InvalidArgumentError(path + " line " + std::to_string(line_no) + ": token " +
                                    std::to_string(out.ids.size() + i) + " is " +
                                    std::to_string(ids[i]) + ", not below the model's vocab_size " +
                                    std::to_string(vocab_size) + " (" + tokenizer.model_path() +
                                    " does not match the model)");
      }
    }
    out.ids.insert(out.ids.end(), ids.begin(), ids.end());
    ++out.records;
    const uint64_t done = static_cast<uint64_t>(p - data);
    if (progress && done - reported >= kProgressEveryBytes) {
      progress(done, bytes);
      reported = done;
    }
  }
  if (progress) progress(bytes, bytes);
  out.ids.shrink_to_fit();
  return out;
}

Result<std::unique_ptr<TokenData>> TokenData::Open(const TokenDataOptions& options) {
  const std::string& path = options.path;
  if (path.empty()) return InvalidArgumentError("no data file given");
  if (options.vocab_size <= 0) {
    return InvalidArgumentError(path + ": the model's vocab_size " +
                                std::to_string(options.vocab_size) + " is not positive");
  }
  const std::string ext = Extension(path);
  std::unique_ptr<TokenData> data(new TokenData());
  data->path_ = path;
  if (ext == ".bin") {
    data->format_ = "bin";
    if (options.dtype.empty()) {
      data->dtype_ = DefaultBinDtype(options.vocab_size);
    } else if (options.dtype == "uint16" || options.dtype == "uint32") {
      data->dtype_ = options.dtype;
    } else {
      return InvalidArgumentError(path + ": dtype \"" + options.dtype +
                                  "\" is not one of uint16, uint32");
    }
    data->element_bytes_ = data->dtype_ == "uint16" ? 2 : 4;
    STRATA_ASSIGN_OR_RETURN(MappedFile file, MappedFile::Open(path));
    data->map_ = std::make_unique<Mapping>(Mapping{std::move(file)});
    const MappedFile& mapped = data->map_->file;
    const uint64_t bytes = mapped.size();
    if (bytes % data->element_bytes_ != 0) {
      return InvalidArgumentError(
          path + ": " + std::to_string(bytes) + " bytes is not a whole number of " + data->dtype_ +
          " token ids (" + std::to_string(data->element_bytes_) + " bytes each)");
    }
    data->size_ = bytes / data->element_bytes_;
    mapped.Advise(MADV_SEQUENTIAL);
    const uint64_t vocab = static_cast<uint64_t>(options.vocab_size);
    uint64_t bad = 0;
    uint64_t value = 0;
    if (data->element_bytes_ == 2) {
      const auto* ids = reinterpret_cast<const uint16_t*>(mapped.data());
      bad = FirstOutOfRange(ids, data->size_, vocab);
      if (bad < data->size_) value = ids[bad];
    } else {
      const auto* ids = reinterpret_cast<const uint32_t*>(mapped.data());
      bad = FirstOutOfRange(ids, data->size_, vocab);
      if (bad < data->size_) value = ids[bad];
    }
    mapped.Advise(MADV_NORMAL);
    if (bad < data->size_) {
      return InvalidArgumentError(path + ": token " + std::to_string(bad) + " (byte offset " +
                                  std::to_string(bad * data->element_bytes_) + ") is " +
                                  std::to_string(value) + ", not below the model's vocab_size " +
                                  std::to_string(options.vocab_size) + " (ids read as " +
                                  data->dtype_ + ")");
    }
    return data;
  }
  if (ext != ".jsonl" && ext != ".txt") {
    return InvalidArgumentError(path + ": unknown data file extension \"" + ext + "\"; expected " +
                                std::string(kAccepted));
  }
  data->format_ = ext.substr(1);
  if (!options.dtype.empty()) {
    return InvalidArgumentError(path + ": dtype " + options.dtype +
                                " applies to .bin token files only, not to text");
  }
  if (options.model_dir.empty()) {
    return InvalidArgumentError(path +
                                " is text: tokenizing it needs the model directory (its "
                                "tokenizer.model)");
  }
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tokenizer, Tokenizer::Open(options.model_dir));
  STRATA_ASSIGN_OR_RETURN(TextTokens text,
                          TokenizeTextFile(path, *tokenizer, options.vocab_size, options.progress));
  data->tokens_ = std::move(text.ids);
  data->records_ = text.records;
  data->size_ = data->tokens_.size();
  return data;
}

void TokenData::Copy(uint64_t begin, uint64_t count, int64_t* out) const {
  assert(begin <= size_ && count <= size_ - begin);
  if (format_ != "bin") {
    std::copy_n(tokens_.data() + begin, count, out);
  } else if (element_bytes_ == 2) {
    std::copy_n(reinterpret_cast<const uint16_t*>(map_->file.data()) + begin, count, out);
  } else {
    std::copy_n(reinterpret_cast<const uint32_t*>(map_->file.data()) + begin, count, out);
  }
}

}  // namespace strata::runtime
