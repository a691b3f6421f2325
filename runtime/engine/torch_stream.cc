#include "runtime/engine/torch_stream.h"

#include <c10/core/Stream.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <string>
#include <utility>

namespace strata::runtime {

Result<TorchStreamGuard> TorchStreamGuard::Install(torch::Device device, void* handle) {
  try {
    c10::impl::VirtualGuardImpl impl(device.type());
    impl.setDevice(device);
    const auto id = static_cast<c10::StreamId>(reinterpret_cast<intptr_t>(handle));
    const c10::Stream previous = impl.exchangeStream(c10::Stream(c10::Stream::UNSAFE, device, id));
    if (impl.getStream(device).id() != id) {
      impl.exchangeStream(previous);
      return FailedPreconditionError("libtorch did not take strata's compute stream on " +
                                     device.str());
    }
    return TorchStreamGuard(device, static_cast<int64_t>(previous.id()));
  } catch (const std::exception& e) {
    return FailedPreconditionError("libtorch cannot compute on " + device.str() + ": " +
                                   std::string(e.what()).substr(0, 300));
  }
}

TorchStreamGuard::TorchStreamGuard(TorchStreamGuard&& other) noexcept
    : device_(other.device_), previous_(other.previous_), active_(other.active_) {
  other.active_ = false;
}

TorchStreamGuard& TorchStreamGuard::operator=(TorchStreamGuard&& other) noexcept {
  if (this != &other) {
    Restore();
    device_ = other.device_;
    previous_ = other.previous_;
    active_ = other.active_;
    other.active_ = false;
  }
  return *this;
}

TorchStreamGuard::~TorchStreamGuard() { Restore(); }

void TorchStreamGuard::Restore() {
  if (!active_) return;
  active_ = false;
  try {
    c10::impl::VirtualGuardImpl impl(device_.type());
    impl.exchangeStream(
        c10::Stream(c10::Stream::UNSAFE, device_, static_cast<c10::StreamId>(previous_)));
  } catch (const std::exception&) {  // nothing to restore where it never took one
  }
}

}  // namespace strata::runtime
