// `strata bench tiers`: how close the tier manager comes to the raw NVMe bandwidth.
//
// It lays out `--size` bytes as blocks of `--block` bytes in a SwapSpace under `--path`, then, in
// one run and with the same I/O backend and settings:
//   1. raw write: every block written from pinned buffers straight through the IoBackend, a
//      window of `--prefetch`+1 blocks in flight (the ceiling for write-back);
//   2. write-back: every block written on the device, marked dirty and flushed by the
//      TierManager (device -> pinned -> NVMe);
//   3. raw read: every block read back through the IoBackend the same way;
//   4. fetch: every block acquired on the device in order, with the next `--prefetch` blocks
//      prefetched to the device and the two after them read into pinned memory, as the runtime's
//      parameter coordinator does (NVMe -> pinned -> device; it reads pinned copies twice as far
//      ahead as device copies).
// Budgets are set so that only prefetch+2 blocks fit on the device and prefetch+3 in pinned memory
// (one more, so that as many reads are in flight as in the raw pass while two blocks are on their
// way to the device), so every fetch really comes from NVMe. Phases 2 and 4 checksum each block as
// training does (strata.swap_checksums); --no-swap-checksums measures them without.
//   5. device copies: every block copied pinned -> device and device -> pinned straight through
//      the DeviceBackend, a window of `--prefetch`+1 copies in flight (the ceiling for the
//      tier manager's device copies; on a GPU, what cudaMemcpyAsync gives from registered memory).
// `--device` picks the device as `strata train` does: auto (a GPU where there is one, else the
// host-emulated device), host, cuda[:N].
#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/bytes.h"
#include "base/clock.h"
#include "base/logging.h"
#include "bench/commands.h"
#include "bench/io_cli.h"
#include "runtime/commands/flag_checks.h"
#include "swap/io_backend.h"
#include "swap/swap_space.h"
#include "tiers/device_registry.h"
#include "tiers/pinned_arena.h"
#include "tiers/tier_manager.h"

namespace strata::bench {
namespace {

struct TiersFlags {
  IoCliFlags io;  // --path, --block-size, --queue-depth, --threads, --backend... as `bench io`
  std::string size = "2G";
  std::string block = "64M";
  uint32_t prefetch = 2;
  bool validate = false;
  bool no_swap_checksums = false;  // TierManagerOptions::verify_checksums off
  std::string device = "auto";
};

struct Phase {
  double seconds = 0;
  uint64_t bytes = 0;
  double gbps() const { return seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0; }
};

uint64_t Mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  return x;
}

// Fills the first and last 4 KiB of a block with a pattern (enough to validate placement without
// making the benchmark CPU bound).
void Stamp(std::byte* p, uint64_t bytes, uint64_t block) {
  auto* w = reinterpret_cast<uint64_t*>(p);
  const size_t words = std::min<uint64_t>(bytes, 4096) / 8;
  for (size_t i = 0; i < words; ++i) w[i] = Mix(block * 1000003 + i);
  auto* tail = reinterpret_cast<uint64_t*>(p + bytes - words * 8);
  for (size_t i = 0; i < words; ++i) tail[i] = Mix(~block * 7919 + i);
}

bool StampOk(const std::byte* p, uint64_t bytes, uint64_t block) {
  const auto* w = reinterpret_cast<const uint64_t*>(p);
  const size_t words = std::min<uint64_t>(bytes, 4096) / 8;
  for (size_t i = 0; i < words; ++i) {
    if (w[i] != Mix(block * 1000003 + i)) return false;
  }
  const auto* tail = reinterpret_cast<const uint64_t*>(p + bytes - words * 8);
  for (size_t i = 0; i < words; ++i) {
    if (tail[i] != Mix(~block * 7919 + i)) return false;
  }
  return true;
}

// Raw I/O over all extents with a window of `window` blocks in flight.
Result<Phase> RawPass(IoBackend& io, IoOp op, const std::vector<SwapExtent>& extents,
                      std::vector<PinnedBuffer>& buffers, uint32_t window) {
  Phase phase;
  Stopwatch watch;
  std::deque<IoTicket> in_flight;
  for (size_t i = 0; i < extents.size(); ++i) {
    if (in_flight.size() >= window) {
      STRATA_RETURN_IF_ERROR(in_flight.front().Wait());
      in_flight.pop_front();
    }
    PinnedBuffer& buf = buffers[i % buffers.size()];
    in_flight.push_back(io.Submit(IoRequest{
        op, extents[i].fd, extents[i].offset, {buf.data(), extents[i].padded_length}, nullptr}));
    phase.bytes += extents[i].padded_length;
  }
  while (!in_flight.empty()) {
    STRATA_RETURN_IF_ERROR(in_flight.front().Wait());
    in_flight.pop_front();
  }
  phase.seconds = watch.Seconds();
  return phase;
}

// Device copies of every block between pinned buffers and device memory, `window` in flight on one
// stream per direction (as the tier manager's copies run).
Result<Phase> CopyPass(DeviceBackend& device, CopyKind kind, uint64_t count, uint64_t block,
                       std::vector<PinnedBuffer>& buffers, std::vector<DeviceMemory>& slots,
                       uint32_t window) {
  STRATA_ASSIGN_OR_RETURN(auto stream, device.CreateStream("bench-copy"));
  Phase phase;
  Stopwatch watch;
  std::deque<Event> in_flight;
  for (uint64_t i = 0; i < count; ++i) {
    if (in_flight.size() >= window) {
      STRATA_RETURN_IF_ERROR(in_flight.front().Wait());
      in_flight.pop_front();
    }
    void* host = buffers[i % buffers.size()].data();
    void* dev = slots[i % slots.size()].data();
    const bool to_device = kind == CopyKind::kHostToDevice;
    STRATA_RETURN_IF_ERROR(
        device.CopyAsync(to_device ? dev : host, to_device ? host : dev, block, kind, *stream));
    STRATA_ASSIGN_OR_RETURN(Event e, device.RecordEvent(*stream));
    in_flight.push_back(std::move(e));
    phase.bytes += block;
  }
  while (!in_flight.empty()) {
    STRATA_RETURN_IF_ERROR(in_flight.front().Wait());
    in_flight.pop_front();
  }
  phase.seconds = watch.Seconds();
  return phase;
}

Status RunBenchTiers(const TiersFlags& f, nlohmann::json* out) {
  STRATA_ASSIGN_OR_RETURN(const uint64_t total, ParseBytes(f.size));
  STRATA_ASSIGN_OR_RETURN(const uint64_t block, ParseBytes(f.block));
  IoBenchConfig io_config;
  STRATA_RETURN_IF_ERROR(ResolveIoCliFlags(f.io, &io_config));
  if (block == 0 || block % 4096 != 0) {
    return InvalidArgumentError("--block must be a positive multiple of 4K, got " + f.block);
  }
  if (total < block) return InvalidArgumentError("--size must be at least one --block");
  const uint64_t count = total / block;
  const uint32_t window = f.prefetch + 1;

  // Room for the blocks in flight plus the one being used, in both tiers.
  const uint64_t resident = (uint64_t{f.prefetch} + 2) * block;
  auto opened = OpenDevice(f.device, DeviceOptions{.budget_bytes = resident});
  if (!opened.ok()) return opened.status().WithContext("--device");
  std::unique_ptr<DeviceBackend> device_owner = std::move(*opened);
  DeviceBackend& device = *device_owner;
  // Only the host-emulated device's memory can be written and read by the CPU directly.
  const bool host_addressable = device.info().host_addressable;
  STRATA_ASSIGN_OR_RETURN(auto io, OpenIoBackend(io_config.backend, io_config.io, io_config.dir));
  STRATA_ASSIGN_OR_RETURN(auto swap, SwapSpace::Create({.nvme_path = io_config.dir,
                                                        .use_direct = !io_config.buffered}));
  STRATA_RETURN_IF_ERROR(swap->Reserve("params", count * block));
  std::vector<SwapExtent> extents;
  for (uint64_t i = 0; i < count; ++i) {
    STRATA_ASSIGN_OR_RETURN(SwapExtent e,
                            swap->Allocate("bench.block." + std::to_string(i), "params", block));
    extents.push_back(e);
  }

  // Pinned: the device's blocks plus one, the read stage's extra block in flight.
  STRATA_ASSIGN_OR_RETURN(auto arena, PinnedArena::Create({.bytes = resident + block,
                                                           .budget_key = "bench tiers --prefetch",
                                                           .device = &device}));
  // Staging for stamping and checking blocks on a device the CPU cannot address.
  STRATA_ASSIGN_OR_RETURN(auto staging_stream, device.CreateStream("bench-stamp"));
  std::vector<std::byte> staging;
  auto stamp = [&](void* dev, uint64_t i) -> Status {
    if (host_addressable) {
      Stamp(static_cast<std::byte*>(dev), block, i);
      return Status::Ok();
    }
    staging.resize(block);  // only its head and tail are stamped and checked
    Stamp(staging.data(), block, i);
    STRATA_RETURN_IF_ERROR(
        device.CopyAsync(dev, staging.data(), block, CopyKind::kHostToDevice, *staging_stream));
    return device.Synchronize(*staging_stream);
  };
  auto stamp_ok = [&](const void* dev, uint64_t i) -> Result<bool> {
    if (host_addressable) return StampOk(static_cast<const std::byte*>(dev), block, i);
    staging.resize(block);
    STRATA_RETURN_IF_ERROR(
        device.CopyAsync(staging.data(), dev, block, CopyKind::kDeviceToHost, *staging_stream));
    STRATA_RETURN_IF_ERROR(device.Synchronize(*staging_stream));
    return StampOk(staging.data(), block, i);
  };

  nlohmann::json& j = *out;
  j["backend"] = std::string(io->name());
  j["device"] = device.info().name;
  j["blocks"] = count;
  j["block_bytes"] = block;
  j["prefetch"] = f.prefetch;
  j["swap_checksums"] = !f.no_swap_checksums;

  // 1. Raw write and 3. raw read use pinned buffers from the same arena.
  Phase raw_write, raw_read, writeback, fetch, h2d, d2h;
  {
    std::vector<PinnedBuffer> buffers;
    for (uint32_t i = 0; i < window; ++i) {
      STRATA_ASSIGN_OR_RETURN(PinnedBuffer b, arena->Allocate(block));
      buffers.push_back(std::move(b));
    }
    STRATA_ASSIGN_OR_RETURN(raw_write, RawPass(*io, IoOp::kWrite, extents, buffers, window));
    STRATA_ASSIGN_OR_RETURN(raw_read, RawPass(*io, IoOp::kRead, extents, buffers, window));
    // 5. Device copies, with as many device slots as copies in flight.
    std::vector<DeviceMemory> slots;
    for (uint32_t i = 0; i < window; ++i) {
      STRATA_ASSIGN_OR_RETURN(DeviceMemory m, device.Allocate(block));
      slots.push_back(std::move(m));
    }
    STRATA_ASSIGN_OR_RETURN(
        h2d, CopyPass(device, CopyKind::kHostToDevice, count, block, buffers, slots, window));
    STRATA_ASSIGN_OR_RETURN(
        d2h, CopyPass(device, CopyKind::kDeviceToHost, count, block, buffers, slots, window));
  }

  STRATA_ASSIGN_OR_RETURN(auto manager,
                          TierManager::Create({.device = &device,
                                               .arena = arena.get(),
                                               .io = io.get(),
                                               .verify_checksums = !f.no_swap_checksums}));
  std::vector<BlockId> ids;
  for (uint64_t i = 0; i < count; ++i) {
    NvmeLocation loc{extents[i].fd, extents[i].offset, extents[i].padded_length};
    STRATA_ASSIGN_OR_RETURN(BlockId id,
                            manager->AddBlock("block." + std::to_string(i), block, &loc));
    ids.push_back(id);
  }

  // 2. Write-back: written on the device, then flushed down through pinned memory to NVMe.
  {
    Stopwatch watch;
    for (uint64_t i = 0; i < count; ++i) {
      STRATA_ASSIGN_OR_RETURN(Pin pin,
                              manager->Acquire(ids[i], Tier::kDevice, TierManager::Access::kWrite));
      STRATA_RETURN_IF_ERROR(pin.Wait());
      // Stamped only where it is free (host memory) or asked for: on a GPU a stamp is a copy.
      if (host_addressable || f.validate) STRATA_RETURN_IF_ERROR(stamp(pin.data(), i));
      pin.MarkDirty();
    }
    STRATA_RETURN_IF_ERROR(manager->FlushAll());
    writeback.seconds = watch.Seconds();
    writeback.bytes = count * block;
  }

  // 4. Fetch in order with prefetching. Start from a cold state: the last blocks are still
  // resident after the write-back, so walk the blocks starting past them.
  {
    const TierTelemetry before = manager->telemetry();
    Stopwatch watch;
    uint64_t bad = 0;
    for (uint64_t i = 0; i < count; ++i) {
      for (uint64_t k = i + 1; k <= i + f.prefetch && k < count; ++k) {
        STRATA_RETURN_IF_ERROR(manager->Prefetch(ids[k], Tier::kDevice));
      }
      // The read stage runs two blocks further ahead into pinned memory (as the coordinator's
      // pinned prefetch does), so as many reads are in flight as in the raw pass.
      for (uint64_t k = i + f.prefetch + 1; k <= i + f.prefetch + 2 && k < count; ++k) {
        STRATA_RETURN_IF_ERROR(manager->Prefetch(ids[k], Tier::kPinned));
      }
      STRATA_ASSIGN_OR_RETURN(Pin pin, manager->Acquire(ids[i], Tier::kDevice));
      STRATA_RETURN_IF_ERROR(pin.Wait());
      if (f.validate) {
        STRATA_ASSIGN_OR_RETURN(const bool ok, stamp_ok(pin.data(), i));
        if (!ok) ++bad;
      }
    }
    fetch.seconds = watch.Seconds();
    fetch.bytes = count * block;  // bytes delivered to the device
    // Nearly all of it came from NVMe: the budgets hold only prefetch+2 blocks.
    j["fetch_from_nvme_bytes"] = manager->telemetry().nvme_to_pinned - before.nvme_to_pinned;
    if (f.validate) {
      j["validated"] = bad == 0;
      if (bad != 0) {
        return DataLossError(std::to_string(bad) + " of " + std::to_string(count) +
                             " blocks fetched to the device did not match what was written");
      }
    }
  }

  auto phase_json = [](const Phase& p) {
    return nlohmann::json{{"gbps", p.gbps()}, {"bytes", p.bytes}, {"seconds", p.seconds}};
  };
  j["raw_write"] = phase_json(raw_write);
  j["writeback"] = phase_json(writeback);
  j["raw_read"] = phase_json(raw_read);
  j["fetch"] = phase_json(fetch);
  j["copy_to_device"] = phase_json(h2d);
  j["copy_from_device"] = phase_json(d2h);
  j["fetch_gbps"] = fetch.gbps();
  j["raw_read_gbps"] = raw_read.gbps();
  j["writeback_gbps"] = writeback.gbps();
  j["raw_write_gbps"] = raw_write.gbps();
  j["fetch_vs_raw_read"] = raw_read.gbps() > 0 ? fetch.gbps() / raw_read.gbps() : 0;
  j["writeback_vs_raw_write"] = raw_write.gbps() > 0 ? writeback.gbps() / raw_write.gbps() : 0;
  const TierTelemetry t = manager->telemetry();
  j["telemetry"] = {{"nvme_to_pinned", t.nvme_to_pinned},
                    {"pinned_to_device", t.pinned_to_device},
                    {"device_to_pinned", t.device_to_pinned},
                    {"pinned_to_nvme", t.pinned_to_nvme},
                    {"evictions", t.evictions},
                    {"wait_seconds", t.wait_seconds},
                    {"checksum_bytes", t.checksum_bytes},
                    {"checksum_seconds", t.checksum_seconds},
                    {"device_peak_bytes", t.device_peak_bytes},
                    {"pinned_peak_bytes", t.pinned_peak_bytes}};
  return Status::Ok();
}

void PrintHuman(const nlohmann::json& j, std::FILE* out) {
  std::fprintf(out,
               "strata bench tiers: %llu blocks of %s, prefetch %d, backend %s, swap checksums %s, "
               "device: %s\n",
               static_cast<unsigned long long>(j["blocks"].get<uint64_t>()),
               FormatBytes(j["block_bytes"].get<uint64_t>()).c_str(), j["prefetch"].get<int>(),
               j["backend"].get<std::string>().c_str(),
               j["swap_checksums"].get<bool>() ? "on" : "off",
               j["device"].get<std::string>().c_str());
  std::fprintf(out, "  (GB/s = 1e9 bytes/s)\n");
  std::fprintf(out, "  raw NVMe write   %7.2f GB/s\n", j["raw_write_gbps"].get<double>());
  std::fprintf(out, "  write-back       %7.2f GB/s  (%.2fx raw write)  device -> pinned -> NVMe\n",
               j["writeback_gbps"].get<double>(), j["writeback_vs_raw_write"].get<double>());
  std::fprintf(out, "  raw NVMe read    %7.2f GB/s\n", j["raw_read_gbps"].get<double>());
  std::fprintf(out, "  fetch to device  %7.2f GB/s  (%.2fx raw read)   NVMe -> pinned -> device\n",
               j["fetch_gbps"].get<double>(), j["fetch_vs_raw_read"].get<double>());
  std::fprintf(out, "  pinned -> device %7.2f GB/s  device -> pinned %.2f GB/s  (device copies)\n",
               j["copy_to_device"]["gbps"].get<double>(),
               j["copy_from_device"]["gbps"].get<double>());
  const auto& t = j["telemetry"];
  std::fprintf(out, "  peak device %s, peak pinned %s, time waiting for fetches %.3f s\n",
               FormatBytes(t["device_peak_bytes"].get<uint64_t>()).c_str(),
               FormatBytes(t["pinned_peak_bytes"].get<uint64_t>()).c_str(),
               t["wait_seconds"].get<double>());
  if (j["swap_checksums"].get<bool>()) {
    std::fprintf(out, "  swap checksums: %s hashed in %.3f s\n",
                 FormatBytes(t["checksum_bytes"].get<uint64_t>()).c_str(),
                 t["checksum_seconds"].get<double>());
  }
  if (j.contains("validated")) std::fprintf(out, "  validated: ok\n");
}

class BenchTiersCommand final : public Command {
 public:
  BenchTiersCommand()
      : Command(
            "tiers",
            "Stream blocks NVMe -> pinned -> device and back through the tier manager, against raw "
            "NVMe bandwidth for the same bytes") {}
  void AddFlags(CLI::App& cmd) override {
    cmd.add_option("--size", flags_.size, "Total bytes streamed (K/M/G; default 2G)")
        ->check(runtime::flags::ByteSize(1, runtime::flags::kMaxBytes));
    cmd.add_option("--block", flags_.block, "Bytes per tier block (default 64M)")
        ->check(runtime::flags::ByteSize(1, runtime::flags::kMaxBytes));
    cmd.add_option("--prefetch", flags_.prefetch, "Blocks fetched ahead of use (default 2)")
        ->check(CLI::Range(0, 1024));
    AddIoCliFlags(cmd, &flags_.io, /*sweep=*/false);
    cmd.add_option("--device", flags_.device,
                   "Device: auto (a GPU where there is one, else host), host, cuda[:N]");
    cmd.add_flag("--validate", flags_.validate, "Check the bytes that arrive on the device");
    cmd.add_flag("--no-swap-checksums", flags_.no_swap_checksums,
                 "Do not checksum blocks written to NVMe nor verify them on reads "
                 "(strata.swap_checksums false)");
  }
  Status Run(runtime::CommandContext& /*ctx*/, nlohmann::json& j) override {
    return RunBenchTiers(flags_, &j);
  }
  void PrintText(const nlohmann::json& j, std::FILE* out) const override { PrintHuman(j, out); }

 private:
  TiersFlags flags_;
};

}  // namespace

std::unique_ptr<Command> NewBenchTiersCommand() { return std::make_unique<BenchTiersCommand>(); }

}  // namespace strata::bench
