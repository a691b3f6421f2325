#include "tiers/device.h"

#include <utility>

namespace strata {

DeviceMemory::DeviceMemory(DeviceMemory&& other) noexcept
    : owner_(std::exchange(other.owner_, nullptr)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

DeviceMemory& DeviceMemory::operator=(DeviceMemory&& other) noexcept {
  if (this != &other) {
    Reset();
    owner_ = std::exchange(other.owner_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void DeviceMemory::Reset() {
  if (data_ != nullptr) owner_->FreeRaw(data_, size_);
  owner_ = nullptr;
  data_ = nullptr;
  size_ = 0;
}

Result<DeviceMemory> DeviceBackend::Allocate(uint64_t bytes) {
  if (bytes == 0) return InvalidArgumentError("device allocation of 0 bytes");
  STRATA_ASSIGN_OR_RETURN(void* p, AllocateRaw(bytes));
  return DeviceMemory(this, p, bytes);
}

}  // namespace strata
