// ConnectGloo and the Gloo-backed Communicator (gloo_communicator.h): rendezvous over a c10d
// TCPStore, a join check, a heartbeat thread, and ProcessGroupGloo collectives on CPU tensors
// that wrap the caller's memory (torch::from_blob). c10d reports errors by throwing; every call
// into it is wrapped here and turned into a Status, so nothing escapes.
#include "runtime/comm/gloo_communicator.h"

#include <arpa/inet.h>
#include <c10/util/Exception.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <map>
#include <thread>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <utility>

#include "base/env.h"
#include "base/mutex.h"
#include "base/signals.h"
#include "runtime/comm/nccl_communicator.h"

namespace strata::runtime {
namespace {

using Clock = std::chrono::steady_clock;

// Bytes per Gloo operation: larger buffers are split, so that no count reaches Gloo's int limits
// and its staging copies stay bounded.
constexpr size_t kChunkBytes = size_t{256} << 20;
constexpr auto kHeartbeatPeriod = std::chrono::milliseconds(1000);
constexpr auto kHeartbeatWindow = std::chrono::milliseconds(2500);

std::string Seconds(std::chrono::milliseconds ms) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g s", ms.count() / 1000.0);
  return buf;
}

std::string RankList(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

std::vector<uint8_t> Bytes(const std::string& s) { return {s.begin(), s.end()}; }

// The first key whose value differs between two "key=value" line lists, in words ("" if none):
// "seq_len is 64 on rank 1 and 128 on rank 0".
std::string FirstDifference(const std::string& mine, const std::string& theirs, int their_rank,
                            int my_rank) {
  const std::string on_theirs = " on rank " + std::to_string(their_rank);
  const std::string on_mine = " on rank " + std::to_string(my_rank);
  auto parse = [](const std::string& text) {
    std::vector<std::pair<std::string, std::string>> kv;
    size_t begin = 0;
    while (begin < text.size()) {
      size_t end = text.find('\n', begin);
      if (end == std::string::npos) end = text.size();
      const std::string line = text.substr(begin, end - begin);
      const size_t eq = line.find('=');
      if (!line.empty()) {
        kv.emplace_back(line.substr(0, eq), eq == std::string::npos ? "" : line.substr(eq + 1));
      }
      begin = end + 1;
    }
    return kv;
  };
  const auto a = parse(mine), b = parse(theirs);
  std::map<std::string, std::string> other(b.begin(), b.end());
  auto shown = [](const std::string& v) { return v.size() > 200 ? v.substr(0, 200) + "..." : v; };
  for (const auto& [key, value] : a) {
    auto it = other.find(key);
    const std::string there = it == other.end() ? "(not set)" : it->second;
    if (there != value) {
      return key + " is " + shown(there) + on_theirs + " and " + shown(value) + on_mine;
    }
  }
  for (const auto& [key, value] : b) {
    // (a named reference, not the binding, in the lambda: clang 14 cannot capture bindings)
    const std::string& k = key;
    if (std::none_of(a.begin(), a.end(), [&](const auto& p) { return p.first == k; })) {
      return key + " is " + shown(value) + on_theirs + " and not set" + on_mine;
    }
  }
  return "";
}

std::string HeartbeatKey(int rank) { return "strata/heartbeat/" + std::to_string(rank); }

bool IsLoopback(const std::string& addr) {
  return addr == "localhost" || addr.rfind("127.", 0) == 0 || addr == "::1";
}

// What the communicators of one ConnectGloo call share: the store connection (rank 0: also its
// server) and the heartbeat thread, which has a store connection of its own.
class Rendezvous {
 public:
  Rendezvous(DistEnv env, std::chrono::milliseconds timeout)
      : env_(std::move(env)), timeout_(timeout) {}
  ~Rendezvous() {
    {
      MutexLock lock(&heartbeat_mu_);
      stop_ = true;
    }
    heartbeat_cv_.SignalAll();
    if (heartbeat_.joinable()) heartbeat_.join();
  }

  const DistEnv& env() const { return env_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  const c10::intrusive_ptr<c10d::Store>& store() const { return store_; }

  std::string Where() const {
    return "MASTER_ADDR:MASTER_PORT=" + env_.master_addr + ":" + std::to_string(env_.master_port);
  }

  // Connects (rank 0: serves) the store. kUnavailable when it cannot.
  Status Connect() {
    try {
      c10d::TCPStoreOptions opts;
      opts.port = static_cast<uint16_t>(env_.master_port);
      opts.isServer = env_.rank == 0;
      opts.waitWorkers = false;
      opts.timeout = timeout_;
      store_ = c10::make_intrusive<c10d::TCPStore>(env_.master_addr, opts);
    } catch (const std::exception& e) {
      if (env_.rank == 0) {
        return UnavailableError("rank 0 cannot serve the rendezvous store on " + Where() + ": " +
                                ExceptionFirstLine(e));
      }
      return UnavailableError("rank " + std::to_string(env_.rank) +
                              " cannot reach the rendezvous store of rank 0 at " + Where() +
                              " within " + Seconds(timeout_) +
                              " (set by the MASTER_ADDR and MASTER_PORT environment variables; is "
                              "rank 0 running?): " +
                              ExceptionFirstLine(e));
    }
    return Status::Ok();
  }

  // Every rank publishes its settings and WORLD_SIZE and waits for all ranks' (at most the
  // timeout); a rank whose settings differ from this one's is refused.
  Status JoinCheck(const std::string& settings) {
    const int n = env_.world_size;
    try {
      // Settings first: a rank whose join key is seen has published them.
      store_->set("strata/settings/" + std::to_string(env_.rank), Bytes(settings));
      store_->set("strata/join/" + std::to_string(env_.rank),
                  Bytes(std::to_string(env_.world_size)));
      const Clock::time_point deadline = Clock::now() + timeout_;
      std::vector<bool> seen(n, false);
      for (;;) {
        std::vector<int> missing;
        for (int r = 0; r < n; ++r) {
          if (seen[r]) continue;
          const std::string key = "strata/join/" + std::to_string(r);
          if (!store_->check({key})) {
            missing.push_back(r);
            continue;
          }
          seen[r] = true;
          const std::vector<uint8_t> v = store_->get(key);
          const std::string theirs(v.begin(), v.end());
          if (theirs != std::to_string(env_.world_size)) {
            return Refuse(
                InvalidArgumentError("rank " + std::to_string(r) + " was started with WORLD_SIZE=" +
                                     theirs + ", rank " + std::to_string(env_.rank) +
                                     " with WORLD_SIZE=" + std::to_string(env_.world_size)),
                seen);
          }
          const std::vector<uint8_t> sv = store_->get("strata/settings/" + std::to_string(r));
          if (std::string difference =
                  FirstDifference(settings, std::string(sv.begin(), sv.end()), r, env_.rank);
              !difference.empty()) {
            return Refuse(InvalidArgumentError("rank " + std::to_string(r) + " and rank " +
                                               std::to_string(env_.rank) +
                                               " were started for different runs: " + difference +
                                               "; every rank must be given the same model, data, "
                                               "config and flags"),
                          seen);
          }
        }
        if (missing.empty()) break;
        if (Clock::now() >= deadline) {
          return UnavailableError(RankList(missing) + " did not join within " + Seconds(timeout_) +
                                  " (WORLD_SIZE=" + std::to_string(n) + ", " + Where() + ")");
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    } catch (const std::exception& e) {
      return UnavailableError("joining the ranks at " + Where() +
                              " failed: " + ExceptionFirstLine(e));
    }
    return Status::Ok();
  }

  // A rank that refuses the others says so in the store; rank 0, whose store dies with it, first
  // waits (at most the timeout) until every rank it has seen has refused too, so that they all
  // report the difference instead of a lost store.
  Status Refuse(Status why, const std::vector<bool>& seen) {
    try {
      store_->set("strata/refused/" + std::to_string(env_.rank), Bytes("1"));
      if (env_.rank != 0) return why;
      const Clock::time_point deadline = Clock::now() + timeout_;
      for (int r = 1; r < static_cast<int>(seen.size()); ++r) {
        if (!seen[r]) continue;
        while (!store_->check({"strata/refused/" + std::to_string(r)}) && Clock::now() < deadline) {
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
      }
    } catch (const std::exception&) {
      // The refusal stands; the store's troubles are for the other ranks to report.
    }
    return why;
  }

  // Starts the heartbeat thread (its own connection to the store).
  Status StartHeartbeat() {
    c10::intrusive_ptr<c10d::Store> hb;
    try {
      c10d::TCPStoreOptions opts;
      opts.port = static_cast<uint16_t>(env_.master_port);
      opts.isServer = false;
      opts.waitWorkers = false;
      opts.timeout = timeout_;
      hb = c10::make_intrusive<c10d::TCPStore>(env_.master_addr, opts);
      hb->add(HeartbeatKey(env_.rank), 1);
    } catch (const std::exception& e) {
      return UnavailableError("heartbeat connection to " + Where() + ": " + ExceptionFirstLine(e));
    }
    heartbeat_ = std::thread([this, hb = std::move(hb)] {
      MutexLock lock(&heartbeat_mu_);
      for (;;) {
        const auto beat = Clock::now() + kHeartbeatPeriod;
        while (!stop_ && heartbeat_cv_.WaitUntil(&heartbeat_mu_, beat)) {
        }
        if (stop_) break;
        lock.Unlock();
        try {
          hb->add(HeartbeatKey(env_.rank), 1);
        } catch (const std::exception&) {
          // The store is gone (rank 0 ended); a failing collective reports it.
        }
        lock.Lock();
      }
    });
    return Status::Ok();
  }

  // Which ranks are gone, in words: those whose heartbeat stood still for kHeartbeatWindow, or
  // rank 0 when the store it hosts cannot be reached. Takes about kHeartbeatWindow.
  std::string DiagnoseLoss() {
    MutexLock lock(&diagnose_mu_);
    const int n = env_.world_size;
    std::vector<int64_t> first(n), second(n);
    try {
      for (int r = 0; r < n; ++r) first[r] = store_->add(HeartbeatKey(r), 0);
      std::this_thread::sleep_for(kHeartbeatWindow);
      for (int r = 0; r < n; ++r) second[r] = store_->add(HeartbeatKey(r), 0);
    } catch (const std::exception& e) {
      return "rank 0 is gone (the rendezvous store it hosts at " + Where() +
             " cannot be reached: " + ExceptionFirstLine(e) + ")";
    }
    std::vector<int> gone;
    for (int r = 0; r < n; ++r) {
      if (r != env_.rank && first[r] == second[r]) gone.push_back(r);
    }
    if (gone.empty()) {
      return "every rank's heartbeat is alive (a rank may be stuck or slower than the " +
             Seconds(timeout_) + " timeout)";
    }
    return RankList(gone) + (gone.size() == 1 ? " is" : " are") + " gone (no heartbeat for " +
           Seconds(std::chrono::duration_cast<std::chrono::milliseconds>(kHeartbeatWindow)) + ")";
  }

 private:
  const DistEnv env_;
  const std::chrono::milliseconds timeout_;
  c10::intrusive_ptr<c10d::Store> store_;
  Mutex diagnose_mu_;  // one diagnosis at a time (they sleep)
  Mutex heartbeat_mu_;
  CondVar heartbeat_cv_;
  bool stop_ GUARDED_BY(heartbeat_mu_) = false;
  std::thread heartbeat_;
};

// Bounds every step of the rendezvous. c10d's TCPStore waits without a limit for the answer to
// some requests (check, add) when the peer accepted the connection but never answers (another
// program listening on MASTER_PORT, a stopped rank 0), so a rank could hang forever. A thread
// watches the current step: when one lasts longer than the timeout (plus a margin, so c10d's own
// timeouts, which say more, fire first), it shuts down this process's sockets to MASTER_PORT, so
// the blocked read returns and the step fails; ConnectGloo then reports what the rank was waiting
// for (Fired/Message). Should the step still not return, the process ends with exit code 1 after
// another such period (nothing to clean up then: the rendezvous runs before swap files exist).
class RendezvousWatchdog {
 public:
  RendezvousWatchdog(const DistEnv& env, std::string where, std::chrono::milliseconds timeout)
      : port_(env.master_port),
        rank_(env.rank),
        where_(std::move(where)),
        limit_(timeout + std::chrono::seconds(2)) {
    thread_ = std::thread([this] { Watch(); });
  }
  ~RendezvousWatchdog() {
    {
      MutexLock lock(&mu_);
      done_ = true;
    }
    cv_.SignalAll();
    thread_.join();
  }
  // A new step begins: its own limit starts now.
  void Enter(const char* step) {
    MutexLock lock(&mu_);
    step_ = step;
    deadline_ = Clock::now() + limit_;
  }
  bool Fired() {
    MutexLock lock(&mu_);
    return fired_;
  }
  // What the rank was waiting for when the watchdog fired.
  std::string Message() EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    return "rank " + std::to_string(rank_) + ": no answer at " + where_ +
           " (set by the MASTER_ADDR and MASTER_PORT environment variables) within " +
           Seconds(std::chrono::duration_cast<std::chrono::milliseconds>(limit_)) + " while " +
           (fired_step_ != nullptr ? fired_step_ : "meeting the other ranks") +
           " (strata.comms_timeout_seconds plus 2 s): is rank 0 running, and is MASTER_PORT used "
           "by another program?";
  }

 private:
  // Shuts down every TCP socket of this process connected to port `port_` (the store's).
  void ShutDownStoreSockets() const {
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
      int fd = -1;
      try {
        fd = std::stoi(entry.path().filename().string());
      } catch (const std::exception&) {
        continue;
      }
      sockaddr_storage peer{};
      socklen_t len = sizeof(peer);
      if (::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &len) != 0) continue;
      int port = -1;
      if (peer.ss_family == AF_INET) {
        port = ntohs(reinterpret_cast<const sockaddr_in*>(&peer)->sin_port);
      } else if (peer.ss_family == AF_INET6) {
        port = ntohs(reinterpret_cast<const sockaddr_in6*>(&peer)->sin6_port);
      }
      if (port == port_) ::shutdown(fd, SHUT_RDWR);
    }
  }

  void Watch() EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    while (!done_) {
      if (step_ != nullptr && Clock::now() >= deadline_) {
        if (!fired_) {
          fired_ = true;
          fired_step_ = step_;
          deadline_ = Clock::now() + limit_;
          lock.Unlock();
          ShutDownStoreSockets();
          lock.Lock();
        } else {
          lock.Unlock();
          const std::string line = "strata: unavailable: " + Message() + "\n";
          (void)!::write(2, line.data(), line.size());
          ::_exit(1);
        }
      }
      (void)cv_.WaitFor(&mu_, std::chrono::milliseconds(100));
    }
  }

  const int port_;
  const int rank_;
  const std::string where_;
  const Clock::duration limit_;
  Mutex mu_;
  CondVar cv_;
  const char* step_ GUARDED_BY(mu_) = nullptr;
  const char* fired_step_ GUARDED_BY(mu_) = nullptr;
  Clock::time_point deadline_ GUARDED_BY(mu_);
  bool fired_ GUARDED_BY(mu_) = false;
  bool done_ GUARDED_BY(mu_) = false;
  std::thread thread_;
};

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(std::shared_ptr<Rendezvous> rendezvous,
                   c10::intrusive_ptr<c10d::ProcessGroupGloo> pg)
      : rendezvous_(std::move(rendezvous)), pg_(std::move(pg)) {}

  int rank() const override { return rendezvous_->env().rank; }
  int world_size() const override { return rendezvous_->env().world_size; }
  std::string backend() const override { return "gloo"; }

  Status AllReduceSum(double* values, size_t count) override {
    return AllReduce(values, count, torch::kFloat64, "all_reduce");
  }
  Status AllReduceSumFloat(float* values, size_t count) override {
    return AllReduce(values, count, torch::kFloat32, "all_reduce");
  }

  Status AllGather(const void* send, void* recv, size_t bytes) override {
    const int n = world_size();
    auto* out = static_cast<uint8_t*>(recv);
    return Run("all_gather", [&] {
      for (size_t off = 0; off < bytes; off += kChunkBytes) {
        const int64_t len = static_cast<int64_t>(std::min(kChunkBytes, bytes - off));
        std::vector<at::Tensor> input = {Wrap(
            const_cast<uint8_t*>(static_cast<const uint8_t*>(send)) + off, len, torch::kUInt8)};
        std::vector<std::vector<at::Tensor>> outputs(1);
        for (int r = 0; r < n; ++r) {
          outputs[0].push_back(
              Wrap(out + static_cast<size_t>(r) * bytes + off, len, torch::kUInt8));
        }
        pg_->allgather(outputs, input)->wait();
      }
    });
  }

  // All-reduce of a copy of `send` (ProcessGroupGloo in torch 1.13 has no reduce_scatter), then
  // this rank's block is copied out.
  Status ReduceScatterSum(const float* send, float* recv, size_t count) override {
    const size_t total = count * static_cast<size_t>(world_size());
    scratch_.resize(total);
    if (total > 0) std::memcpy(scratch_.data(), send, total * sizeof(float));
    STRATA_RETURN_IF_ERROR(AllReduce(scratch_.data(), total, torch::kFloat32, "reduce_scatter"));
    if (count > 0) {
      std::memmove(recv, scratch_.data() + static_cast<size_t>(rank()) * count,
                   count * sizeof(float));
    }
    return Status::Ok();
  }

  Status Broadcast(void* data, size_t bytes, int root) override {
    if (root < 0 || root >= world_size()) {
      return InvalidArgumentError("Broadcast: root " + std::to_string(root) + " outside 0.." +
                                  std::to_string(world_size() - 1));
    }
    return Run("broadcast", [&] {
      for (size_t off = 0; off < bytes; off += kChunkBytes) {
        const int64_t len = static_cast<int64_t>(std::min(kChunkBytes, bytes - off));
        std::vector<at::Tensor> t = {Wrap(static_cast<uint8_t*>(data) + off, len, torch::kUInt8)};
        c10d::BroadcastOptions opts;
        opts.rootRank = root;
        pg_->broadcast(t, opts)->wait();
      }
    });
  }

  Status Barrier() override {
    return Run("barrier", [&] { pg_->barrier()->wait(); });
  }

 private:
  static at::Tensor Wrap(void* p, int64_t numel, at::ScalarType type) {
    return torch::from_blob(p, {numel}, torch::TensorOptions().dtype(type).device(torch::kCPU));
  }

  Status AllReduce(void* values, size_t count, at::ScalarType type, const char* op) {
    const size_t elem = type == torch::kFloat64 ? sizeof(double) : sizeof(float);
    const size_t per_chunk = kChunkBytes / elem;
    return Run(op, [&] {
      for (size_t off = 0; off < count; off += per_chunk) {
        const int64_t len = static_cast<int64_t>(std::min(per_chunk, count - off));
        std::vector<at::Tensor> t = {Wrap(static_cast<uint8_t*>(values) + off * elem, len, type)};
        pg_->allreduce(t)->wait();
      }
    });
  }

  // Runs `body` (c10d calls), turning what it throws into kUnavailable naming the lost ranks.
  template <typename Body>
  Status Run(const char* op, Body&& body) {
    if (!failed_.ok()) return failed_;
    try {
      body();
      return Status::Ok();
    } catch (const std::exception& e) {
      failed_ =
          UnavailableError(std::string(op) + " over gloo failed: " + rendezvous_->DiagnoseLoss() +
                           ": " + ExceptionFirstLine(e));
    } catch (...) {
      failed_ =
          UnavailableError(std::string(op) + " over gloo failed: " + rendezvous_->DiagnoseLoss() +
                           ": unknown exception");
    }
    return failed_;
  }

  std::shared_ptr<Rendezvous> rendezvous_;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg_;  // destroyed before rendezvous_
  std::vector<float> scratch_;                     // ReduceScatterSum's copy of `send`
  Status failed_;                                  // the first failure; then every call fails
};

std::shared_ptr<::gloo::transport::Device> MakeDevice(const DistEnv& env) {
  if (const char* ifname = GetEnv("GLOO_SOCKET_IFNAME"); ifname != nullptr && *ifname) {
    return c10d::ProcessGroupGloo::createDeviceForInterface(ifname);
  }
  if (IsLoopback(env.master_addr))
    return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  return c10d::ProcessGroupGloo::createDefaultDevice();
}

}  // namespace

std::string ExceptionFirstLine(const std::exception& e) {
  std::string what;
  if (const auto* c10e = dynamic_cast<const c10::Error*>(&e)) {
    what = c10e->what_without_backtrace();
  } else {
    what = e.what();
  }
  const size_t nl = what.find('\n');
  return nl == std::string::npos ? what : what.substr(0, nl);
}

bool NcclBuilt() { return STRATA_HAVE_NCCL; }

Result<std::vector<std::shared_ptr<Communicator>>> ConnectGloo(const DistEnv& env, int groups,
                                                               std::chrono::milliseconds timeout,
                                                               const std::string& settings,
                                                               int nccl_device) {
  if (groups < 1) return InvalidArgumentError("ConnectGloo: groups " + std::to_string(groups));
  if (env.rank < 0 || env.rank >= env.world_size) {
    return InvalidArgumentError("ConnectGloo: rank " + std::to_string(env.rank) +
                                " outside the world of " + std::to_string(env.world_size));
  }
  if (nccl_device >= 0) {
#if STRATA_HAVE_NCCL
    PrepareNcclEnvironment();  // before the heartbeat thread starts
#else
    return UnavailableError("ranks on cuda:" + std::to_string(nccl_device) +
                            " need c10d's ProcessGroupNCCL, which this build does not have");
#endif
  }
  // A rank that dies closes its sockets under the others' writes: EPIPE to report, not a signal.
  IgnoreBrokenPipes();
  auto rendezvous = std::make_shared<Rendezvous>(env, timeout);
  RendezvousWatchdog watchdog(env, rendezvous->Where(), timeout);
  // A step that failed because the watchdog cut it short says what it was waiting for.
  auto bounded = [&](const char* step, const std::function<Status()>& run) -> Status {
    watchdog.Enter(step);
    Status s = run();
    if (!s.ok() && watchdog.Fired()) return UnavailableError(watchdog.Message());
    return s;
  };
  STRATA_RETURN_IF_ERROR(
      bounded("connecting to rank 0's store", [&] { return rendezvous->Connect(); }));
  STRATA_RETURN_IF_ERROR(bounded("starting the heartbeat (a second connection to rank 0's store)",
                                 [&] { return rendezvous->StartHeartbeat(); }));
  STRATA_RETURN_IF_ERROR(bounded("waiting for every rank to join and comparing their settings",
                                 [&] { return rendezvous->JoinCheck(settings); }));
  watchdog.Enter("creating the gloo process groups (every rank's address through the store)");
  std::vector<std::shared_ptr<Communicator>> out;
  try {
    auto options = c10d::ProcessGroupGloo::Options::create(timeout);
    options->devices.push_back(MakeDevice(env));
    for (int i = 0; i < groups; ++i) {
      watchdog.Enter("creating the gloo process groups (every rank's address through the store)");
      auto prefixed = c10::make_intrusive<c10d::PrefixStore>("strata/pg" + std::to_string(i),
                                                             rendezvous->store());
      auto pg =
          c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, env.rank, env.world_size, options);
      auto gloo = std::make_shared<GlooCommunicator>(rendezvous, std::move(pg));
      if (nccl_device < 0) {
        out.push_back(std::move(gloo));
        continue;
      }
#if STRATA_HAVE_NCCL
      watchdog.Enter("creating the nccl process groups");
      auto nccl_store = c10::make_intrusive<c10d::PrefixStore>("strata/nccl" + std::to_string(i),
                                                               rendezvous->store());
      Result<std::shared_ptr<Communicator>> nccl =
          MakeNcclCommunicator(std::move(gloo), nccl_store, nccl_device, timeout,
                               [rendezvous] { return rendezvous->DiagnoseLoss(); });
      if (!nccl.ok()) return nccl.status();
      out.push_back(std::move(nccl).value());
#endif
    }
  } catch (const std::exception& e) {
    if (watchdog.Fired()) return UnavailableError(watchdog.Message());
    return UnavailableError("creating the gloo process groups of rank " + std::to_string(env.rank) +
                            " (WORLD_SIZE=" + std::to_string(env.world_size) + ", " +
                            rendezvous->Where() + ") failed: " + ExceptionFirstLine(e));
  }
  return out;
}

}  // namespace strata::runtime
