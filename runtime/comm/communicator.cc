#include "runtime/comm/communicator.h"

#include <cstdint>
#include <cstring>
#include <vector>

namespace strata::runtime {
namespace {

class SingleRankCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  std::string backend() const override { return "single"; }
  Status AllReduceSum(double*, size_t) override { return Status::Ok(); }
  Status AllReduceSumFloat(float*, size_t) override { return Status::Ok(); }
  Status AllGather(const void* send, void* recv, size_t bytes) override {
    if (send != recv && bytes > 0) std::memmove(recv, send, bytes);
    return Status::Ok();
  }
  Status ReduceScatterSum(const float* send, float* recv, size_t count) override {
    if (send != recv && count > 0) std::memmove(recv, send, count * sizeof(float));
    return Status::Ok();
  }
  Status Broadcast(void*, size_t, int) override { return Status::Ok(); }
  Status Barrier() override { return Status::Ok(); }
};

}  // namespace

std::unique_ptr<Communicator> MakeSingleRankCommunicator() {
  return std::make_unique<SingleRankCommunicator>();
}

Status BroadcastString(Communicator& comm, std::string& value, int root) {
  constexpr uint64_t kMax = uint64_t{1} << 30;
  constexpr uint64_t kTooLarge = ~uint64_t{0};
  // The size always goes out, so every rank learns of a refusal at the same call.
  uint64_t size = value.size() > kMax ? kTooLarge : value.size();
  STRATA_RETURN_IF_ERROR(comm.Broadcast(&size, sizeof(size), root));
  if (size == kTooLarge) {
    return InvalidArgumentError("BroadcastString from rank " + std::to_string(root) +
                                ": more than " + std::to_string(kMax) + " bytes");
  }
  std::vector<char> buffer(size);
  if (comm.rank() == root && size > 0) std::memcpy(buffer.data(), value.data(), size);
  if (size > 0) STRATA_RETURN_IF_ERROR(comm.Broadcast(buffer.data(), size, root));
  value.assign(buffer.begin(), buffer.end());
  return Status::Ok();
}

}  // namespace strata::runtime
