// See io_bench.h. The submitting thread keeps a window of W = queue_depth x threads block-sized
// requests in flight over a pool of W aligned buffers: it takes a free buffer (waiting on a
// semaphore released by completions), prepares it (validation stamps only), and submits; the
// completion callback records the latency, checks the status (and the checksum when reading with
// validation) and returns the buffer. The pass ends when all W buffers are back.
#include "bench/io_bench.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <random>
#include <semaphore>

#include "base/bytes.h"
#include "base/clock.h"
#include "swap/direct_io.h"

namespace strata::bench {
namespace {

constexpr size_t kPage = 4096;

uint64_t Checksum(const std::byte* p, size_t n) {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ n;
  const size_t words = n / 8;
  for (size_t i = 0; i < words; ++i) {
    uint64_t w;
    std::memcpy(&w, p + i * 8, 8);
    h = (h ^ w) * 0x100000001B3ull;
    h ^= h >> 29;
  }
  for (size_t i = words * 8; i < n; ++i) h = (h ^ static_cast<uint64_t>(p[i])) * 0x100000001B3ull;
  return h;
}

// Stamps every page of a block with (file offset, loop) so misplaced data cannot validate.
void Stamp(std::byte* p, size_t n, uint64_t file_offset, uint64_t loop) {
  for (size_t off = 0; off + 16 <= n; off += kPage) {
    const uint64_t where = file_offset + off;
    std::memcpy(p + off, &where, 8);
    std::memcpy(p + off + 8, &loop, 8);
  }
}

Status CheckStamps(const std::byte* p, size_t n, uint64_t file_offset, uint64_t loop) {
  for (size_t off = 0; off + 16 <= n; off += kPage) {
    uint64_t where, l;
    std::memcpy(&where, p + off, 8);
    std::memcpy(&l, p + off + 8, 8);
    if (where != file_offset + off || l != loop) {
      return DataLossError("validation: page at file offset " + std::to_string(file_offset + off) +
                           " holds the data of offset " + std::to_string(where) + " (loop " +
                           std::to_string(l) + ")");
    }
  }
  return Status::Ok();
}

LatencySummary Summarize(std::vector<double>& lat) {
  LatencySummary s;
  if (lat.empty()) return s;
  std::sort(lat.begin(), lat.end());
  auto pct = [&](double q) {
    const size_t i = std::min(lat.size() - 1, static_cast<size_t>(q * (lat.size() - 1) + 0.5));
    return lat[i];
  };
  double sum = 0;
  for (double v : lat) sum += v;
  s.mean_us = sum / static_cast<double>(lat.size());
  s.p50_us = pct(0.50);
  s.p90_us = pct(0.90);
  s.p99_us = pct(0.99);
  s.p999_us = pct(0.999);
  s.max_us = lat.back();
  return s;
}

struct Pass {
  IoBackend* io;
  int fd;
  uint64_t size;
  uint64_t block;
  size_t window;
  std::vector<AlignedBuffer>* buffers;
  bool validate;
  bool buffered;
  uint64_t loop;
  std::vector<uint64_t>* checksums;  // per block; written by writes, checked by reads
  std::vector<double>* latencies;    // appended per block (us)
};

// One sequential pass over the file in `op`. Returns seconds.
Result<double> RunPass(const Pass& p, IoOp op) {
  const size_t nblocks = static_cast<size_t>((p.size + p.block - 1) / p.block);
  std::counting_semaphore<> slots(static_cast<ptrdiff_t>(p.window));
  std::mutex mu;
  std::vector<size_t> free_buffers;
  for (size_t i = 0; i < p.window; ++i) free_buffers.push_back(i);
  Status first_error;
  std::atomic<bool> failed{false};
  const size_t base = p.latencies->size();
  p.latencies->resize(base + nblocks);
  double* lat = p.latencies->data() + base;

  Stopwatch watch;
  for (size_t b = 0; b < nblocks && !failed.load(std::memory_order_relaxed); ++b) {
    slots.acquire();
    size_t bi;
    {
      std::lock_guard<std::mutex> lock(mu);
      bi = free_buffers.back();
      free_buffers.pop_back();
    }
    AlignedBuffer& buf = (*p.buffers)[bi];
    const uint64_t offset = b * p.block;
    const size_t len = static_cast<size_t>(std::min<uint64_t>(p.block, p.size - offset));
    if (op == IoOp::kWrite && p.validate) {
      Stamp(buf.data(), len, offset, p.loop);
      (*p.checksums)[b] = Checksum(buf.data(), len);
    }
    const int64_t start = NowMicros();
    p.io->Submit(
        {op, p.fd, offset, buf.span(0, len), [&, b, bi, offset, len, start](Status st, size_t) {
           lat[b] = static_cast<double>(NowMicros() - start);
           if (st.ok() && op == IoOp::kRead && p.validate) {
             st = CheckStamps((*p.buffers)[bi].data(), len, offset, p.loop);
             if (st.ok() && Checksum((*p.buffers)[bi].data(), len) != (*p.checksums)[b]) {
               st = DataLossError("validation: checksum mismatch in block at offset " +
                                  std::to_string(offset));
             }
           }
           {
             std::lock_guard<std::mutex> lock(mu);
             if (!st.ok()) {
               if (first_error.ok()) first_error = std::move(st);
               failed.store(true, std::memory_order_relaxed);
             }
             free_buffers.push_back(bi);
           }
           slots.release();
         }});
  }
  for (size_t i = 0; i < p.window; ++i) slots.acquire();
  // Buffered writes would otherwise only measure the page cache (O_DIRECT writes are on the
  // device when they complete, as in fio without end_fsync).
  if (op == IoOp::kWrite && p.buffered && fdatasync(p.fd) != 0) {
    return IoErrorFromErrno(errno, "fdatasync of the benchmark file");
  }
  const double seconds = watch.Seconds();
  std::lock_guard<std::mutex> lock(mu);
  if (!first_error.ok()) return first_error;
  return seconds;
}

}  // namespace

Result<std::unique_ptr<IoBackend>> OpenBenchBackend(const IoBenchConfig& config) {
  return OpenIoBackend(config.backend, config.io, config.dir);
}

Result<IoBenchResult> RunIoBench(const IoBenchConfig& config) {
  if (config.size == 0) return InvalidArgumentError("--size must be positive");
  if (config.loops < 1) return InvalidArgumentError("--loops must be at least 1");
  if (!config.do_read && !config.do_write) {
    return InvalidArgumentError("nothing to do: neither read nor write");
  }
  STRATA_ASSIGN_OR_RETURN(DirectIoSupport support, ProbeDirectIo(config.dir));
  IoOptions io = config.io;
  io.alignment = std::max(io.alignment, support.alignment);
  IoBenchConfig effective = config;
  effective.io = io;
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<IoBackend> backend, OpenBenchBackend(effective));

  IoBenchResult result;
  result.backend = std::string(backend->name());
  result.file_size = AlignUp(config.size, io.alignment);
  result.file = config.dir + "/strata-bench-io-" + std::to_string(getpid()) + ".dat";
  STRATA_ASSIGN_OR_RETURN(OpenedFile file, OpenFileForIo(result.file, O_RDWR | O_CREAT | O_EXCL,
                                                         0600, !config.buffered, false));
  result.direct = file.direct;
  struct Cleanup {
    int fd;
    std::string path;
    ~Cleanup() {
      close(fd);
      unlink(path.c_str());
    }
  } cleanup{file.fd, result.file};

  if (const int rc = posix_fallocate(file.fd, 0, static_cast<off_t>(result.file_size)); rc != 0) {
    return IoErrorFromErrno(rc,
                            "fallocate " + FormatBytes(result.file_size) + " for " + result.file);
  }

  const size_t nblocks =
      static_cast<size_t>((result.file_size + io.block_size - 1) / io.block_size);
  // More buffers than blocks would never be used (a small file with a deep queue).
  const size_t window =
      std::min(nblocks, static_cast<size_t>(io.queue_depth) * io.intra_op_parallelism);
  std::vector<AlignedBuffer> buffers;
  std::mt19937_64 rng(12345);
  for (size_t i = 0; i < window; ++i) {
    STRATA_ASSIGN_OR_RETURN(AlignedBuffer b, AlignedBuffer::Allocate(io.block_size, io.alignment));
    auto* words = reinterpret_cast<uint64_t*>(b.data());
    for (size_t w = 0; w < b.size() / 8; ++w) words[w] = rng();
    buffers.push_back(std::move(b));
  }
  std::vector<uint64_t> checksums(nblocks);
  std::vector<double> write_lat, read_lat;
  IoDirectionResult write, read;

  for (int loop = 0; loop < config.loops; ++loop) {
    const bool measure_write = config.do_write;
    const bool need_write = config.do_write || loop == 0;  // a read-only run lays the file out
    if (need_write) {
      std::vector<double> scratch;
      Pass p{backend.get(),
             file.fd,
             result.file_size,
             io.block_size,
             window,
             &buffers,
             config.validate,
             !file.direct,
             static_cast<uint64_t>(loop),
             &checksums,
             measure_write ? &write_lat : &scratch};
      const double cpu0 = ProcessCpuSeconds();
      STRATA_ASSIGN_OR_RETURN(double s, RunPass(p, IoOp::kWrite));
      if (measure_write) {
        write.cpu_seconds += ProcessCpuSeconds() - cpu0;
        write.seconds += s;
        write.bytes += result.file_size;
        write.loop_gbps.push_back(static_cast<double>(result.file_size) / s / 1e9);
      }
    }
    if (config.do_read) {
      if (!file.direct) {
        // Buffered: make the reads come from the disk, not from the page cache.
        posix_fadvise(file.fd, 0, 0, POSIX_FADV_DONTNEED);
      }
      // Reads validate against the data of the last write, which has loop number `loop` when
      // this loop wrote, else 0 (the layout write).
      const uint64_t data_loop = need_write ? static_cast<uint64_t>(loop) : 0;
      Pass p{backend.get(),   file.fd,      result.file_size, io.block_size, window,   &buffers,
             config.validate, !file.direct, data_loop,        &checksums,    &read_lat};
      const double cpu0 = ProcessCpuSeconds();
      STRATA_ASSIGN_OR_RETURN(double s, RunPass(p, IoOp::kRead));
      read.cpu_seconds += ProcessCpuSeconds() - cpu0;
      read.seconds += s;
      read.bytes += result.file_size;
      read.loop_gbps.push_back(static_cast<double>(result.file_size) / s / 1e9);
      read.validated = config.validate;
    }
  }
  if (config.do_write) {
    write.latency = Summarize(write_lat);
    result.write = write;
  }
  if (config.do_read) {
    read.latency = Summarize(read_lat);
    result.read = read;
  }
  return result;
}

}  // namespace strata::bench
