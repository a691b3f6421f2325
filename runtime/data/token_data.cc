// TokenData: a .bin is mapped and scanned once for ids >= vocab_size (in chunks: the maximum of
// each chunk first, the offending position only when a chunk fails), then read in place by Copy.
// A text file is mapped too and cut into byte ranges at line breaks, one per thread; each thread
// walks its lines with memchr, tokenizes each record and appends the ids to its own vector, and the
// vectors are concatenated in file order, so the result does not depend on the number of threads.
// Errors too: a thread stops at its first bad line and makes every later range stop, and the
// earliest range's error is reported, with line numbers and token indices counted file-wide.
#include "runtime/data/token_data.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cassert>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <limits>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>
#include <utility>

#include "base/file_util.h"
#include "base/json_text.h"
#include "runtime/data/tokenizer.h"

namespace strata::runtime {

static_assert(std::endian::native == std::endian::little,
              "token .bin files are little-endian and read in place");

namespace {

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
  UniqueFd fd;         // .bin, read with pread (thread-safe: no shared offset)
  uint64_t bytes = 0;  // its size when opened
};

TokenData::TokenData() = default;
TokenData::~TokenData() = default;

std::string_view DefaultBinDtype(int64_t vocab_size) {
  return vocab_size <= 65536 ? "uint16" : "uint32";
}

namespace {

// A .jsonl record: a line already in memory, so no size limit beyond the file's.
constexpr JsonReadOptions kRecordOptions{.max_bytes = std::numeric_limits<uint64_t>::max()};

// One byte range of a text file, starting at a line start, tokenized by one thread.
struct TextChunk {
  const char* begin = nullptr;
  const char* end = nullptr;
  uint64_t lines_before = 0;  // lines of the file before `begin`
  std::vector<uint32_t> ids;
  uint64_t records = 0;
  // The chunk's first error. An id beyond the vocabulary is kept in parts (out_of_vocab): its
  // message names the file-wide token index, known once the earlier chunks are counted.
  Status error;
  bool out_of_vocab = false;
  uint64_t error_line = 0;
  uint64_t error_token = 0;  // index into `ids`
  int32_t error_id = 0;
};

struct TextJob {
  const std::string& path;
  bool jsonl;
  const Tokenizer& tokenizer;
  int64_t vocab_size;
  std::atomic<uint64_t> done_bytes{0};
  // The lowest index of a chunk that failed so far: later chunks stop, earlier ones go on, so the
  // error reported is the first in the file, as a serial reader would report it.
  std::atomic<size_t> first_failed;
};

void Fail(TextJob& job, size_t index, TextChunk& c, Status error) {
  c.error = std::move(error);
  size_t seen = job.first_failed.load();
  while (index < seen && !job.first_failed.compare_exchange_weak(seen, index)) {
  }
}

void TokenizeChunk(TextJob& job, size_t index, TextChunk& c) {
  constexpr uint64_t kReportBytes = 256 << 10;
  std::vector<int32_t> ids;
  std::string record_buf;
  std::string text;
  uint64_t line_no = c.lines_before;
  const char* reported = c.begin;
  for (const char* p = c.begin; p < c.end;) {
    if (job.first_failed.load(std::memory_order_relaxed) < index) return;  // its error wins
    const char* nl = static_cast<const char*>(std::memchr(p, '\n', c.end - p));
    const char* next = nl != nullptr ? nl + 1 : c.end;
    std::string_view line(p, (nl != nullptr ? nl : c.end) - p);
    const std::string_view with_break(p, next - p);
    p = next;
    ++line_no;
    const bool crlf = !line.empty() && line.back() == '\r';
    if (crlf) line.remove_suffix(1);
    auto at_line = [&] { return job.path + " line " + std::to_string(line_no) + ": "; };

    std::string_view record;
    if (job.jsonl) {
      if (line.find_first_not_of(" \t\r\f\v") == std::string_view::npos) continue;  // blank
      Result<nlohmann::json> parsed =
          ParseJsonText(line, job.path + " line " + std::to_string(line_no), kRecordOptions);
      if (!parsed.ok()) return Fail(job, index, c, parsed.status());
      const nlohmann::json& j = *parsed;
      if (!j.is_object()) {
        return Fail(
            job, index, c,
            InvalidArgumentError(at_line() + "expected a JSON object with a \"text\" string, got " +
                                 JsonTypeName(j)));
      }
      auto it = j.find("text");
      if (it == j.end()) {
        const bool sft = j.contains("prompt") || j.contains("completion") ||
                         j.contains("prompt_ids") || j.contains("completion_ids");
        return Fail(job, index, c,
                    InvalidArgumentError(at_line() + "no \"text\" field" +
                                         (sft ? ": a prompt/completion record among \"text\" "
                                                "records (a file holds one kind of record)"
                                              : "")));
      }
      if (!it->is_string()) {
        return Fail(job, index, c,
                    InvalidArgumentError(at_line() + "\"text\" is " + JsonTypeName(*it) +
                                         ", expected a string"));
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
    Status encoded = job.tokenizer.EncodeAppend(record, &ids);
    if (!encoded.ok()) return Fail(job, index, c, std::move(encoded));
    for (size_t i = 0; i < ids.size(); ++i) {
      if (ids[i] < 0 || (job.vocab_size > 0 && ids[i] >= job.vocab_size)) {
        c.out_of_vocab = true;
        c.error_line = line_no;
        c.error_token = c.ids.size() + i;
        c.error_id = ids[i];
        return Fail(job, index, c, InvalidArgumentError("id beyond the vocabulary"));
      }
    }
    c.ids.insert(c.ids.end(), ids.begin(), ids.end());
    ++c.records;
    if (static_cast<uint64_t>(p - reported) >= kReportBytes) {
      job.done_bytes.fetch_add(p - reported, std::memory_order_relaxed);
      reported = p;
    }
  }
  job.done_bytes.fetch_add(c.end - reported, std::memory_order_relaxed);
}

// CPUs this process may run on, at most 32.
int DefaultThreads() {
  cpu_set_t set;
  CPU_ZERO(&set);
  int n = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 0;
  if (n <= 0) n = static_cast<int>(std::thread::hardware_concurrency());
  return std::clamp(n, 1, 32);
}

}  // namespace

Result<TextTokens> TokenizeTextFile(const std::string& path, const Tokenizer& tokenizer,
                                    int64_t vocab_size, const TokenizeProgress& progress,
                                    int threads) {
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

  // Cut the file into up to `threads` ranges of at least kMinChunkBytes, each ending after a
  // line break (or at the end of the file).
  constexpr uint64_t kMinChunkBytes = 256 << 10;
  const uint64_t k = std::max<uint64_t>(
      1, std::min<uint64_t>(threads > 0 ? threads : DefaultThreads(), bytes / kMinChunkBytes));
  std::vector<TextChunk> chunks;
  uint64_t lines = 0;
  for (uint64_t i = 1; i <= k && (chunks.empty() ? data : chunks.back().end) < end; ++i) {
    const char* begin = chunks.empty() ? data : chunks.back().end;
    const char* stop = i == k ? end : std::max(begin, data + bytes / k * i);
    if (stop < end && (stop == begin || stop[-1] != '\n')) {
      const void* nl = std::memchr(stop, '\n', end - stop);
      stop = nl != nullptr ? static_cast<const char*>(nl) + 1 : end;
    }
    TextChunk& c = chunks.emplace_back();
    c.begin = begin;
    c.end = stop;
    c.lines_before = lines;
    lines += std::count(begin, stop, '\n');
  }

  TextJob job{path, jsonl, tokenizer, vocab_size};
  job.first_failed = chunks.size();
  std::mutex mu;
  std::condition_variable cv;
  size_t running = chunks.size();
  std::vector<std::thread> workers;
  workers.reserve(chunks.size());
  for (size_t i = 0; i < chunks.size(); ++i) {
    workers.emplace_back([&, i] {
      TokenizeChunk(job, i, chunks[i]);
      std::lock_guard<std::mutex> lock(mu);
      if (--running == 0) cv.notify_all();
    });
  }
  {
    std::unique_lock<std::mutex> lock(mu);
    while (!cv.wait_for(lock, std::chrono::milliseconds(200), [&] { return running == 0; })) {
      if (!progress) continue;
      lock.unlock();
      progress(job.done_bytes.load(), bytes);
      lock.lock();
    }
  }
  for (std::thread& t : workers) t.join();

  uint64_t tokens = 0;
  for (const TextChunk& c : chunks) {
    if (c.out_of_vocab) {
      return InvalidArgumentError(
          path + " line " + std::to_string(c.error_line) + ": token " +
          std::to_string(tokens + c.error_token) + " is " + std::to_string(c.error_id) +
          ", not below the model's vocab_size " + std::to_string(vocab_size) + " (" +
          tokenizer.model_path() + " does not match the model)");
    }
    if (!c.error.ok()) return c.error;
    tokens += c.ids.size();
  }
  if (progress) progress(bytes, bytes);
  TextTokens out;
  out.ids.reserve(tokens);
  for (TextChunk& c : chunks) {
    out.ids.insert(out.ids.end(), c.ids.begin(), c.ids.end());
    out.records += c.records;
    std::vector<uint32_t>().swap(c.ids);
  }
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
    data->vocab_size_ = static_cast<uint64_t>(options.vocab_size);
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) {
      if (errno == ENOENT) return NotFoundError(path + ": no such file");
      return IoErrorFromErrno(errno, "stat " + path);
    }
    if (S_ISDIR(st.st_mode)) return InvalidArgumentError(path + " is a directory, not a data file");
    if (!S_ISREG(st.st_mode)) return InvalidArgumentError(path + " is not a regular file");
    auto mapping = std::make_unique<Mapping>();
    STRATA_ASSIGN_OR_RETURN(mapping->fd, OpenFile(path, O_RDONLY));
    if (::fstat(mapping->fd.get(), &st) != 0) return IoErrorFromErrno(errno, "fstat " + path);
    mapping->bytes = static_cast<uint64_t>(st.st_size);
    const uint64_t bytes = mapping->bytes;
    data->map_ = std::move(mapping);
    if (bytes % data->element_bytes_ != 0) {
      return InvalidArgumentError(
          path + ": " + std::to_string(bytes) + " bytes is not a whole number of " + data->dtype_ +
          " token ids (" + std::to_string(data->element_bytes_) + " bytes each)");
    }
    data->size_ = bytes / data->element_bytes_;
    ::posix_fadvise(data->map_->fd.get(), 0, 0, POSIX_FADV_SEQUENTIAL);
    // Scanned in chunks read with pread: the first id >= vocab_size, if any.
    const uint64_t vocab = data->vocab_size_;
    constexpr uint64_t kChunkTokens = 1 << 18;
    std::vector<char> buf(kChunkTokens * data->element_bytes_);
    uint64_t bad = data->size_;
    uint64_t value = 0;
    // Which positions modulo 4 hold a non-zero id: ids written wider than they are read leave the
    // high halves zero (uint32 read as uint16: every odd position; int64: three in four).
    bool nonzero[4] = {false, false, false, false};
    for (uint64_t begin = 0; begin < data->size_ && bad == data->size_; begin += kChunkTokens) {
      const uint64_t n = std::min(kChunkTokens, data->size_ - begin);
      STRATA_RETURN_IF_ERROR(PreadFully(data->map_->fd.get(), begin * data->element_bytes_,
                                        buf.data(), n * data->element_bytes_, path));
      uint64_t at = n;
      if (data->element_bytes_ == 2) {
        const auto* ids = reinterpret_cast<const uint16_t*>(buf.data());
        at = FirstOutOfRange(ids, n, vocab);
        if (at < n) value = ids[at];
        for (uint64_t i = 0; i < n; ++i) nonzero[i & 3] |= ids[i] != 0;
      } else {
        const auto* ids = reinterpret_cast<const uint32_t*>(buf.data());
        at = FirstOutOfRange(ids, n, vocab);
        if (at < n) value = ids[at];
        for (uint64_t i = 0; i < n; ++i) nonzero[i & 3] |= ids[i] != 0;
      }
      if (at < n) bad = begin + at;
    }
    ::posix_fadvise(data->map_->fd.get(), 0, 0, POSIX_FADV_NORMAL);
    const bool chosen = !options.dtype.empty();
    if (bad < data->size_) {
      std::string hint;
      if (!chosen && data->element_bytes_ == 4) {
        hint = "; if the file holds uint16 ids (nanoGPT's default), pass --data-dtype uint16";
      }
      return InvalidArgumentError(path + ": token " + std::to_string(bad) + " (byte offset " +
                                  std::to_string(bad * data->element_bytes_) + ") is " +
                                  std::to_string(value) + ", not below the model's vocab_size " +
                                  std::to_string(options.vocab_size) + " (ids read as " +
                                  data->dtype_ + ")" + hint);
    }
    // Wider ids than the width read (checked when the width was not chosen with --data-dtype,
    // and on enough ids for the pattern to mean something).
    const bool odd_zero = !nonzero[1] && !nonzero[3] && (nonzero[0] || nonzero[2]);
    if (!chosen && data->size_ >= 16 && odd_zero) {
      const bool sixty_four = data->element_bytes_ == 4 || (!nonzero[2] && data->size_ % 4 == 0);
      if (sixty_four) {
        return InvalidArgumentError(
            path + ": every id read as " + data->dtype_ + " is followed by " +
            (data->element_bytes_ == 4 ? "a zero" : "three zeros") +
            ": the file holds 64-bit ids (int64/uint64), which strata does not read; write them "
            "as uint16 (vocab_size <= 65536) or uint32, e.g. numpy's ids.astype(np.uint16)"
            ".tofile(path)");
      }
      return InvalidArgumentError(
          path + ": every id read as uint16 is followed by a zero: the file holds uint32 ids (" +
          std::to_string(data->size_ / 2) + " of them, not " + std::to_string(data->size_) +
          "); pass --data-dtype uint32");
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
                                "tokenizer.json or tokenizer.model)");
  }
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tokenizer, Tokenizer::Open(options.model_dir));
  STRATA_ASSIGN_OR_RETURN(TextTokens text, TokenizeTextFile(path, *tokenizer, options.vocab_size,
                                                            options.progress, options.threads));
  data->tokens_ = std::move(text.ids);
  data->records_ = text.records;
  data->size_ = data->tokens_.size();
  return data;
}

Status TokenData::Copy(uint64_t begin, uint64_t count, int64_t* out) const {
  assert(begin <= size_ && count <= size_ - begin);
  if (format_ != "bin") {
    std::copy_n(tokens_.data() + begin, count, out);
    return Status::Ok();
  }
  // The ids are read into the upper part of `out` (int64 slots are at least twice as wide) and
  // widened in place from the front, so no buffer is needed.
  const uint64_t bytes = count * element_bytes_;
  char* raw = reinterpret_cast<char*>(out) + count * sizeof(int64_t) - bytes;
  const uint64_t offset = begin * element_bytes_;
  Status read = PreadFully(map_->fd.get(), offset, raw, bytes, path_);
  if (!read.ok()) {
    struct stat st {};
    const std::string now = ::fstat(map_->fd.get(), &st) == 0
                                ? std::to_string(st.st_size) + " bytes now"
                                : "its size unknown";
    return DataLossError(
        path_ + " changed while training read it: bytes " + std::to_string(offset) + "-" +
        std::to_string(offset + bytes) + " cannot be read (" + std::to_string(map_->bytes) +
        " bytes when opened, " + now + ")" +
        (read.code() == StatusCode::kDataLoss ? std::string()
                                              : ": " + std::string(read.message())));
  }
  for (uint64_t i = 0; i < count; ++i) {
    uint64_t id;
    if (element_bytes_ == 2) {
      uint16_t v;
      std::memcpy(&v, raw + i * 2, 2);
      id = v;
    } else {
      uint32_t v;
      std::memcpy(&v, raw + i * 4, 4);
      id = v;
    }
    if (id >= vocab_size_) {
      return DataLossError(path_ + " changed while training read it: token " +
                           std::to_string(begin + i) + " is now " + std::to_string(id) +
                           ", not below the model's vocab_size " + std::to_string(vocab_size_));
    }
    out[i] = static_cast<int64_t>(id);
  }
  return Status::Ok();
}

}  // namespace strata::runtime
