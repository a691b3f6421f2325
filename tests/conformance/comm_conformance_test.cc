// The Communicator contract (runtime/comm/communicator.h), run on every communicator this build
// has: the single-rank one, Gloo (gloo_communicator.h) with 2 and 4 ranks, and, in builds with
// NCCL (a CUDA libtorch), NCCL on 2 GPUs with host buffers (staged) and with device buffers
// (skipped with the reason where fewer than 2 GPUs are visible), each rank a forked process meeting
// the others on loopback. Every method: identity, the reductions exact and the same bits on every
// rank, gathers and broadcasts from every root, sizes 0, 1, odd and large, the aliasing the
// contract allows, the barrier, groups used from threads of their own, and failures (a rank lost, a
// rank stalled) reported as kUnavailable within the configured timeout.
//
// A backend joins with one line in Backends(): its name, its world size and a factory that each
// rank's process calls to connect. A backend whose buffers are not host memory (NCCL) also gives
// its BufferSpace, and one that needs hardware says why it cannot run here (`unavailable`).
//
// Cross-rank checks do not trust the communicator: ranks leave their results in a directory
// shared with the parent (the test process), which compares them. Orderings between ranks are
// handshakes on files in that directory, never sleeps.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <memory>
#include <ostream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#if STRATA_TEST_HAVE_NCCL
#include <cuda_runtime_api.h>
#include <sys/wait.h>
#endif

#include "runtime/comm/communicator.h"
#include "runtime/comm/gloo_communicator.h"
#include "runtime/comm/launcher.h"
#include "tests/runtime/comm/rank_fork.h"
#include "tests/testing/temp_dir.h"

namespace strata::runtime {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using strata::testing::HoldUntilExit;
using strata::testing::WaitForFile;
using strata::testing::WaitUntilGone;

// Where a backend's buffers live. Host memory for the CPU backends; a CUDA backend allocates on
// the rank's GPU and copies through the host.
class BufferSpace {
 public:
  virtual ~BufferSpace() = default;
  virtual void* Allocate(size_t bytes) = 0;  // never null, even for 0 bytes
  virtual void Free(void* p) = 0;
  virtual void CopyIn(void* buffer, const void* host, size_t bytes) = 0;
  virtual void CopyOut(void* host, const void* buffer, size_t bytes) = 0;
};

class HostSpace final : public BufferSpace {
 public:
  void* Allocate(size_t bytes) override { return std::malloc(bytes > 0 ? bytes : 1); }
  void Free(void* p) override { std::free(p); }
  void CopyIn(void* buffer, const void* host, size_t bytes) override {
    if (bytes > 0) std::memcpy(buffer, host, bytes);
  }
  void CopyOut(void* host, const void* buffer, size_t bytes) override {
    if (bytes > 0) std::memcpy(host, buffer, bytes);
  }
};

// How a rank connects: what the factory of a backend is given in each rank's process.
struct RankSetup {
  int rank = 0;
  int world_size = 1;
  int master_port = 0;  // a free loopback port; rank 0 serves the rendezvous there
  int groups = 1;       // independent communicators (one per thread that calls collectives)
  milliseconds timeout{30000};
};

using CommFactory =
    std::function<Result<std::vector<std::shared_ptr<Communicator>>>(const RankSetup&)>;

struct Backend {
  std::string name;  // what Communicator::backend() says
  int world_size = 1;
  std::string variant;  // for the test's name, where one backend runs twice (its memory)
  CommFactory connect;
  std::function<std::unique_ptr<BufferSpace>(int rank)> memory = [](int) {
    return std::make_unique<HostSpace>();
  };
  // Non-empty: why this backend cannot run on this machine (checked before any rank starts).
  std::function<std::string()> unavailable = [] { return std::string(); };
};

// gtest prints the parameter of a failed test with this.
void PrintTo(const Backend& b, std::ostream* os) {
  *os << b.name << " with " << b.world_size << " ranks";
}

Result<std::vector<std::shared_ptr<Communicator>>> ConnectSingle(const RankSetup& setup) {
  std::vector<std::shared_ptr<Communicator>> out;
  for (int i = 0; i < setup.groups; ++i) out.push_back(MakeSingleRankCommunicator());
  return out;
}

[[maybe_unused]] Result<std::vector<std::shared_ptr<Communicator>>> ConnectGlooRanks(
    const RankSetup& setup) {
  DistEnv env;
  env.rank = env.local_rank = setup.rank;
  env.world_size = env.local_world_size = setup.world_size;
  env.master_addr = "127.0.0.1";
  env.master_port = setup.master_port;
  return ConnectGloo(env, setup.groups, setup.timeout);
}

#if STRATA_TEST_HAVE_NCCL
// Rank r on GPU r.
Result<std::vector<std::shared_ptr<Communicator>>> ConnectNcclRanks(const RankSetup& setup) {
  DistEnv env;
  env.rank = env.local_rank = setup.rank;
  env.world_size = env.local_world_size = setup.world_size;
  env.master_addr = "127.0.0.1";
  env.master_port = setup.master_port;
  return ConnectGloo(env, setup.groups, setup.timeout, "", /*nccl_device=*/setup.rank);
}

// Memory of the rank's GPU (cudaMalloc), copied through the host.
class CudaSpace final : public BufferSpace {
 public:
  explicit CudaSpace(int device) { (void)cudaSetDevice(device); }
  void* Allocate(size_t bytes) override {
    void* p = nullptr;
    if (cudaMalloc(&p, bytes > 0 ? bytes : 1) != cudaSuccess) std::abort();  // a test bug
    return p;
  }
  void Free(void* p) override { (void)cudaFree(p); }
  void CopyIn(void* buffer, const void* host, size_t bytes) override {
    if (bytes > 0) (void)cudaMemcpy(buffer, host, bytes, cudaMemcpyHostToDevice);
  }
  void CopyOut(void* host, const void* buffer, size_t bytes) override {
    if (bytes > 0) (void)cudaMemcpy(host, buffer, bytes, cudaMemcpyDeviceToHost);
  }
};

// Why `world` ranks cannot each have a GPU here ("" when they can). Counted in a child process: a
// parent that initialized CUDA could not fork ranks that use it.
std::string FewerGpusThan(int world) {
  int fds[2];
  if (::pipe(fds) != 0) return "pipe failed";
  const pid_t pid = ::fork();
  if (pid == 0) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
    (void)!::write(fds[1], &count, sizeof(count));
    ::_exit(0);
  }
  ::close(fds[1]);
  int count = 0;
  if (pid < 0 || ::read(fds[0], &count, sizeof(count)) != sizeof(count)) count = 0;
  ::close(fds[0]);
  if (pid > 0) ::waitpid(pid, nullptr, 0);
  if (count >= world) return "";
  return std::to_string(world) + " ranks need " + std::to_string(world) + " GPUs, " +
         std::to_string(count) + " visible";
}
#endif

// Every communicator of this build. A new one is one line here.
std::vector<Backend> Backends() {
  std::vector<Backend> b = {{"single", 1, "", ConnectSingle}};
#if STRATA_TEST_HAVE_GLOO
  b.push_back({"gloo", 2, "", ConnectGlooRanks});
  b.push_back({"gloo", 4, "", ConnectGlooRanks});
#endif
#if STRATA_TEST_HAVE_NCCL
  Backend host{"nccl", 2, "host_memory", ConnectNcclRanks};
  host.unavailable = [] { return FewerGpusThan(2); };
  b.push_back(host);
  Backend device{"nccl", 2, "device_memory", ConnectNcclRanks};
  device.memory = [](int rank) { return std::make_unique<CudaSpace>(rank); };
  device.unavailable = [] { return FewerGpusThan(2); };
  b.push_back(device);
#endif
  return b;
}

// Shared by the parent and the ranks of one test: reports and handshake markers.
std::string Path(const std::string& dir, const std::string& name) { return dir + "/" + name; }

void WriteFile(const std::string& path, const void* data, size_t bytes) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary);
    out.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
  }
  std::filesystem::rename(tmp, path);  // whole or absent
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// A buffer in the backend's memory and its host copy: Put() sends the host copy in, Get() brings
// the buffer back into it.
template <typename T>
class Buf {
 public:
  Buf(BufferSpace& space, std::vector<T> init)
      : space_(space), host_(std::move(init)), p_(space.Allocate(host_.size() * sizeof(T))) {
    Put();
  }
  Buf(BufferSpace& space, size_t n, T fill) : Buf(space, std::vector<T>(n, fill)) {}
  ~Buf() { space_.Free(p_); }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;

  T* get() { return static_cast<T*>(p_); }
  void Put() { space_.CopyIn(p_, host_.data(), host_.size() * sizeof(T)); }
  const std::vector<T>& Get() {
    space_.CopyOut(host_.data(), p_, host_.size() * sizeof(T));
    return host_;
  }

 private:
  BufferSpace& space_;
  std::vector<T> host_;
  void* p_;
};

// The index of the first element whose bits differ (or the size, when the sizes differ); -1 when
// they are the same bits.
template <typename T>
int64_t FirstDifference(const std::vector<T>& got, const std::vector<T>& want) {
  if (got.size() != want.size()) return static_cast<int64_t>(std::min(got.size(), want.size()));
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0) return static_cast<int64_t>(i);
  }
  return -1;
}

#define EXPECT_SAME_BITS(got, want)                                                          \
  do {                                                                                       \
    const auto& g_ = (got);                                                                  \
    const auto& w_ = (want);                                                                 \
    const int64_t at_ = FirstDifference(g_, w_);                                             \
    EXPECT_EQ(at_, -1) << #got << " (" << g_.size() << " elements) vs " << #want << " ("     \
                       << w_.size() << "): first difference at " << at_ << ": "              \
                       << (at_ >= 0 && static_cast<size_t>(at_) < g_.size() ? +g_[at_] : 0)  \
                       << " vs "                                                             \
                       << (at_ >= 0 && static_cast<size_t>(at_) < w_.size() ? +w_[at_] : 0); \
  } while (0)

// What a test body sees in each rank's process.
struct RankContext {
  int rank = 0;
  int world = 1;
  std::vector<std::shared_ptr<Communicator>> comms;  // comms[0] unless a test uses groups
  BufferSpace* memory = nullptr;
  std::string dir;  // shared with the parent and the other ranks
  milliseconds timeout{0};

  Communicator& comm() { return *comms[0]; }
  std::string File(const std::string& name) const { return Path(dir, name); }
  // Leaves `values` for the parent to compare across ranks (ExpectSameReportOnEveryRank).
  template <typename T>
  void Report(const std::string& name, const std::vector<T>& values) const {
    WriteFile(File(name + ".rank" + std::to_string(rank)), values.data(),
              values.size() * sizeof(T));
  }
  void Mark(const std::string& name) const { strata::testing::MarkFile(File(name)); }
};

// Sizes every data test goes through: empty, one element, an odd size and a large one (several
// MiB, many of Gloo's messages; below its 256 MiB chunk, which would cost too much here).
constexpr size_t kSizes[] = {0, 1, 1003, (size_t{1} << 20) + 3};

constexpr int kTimedOut = -1;  // RunRanks' code for a rank it had to kill

std::string BackendName(const ::testing::TestParamInfo<Backend>& info) {
  return info.param.name + (info.param.variant.empty() ? "" : "_" + info.param.variant) + "_" +
         std::to_string(info.param.world_size);
}

class CommConformanceTest : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    ASSERT_TRUE(dir_.ok());
    if (const std::string why = GetParam().unavailable(); !why.empty()) {
      GTEST_SKIP() << GetParam().name << " unavailable here: " << why;
    }
  }

  int world() const { return GetParam().world_size; }

  // Runs `body` on every rank, each in a forked process with `groups` communicators connected
  // with `timeout`; expects every rank to pass. A failed EXPECT in a rank prints there (with its
  // rank) and makes that rank's exit code 1.
  void RunOnRanks(const std::function<void(RankContext&)>& body, int groups = 1,
                  milliseconds timeout = milliseconds(30000)) {
    const Backend& backend = GetParam();
    Result<int> port = FreeLoopbackPort();
    ASSERT_TRUE(port.ok()) << port.status().ToString();
    const std::vector<int> codes = strata::testing::RunRanks(
        backend.world_size,
        [&](int rank) {
          SCOPED_TRACE("rank " + std::to_string(rank) + " of " + BackendName({backend, 0}));
          RankSetup setup;
          setup.rank = rank;
          setup.world_size = backend.world_size;
          setup.master_port = *port;
          setup.groups = groups;
          setup.timeout = timeout;
          std::unique_ptr<BufferSpace> memory = backend.memory(rank);
          RankContext ctx;
          ctx.rank = rank;
          ctx.world = backend.world_size;
          ctx.memory = memory.get();
          ctx.dir = dir_.path();
          ctx.timeout = timeout;
          Result<std::vector<std::shared_ptr<Communicator>>> comms = backend.connect(setup);
          if (!comms.ok()) {
            ADD_FAILURE() << "connecting: " << comms.status().ToString();
            return 2;
          }
          if (comms->size() != static_cast<size_t>(groups)) {
            ADD_FAILURE() << comms->size() << " communicators for " << groups << " groups";
            return 2;
          }
          ctx.comms = std::move(comms).value();
          body(ctx);
          return ::testing::Test::HasFailure() ? 1 : 0;
        },
        std::chrono::seconds(120));
    for (int r = 0; r < backend.world_size; ++r) {
      EXPECT_EQ(codes[r], 0) << "rank " << r
                             << (codes[r] == kTimedOut ? " hung and was killed" : " failed");
    }
  }

  // Every rank's report `name`, checked to hold the same bytes on every rank.
  void ExpectSameReportOnEveryRank(const std::string& name) {
    const std::string first = ReadFile(Path(dir_.path(), name + ".rank0"));
    for (int r = 1; r < world(); ++r) {
      EXPECT_TRUE(ReadFile(Path(dir_.path(), name + ".rank" + std::to_string(r))) == first)
          << name << ": rank " << r << " received other bits than rank 0";
    }
  }

  strata::testing::TempDir dir_{"strata-comm-conformance"};
};

TEST_P(CommConformanceTest, ReportsItsRankWorldAndBackend) {
  const std::string name = GetParam().name;
  const int n = world();
  RunOnRanks(
      [&](RankContext& c) {
        for (const auto& comm : c.comms) {
          EXPECT_EQ(comm->rank(), c.rank);
          EXPECT_EQ(comm->world_size(), n);
          EXPECT_EQ(comm->backend(), name);
        }
      },
      /*groups=*/2);
}

// Integer-valued inputs: every order of summation gives the exact sum, which is known.
TEST_P(CommConformanceTest, AllReduceSumIsExactOnEveryRank) {
  const int n = world();
  RunOnRanks([&](RankContext& c) {
    for (size_t count : kSizes) {
      SCOPED_TRACE("count " + std::to_string(count));
      std::vector<double> d(count), want_d(count);
      std::vector<float> f(count), want_f(count);
      for (size_t i = 0; i < count; ++i) {
        // Large integers (past float's 2^24) for double; small ones (exact sums) for float.
        d[i] = static_cast<double>(c.rank + 1) * 1e9 + static_cast<double>(i);
        want_d[i] = n * (n + 1) / 2.0 * 1e9 + n * static_cast<double>(i);
        f[i] = static_cast<float>((c.rank + 1) * (i % 1000)) - 7.0f;
        want_f[i] = static_cast<float>(n * (n + 1) / 2 * (i % 1000)) - 7.0f * n;
      }
      Buf<double> bd(*c.memory, d);
      Buf<float> bf(*c.memory, f);
      ASSERT_TRUE(c.comm().AllReduceSum(bd.get(), count).ok());
      ASSERT_TRUE(c.comm().AllReduceSumFloat(bf.get(), count).ok());
      EXPECT_SAME_BITS(bd.Get(), want_d);
      EXPECT_SAME_BITS(bf.Get(), want_f);
    }
  });
}

// Values whose sum depends on the order of additions (mixed signs and magnitudes): the contract
// promises the same bits on every rank; their value is the sum in rank order when that is the
// only order there is (two ranks: a + b == b + a), otherwise within the error bound of any order.
TEST_P(CommConformanceTest, InexactReductionsGiveTheSameBitsOnEveryRank) {
  const int n = world();
  constexpr size_t kCount = 4099;
  auto inputs = [](int rank) {
    std::mt19937_64 rng(1000 + rank);
    std::uniform_real_distribution<double> mantissa(-1.0, 1.0);
    std::uniform_int_distribution<int> exponent(-20, 20);
    std::vector<double> v(kCount);
    for (double& x : v) x = std::ldexp(mantissa(rng), exponent(rng));
    return v;
  };
  RunOnRanks([&](RankContext& c) {
    std::vector<double> ref_d(kCount, 0.0), abs_d(kCount, 0.0);
    std::vector<float> ref_f(kCount, 0.0f), abs_f(kCount, 0.0f);
    for (int r = 0; r < n; ++r) {  // the sequential reference, in rank order
      const std::vector<double> v = inputs(r);
      for (size_t i = 0; i < kCount; ++i) {
        ref_d[i] += v[i];
        abs_d[i] += std::fabs(v[i]);
        ref_f[i] += static_cast<float>(v[i]);
        abs_f[i] += std::fabs(static_cast<float>(v[i]));
      }
    }
    const std::vector<double> mine = inputs(c.rank);
    Buf<double> d(*c.memory, mine);
    Buf<float> f(*c.memory, std::vector<float>(mine.begin(), mine.end()));
    ASSERT_TRUE(c.comm().AllReduceSum(d.get(), kCount).ok());
    ASSERT_TRUE(c.comm().AllReduceSumFloat(f.get(), kCount).ok());
    const std::vector<double>& got_d = d.Get();
    const std::vector<float>& got_f = f.Get();
    c.Report("sum_double", got_d);
    c.Report("sum_float", got_f);
    if (n <= 2) {
      EXPECT_SAME_BITS(got_d, ref_d);
      EXPECT_SAME_BITS(got_f, ref_f);
    } else {
      // Two orders of n terms differ by at most 2 (n - 1) u sum|x| (u = epsilon / 2).
      for (size_t i = 0; i < kCount; ++i) {
        const double bound_d = n * std::numeric_limits<double>::epsilon() * abs_d[i];
        const double bound_f = n * std::numeric_limits<float>::epsilon() * abs_f[i];
        ASSERT_LE(std::fabs(got_d[i] - ref_d[i]), bound_d) << "double " << i;
        ASSERT_LE(std::fabs(got_f[i] - ref_f[i]), bound_f) << "float " << i;
      }
    }
  });
  ExpectSameReportOnEveryRank("sum_double");
  ExpectSameReportOnEveryRank("sum_float");
}

uint8_t Byte(int rank, size_t i) {
  return static_cast<uint8_t>((rank * 7 + i * 13 + i / 251) % 256);
}

std::vector<uint8_t> Pattern(int rank, size_t bytes) {
  std::vector<uint8_t> v(bytes);
  for (size_t i = 0; i < bytes; ++i) v[i] = Byte(rank, i);
  return v;
}

std::vector<uint8_t> Gathered(int world, size_t bytes) {
  std::vector<uint8_t> v;
  for (int r = 0; r < world; ++r) {
    const std::vector<uint8_t> p = Pattern(r, bytes);
    v.insert(v.end(), p.begin(), p.end());
  }
  return v;
}

TEST_P(CommConformanceTest, AllGatherPutsEachRanksBytesInRankOrder) {
  const int n = world();
  RunOnRanks([&](RankContext& c) {
    for (size_t bytes : kSizes) {
      SCOPED_TRACE("bytes " + std::to_string(bytes));
      const std::vector<uint8_t> mine = Pattern(c.rank, bytes);
      Buf<uint8_t> send(*c.memory, mine);
      Buf<uint8_t> recv(*c.memory, bytes * n, uint8_t{0xEE});
      ASSERT_TRUE(c.comm().AllGather(send.get(), recv.get(), bytes).ok());
      EXPECT_SAME_BITS(recv.Get(), Gathered(n, bytes));
      EXPECT_SAME_BITS(send.Get(), mine);  // not modified
    }
  });
}

TEST_P(CommConformanceTest, AllGatherInPlace) {
  const int n = world();
  RunOnRanks([&](RankContext& c) {
    for (size_t bytes : kSizes) {
      SCOPED_TRACE("bytes " + std::to_string(bytes));
      std::vector<uint8_t> init(bytes * n, 0xEE);
      const std::vector<uint8_t> mine = Pattern(c.rank, bytes);
      std::copy(mine.begin(), mine.end(), init.begin() + c.rank * bytes);
      Buf<uint8_t> buf(*c.memory, init);
      ASSERT_TRUE(c.comm().AllGather(buf.get() + c.rank * bytes, buf.get(), bytes).ok());
      EXPECT_SAME_BITS(buf.Get(), Gathered(n, bytes));
    }
  });
}

// send[j] = (rank + 1) * (j % 4096) - rank: small integers, so the sums are exact.
float RsInput(int rank, size_t j) {
  return static_cast<float>((rank + 1) * static_cast<int>(j % 4096) - rank);
}
std::vector<float> RsSend(int rank, int world, size_t count) {
  std::vector<float> v(count * world);
  for (size_t j = 0; j < v.size(); ++j) v[j] = RsInput(rank, j);
  return v;
}
std::vector<float> RsBlock(int rank, int world, size_t count) {
  std::vector<float> v(count, 0.0f);
  for (size_t i = 0; i < count; ++i) {
    for (int r = 0; r < world; ++r) v[i] += RsInput(r, rank * count + i);
  }
  return v;
}

TEST_P(CommConformanceTest, ReduceScatterSumGivesEachRankTheSumOfItsBlock) {
  const int n = world();
  RunOnRanks([&](RankContext& c) {
    for (size_t count : kSizes) {
      SCOPED_TRACE("count " + std::to_string(count));
      const std::vector<float> input = RsSend(c.rank, n, count);
      Buf<float> send(*c.memory, input);
      Buf<float> recv(*c.memory, count, -1.0f);
      ASSERT_TRUE(c.comm().ReduceScatterSum(send.get(), recv.get(), count).ok());
      EXPECT_SAME_BITS(recv.Get(), RsBlock(c.rank, n, count));
      EXPECT_SAME_BITS(send.Get(), input);  // not modified
    }
  });
}

TEST_P(CommConformanceTest, ReduceScatterSumIntoItsOwnBlockOfSend) {
  const int n = world();
  RunOnRanks([&](RankContext& c) {
    for (size_t count : kSizes) {
      SCOPED_TRACE("count " + std::to_string(count));
      Buf<float> buf(*c.memory, RsSend(c.rank, n, count));
      ASSERT_TRUE(c.comm().ReduceScatterSum(buf.get(), buf.get() + c.rank * count, count).ok());
      const std::vector<float>& got = buf.Get();
      EXPECT_SAME_BITS(
          std::vector<float>(got.begin() + c.rank * count, got.begin() + (c.rank + 1) * count),
          RsBlock(c.rank, n, count));
    }
  });
}

TEST_P(CommConformanceTest, BroadcastCopiesTheRootsBytesFromEveryRoot) {
  const int n = world();
  RunOnRanks([&](RankContext& c) {
    for (int root = 0; root < n; ++root) {
      for (size_t bytes : kSizes) {
        SCOPED_TRACE("root " + std::to_string(root) + ", bytes " + std::to_string(bytes));
        const std::vector<uint8_t> want = Pattern(100 + root, bytes);
        Buf<uint8_t> buf(*c.memory, c.rank == root ? want : Pattern(200 + c.rank, bytes));
        ASSERT_TRUE(c.comm().Broadcast(buf.get(), bytes, root).ok());
        EXPECT_SAME_BITS(buf.Get(), want);
      }
    }
  });
}

// BroadcastString (communicator.h) runs on any Communicator.
TEST_P(CommConformanceTest, BroadcastStringFromEveryRoot) {
  const int n = world();
  RunOnRanks([&](RankContext& c) {
    for (int root = 0; root < n; ++root) {
      for (const size_t size : {size_t{0}, size_t{1}, size_t{100003}}) {
        SCOPED_TRACE("root " + std::to_string(root) + ", size " + std::to_string(size));
        std::string want(size, 'x');
        for (size_t i = 0; i < size; ++i) want[i] = static_cast<char>(Byte(root, i));
        std::string value =
            c.rank == root ? want : "something else on rank " + std::to_string(c.rank);
        ASSERT_TRUE(BroadcastString(c.comm(), value, root).ok());
        EXPECT_EQ(value, want);
      }
    }
  });
}

// No rank leaves the barrier before every rank has entered it. The last rank enters last (it
// waits until each other rank has marked that it is entering); a rank that passed the barrier
// early would find the last rank's mark missing.
TEST_P(CommConformanceTest, BarrierReturnsOnlyAfterEveryRankEntered) {
  const int n = world();
  RunOnRanks(
      [&](RankContext& c) {
        for (size_t g = 0; g < c.comms.size(); ++g) {
          const std::string round = "barrier" + std::to_string(g) + ".";
          if (c.rank == n - 1) {
            for (int r = 0; r < n - 1; ++r) {
              ASSERT_TRUE(WaitForFile(c.File(round + std::to_string(r)))) << "rank " << r;
            }
          }
          c.Mark(round + std::to_string(c.rank));
          ASSERT_TRUE(c.comms[g]->Barrier().ok());
          for (int r = 0; r < n; ++r) {
            EXPECT_TRUE(std::filesystem::exists(c.File(round + std::to_string(r))))
                << "group " << g << ": rank " << r << " had not entered the barrier";
          }
        }
      },
      /*groups=*/2);
}

// Each communicator of a group set is used by its own thread at the same time, as the engine's
// training thread and gradient hand-off worker do; their collectives do not mix.
TEST_P(CommConformanceTest, GroupsRunConcurrentlyFromThreadsOfTheirOwn) {
  const int n = world();
  constexpr int kRounds = 40;
  RunOnRanks(
      [&](RankContext& c) {
        std::vector<double> sums(kRounds, 0.0);
        std::thread reducer([&] {
          for (int k = 0; k < kRounds; ++k) {
            std::vector<double> v(257 + k, c.rank + 1.0 + k);
            Buf<double> b(*c.memory, v);
            if (!c.comms[0]->AllReduceSum(b.get(), v.size()).ok()) return;
            sums[k] = b.Get().back();
          }
        });
        for (int k = 0; k < kRounds; ++k) {
          SCOPED_TRACE("round " + std::to_string(k));
          const size_t bytes = 1000 + 17 * k;
          Buf<uint8_t> send(*c.memory, Pattern(c.rank + k, bytes));
          Buf<uint8_t> recv(*c.memory, bytes * n, uint8_t{0});
          ASSERT_TRUE(c.comms[1]->AllGather(send.get(), recv.get(), bytes).ok());
          std::vector<uint8_t> want;
          for (int r = 0; r < n; ++r) {
            const std::vector<uint8_t> p = Pattern(r + k, bytes);
            want.insert(want.end(), p.begin(), p.end());
          }
          EXPECT_SAME_BITS(recv.Get(), want);
        }
        reducer.join();
        for (int k = 0; k < kRounds; ++k) {
          EXPECT_EQ(sums[k], n * (n + 1) / 2.0 + n * static_cast<double>(k)) << "round " << k;
        }
      },
      /*groups=*/2);
}

// Failures. The configured timeout is short: a test never waits out a production default.
constexpr milliseconds kShortTimeout{3000};
// A failure is reported within the timeout plus what a backend takes to say which rank is lost
// (Gloo: 2.5 s of heartbeats) plus scheduling slack.
constexpr milliseconds kReportSlack{5000};

double SecondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// After a failure every method fails the same way at once: the communicator is unusable.
void ExpectEveryMethodFails(RankContext& c) {
  const int n = c.world;
  Buf<double> d(*c.memory, 3, 1.0);
  Buf<float> f(*c.memory, 3 * n, 1.0f);
  Buf<uint8_t> b(*c.memory, 8 * n, uint8_t{1});
  const Clock::time_point t0 = Clock::now();
  EXPECT_EQ(c.comm().AllReduceSum(d.get(), 3).code(), StatusCode::kUnavailable);
  EXPECT_EQ(c.comm().AllReduceSumFloat(f.get(), 3).code(), StatusCode::kUnavailable);
  EXPECT_EQ(c.comm().AllGather(b.get() + 8 * c.rank, b.get(), 8).code(), StatusCode::kUnavailable);
  EXPECT_EQ(c.comm().ReduceScatterSum(f.get(), f.get() + 3 * c.rank, 3).code(),
            StatusCode::kUnavailable);
  EXPECT_EQ(c.comm().Broadcast(b.get(), 8, 0).code(), StatusCode::kUnavailable);
  EXPECT_EQ(c.comm().Barrier().code(), StatusCode::kUnavailable);
  EXPECT_LT(SecondsSince(t0), 1.0) << "a failed communicator must not wait again";
}

// The ranks that are still there (all but `absent`) leave together: none ends (and so looks lost
// to the others) while another is still finding out what happened.
void LeaveTogether(RankContext& c, int absent) {
  c.Mark("left" + std::to_string(c.rank));
  for (int r = 0; r < c.world; ++r) {
    if (r == absent) continue;
    EXPECT_TRUE(WaitForFile(c.File("left" + std::to_string(r)))) << "rank " << r;
  }
}

// A rank's process ends abruptly after the ranks met; the others' next collective returns
// kUnavailable naming it, within the timeout, and every later call fails too. Lost: the last
// rank, then rank 0 (which hosts Gloo's rendezvous store).
TEST_P(CommConformanceTest, ALostRankIsNamedByTheOthersWithinTheTimeout) {
  const int n = world();
  if (n < 2) GTEST_SKIP() << "a world of one has no other rank to lose";
  for (const int lost : {n - 1, 0}) {
    SCOPED_TRACE("rank " + std::to_string(lost) + " lost");
    const std::string gone = "gone" + std::to_string(lost);
    RunOnRanks(
        [&](RankContext& c) {
          if (c.rank == lost) HoldUntilExit(c.File(gone));
          ASSERT_TRUE(c.comm().Barrier().ok());  // every rank has met (and `lost` holds its lock)
          if (c.rank == lost) ::_exit(0);
          ASSERT_TRUE(WaitUntilGone(c.File(gone)));
          const Clock::time_point t0 = Clock::now();
          Buf<uint8_t> v(*c.memory, 64 * n, uint8_t{1});
          const Status s = lost == 0 ? c.comm().AllGather(v.get() + 64 * c.rank, v.get(), 64)
                                     : c.comm().AllReduceSum(reinterpret_cast<double*>(v.get()), 8);
          const double took = SecondsSince(t0);
          EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
          EXPECT_NE(s.message().find("rank " + std::to_string(lost)), std::string_view::npos)
              << s.ToString();
          EXPECT_LT(took, std::chrono::duration<double>(kShortTimeout + kReportSlack).count())
              << s.ToString();
          ExpectEveryMethodFails(c);
          LeaveTogether(c, lost);
        },
        1, kShortTimeout);
  }
}

// A rank stays alive but stops calling collectives: the others' collective times out after the
// configured timeout with kUnavailable instead of hanging. The stalled rank leaves once they have
// reported.
TEST_P(CommConformanceTest, AStalledRankTimesTheOthersOutWithinTheTimeout) {
  const int n = world();
  if (n < 2) GTEST_SKIP() << "a world of one has no other rank to wait for";
  const int stalled = n - 1;
  RunOnRanks(
      [&](RankContext& c) {
        ASSERT_TRUE(c.comm().Barrier().ok());
        if (c.rank != stalled) {
          const Clock::time_point t0 = Clock::now();
          Buf<float> v(*c.memory, 1000, 1.0f);
          const Status s = c.comm().AllReduceSumFloat(v.get(), 1000);
          const double took = SecondsSince(t0);
          EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
          EXPECT_LT(took, std::chrono::duration<double>(kShortTimeout + kReportSlack).count())
              << s.ToString();
          ExpectEveryMethodFails(c);
        }
        LeaveTogether(c, /*absent=*/-1);
      },
      1, kShortTimeout);
}

INSTANTIATE_TEST_SUITE_P(Communicators, CommConformanceTest, ::testing::ValuesIn(Backends()),
                         BackendName);

}  // namespace
}  // namespace strata::runtime
