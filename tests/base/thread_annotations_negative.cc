// Must NOT compile under scripts/check-threads.sh's flags (-Wthread-safety -Werror=thread-safety):
// it reads and writes a GUARDED_BY field without its mutex. The script checks that clang rejects it
// with "requires holding mutex", so a build where the annotations expand to nothing, or where the
// warning is off, fails the check instead of passing it silently. Not part of any target.
#include "base/mutex.h"

namespace strata {

class Counter {
 public:
  void Add() EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    ++n_;  // fine: mu_ held
  }
  int Unguarded() { return ++n_; }  // the finding: mu_ not held

 private:
  Mutex mu_;
  int n_ GUARDED_BY(mu_) = 0;
};

}  // namespace strata

int main() {
  strata::Counter c;
  c.Add();
  return c.Unguarded();
}
