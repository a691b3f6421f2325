// ScopedEnv: sets (or unsets) an environment variable for one scope and restores it afterwards,
// so a test that forces e.g. STRATA_IO_BACKEND cannot leak the setting into the next test.
//
// Thread-safety: none. setenv(3) is not thread-safe; use it only while the test runs no threads.
#pragma once

#include <cstdlib>
#include <string>

namespace strata::testing {

class ScopedEnv {
 public:
  // Sets `name` to `value`, or unsets it when `value` is null.
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* old = std::getenv(name);
    had_ = old != nullptr;
    if (had_) old_ = old;
    Set(value);
  }
  ~ScopedEnv() { Set(had_ ? old_.c_str() : nullptr); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  void Set(const char* value) {
    if (value != nullptr) {
      ::setenv(name_.c_str(), value, 1);
    } else {
      ::unsetenv(name_.c_str());
    }
  }

  std::string name_;
  bool had_ = false;
  std::string old_;
};

}  // namespace strata::testing
