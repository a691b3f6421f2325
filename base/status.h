// Status and Result<T>: the error model of the whole engine.
//
// Nothing inside strata throws: I/O completions and copy callbacks run on backend threads, where an
// exception would have nowhere to go. Every fallible function returns a Status (or a Result<T>,
// which is a T or a non-OK Status), and both are [[nodiscard]] so an ignored error is a compile
// warning. An OK Status holds no allocation; an error holds a code, an optional errno and a message
// that names what failed and where (file, offset, key path...).
//
// Thread-safety: Status and Result are values; distinct objects may be used from any thread.
#pragma once

#include <cassert>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace strata {

enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument,     // the caller passed something wrong (config value, flag, size)
  kNotFound,            // a named thing does not exist (file, id, key)
  kAlreadyExists,       // a named thing exists and must not
  kResourceExhausted,   // a budget or a disk is full
  kUnavailable,         // a backend or feature is not present on this machine
  kIoError,             // a system call failed; errno() says which error
  kFailedPrecondition,  // the object is not in a state that allows the call
  kOutOfRange,          // an offset or index past the end
  kCancelled,           // the operation was abandoned before it finished
  kCudaError,           // a CUDA runtime error
  kDataLoss,            // stored data is corrupt or truncated
  kInternal,            // a bug in strata
};

// Returns a stable lower-case name for `code`, e.g. "io_error".
std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message, int sys_errno = 0);

  Status(const Status& other);
  Status& operator=(const Status& other);
  Status(Status&&) noexcept = default;
  Status& operator=(Status&&) noexcept = default;

  static Status Ok() { return Status(); }

  bool ok() const { return rep_ == nullptr; }
  StatusCode code() const { return rep_ ? rep_->code : StatusCode::kOk; }
  // The errno behind an kIoError (0 if none).
  int sys_errno() const { return rep_ ? rep_->sys_errno : 0; }
  std::string_view message() const { return rep_ ? std::string_view(rep_->message) : ""; }
  // True for errors a caller may retry as they are (EAGAIN, EINTR, EBUSY).
  bool retryable() const;

  // "io_error: write /nvme/x offset 4096: No space left on device (errno 28)"
  std::string ToString() const;

  // Returns this status with "context: " prepended to its message (OK stays OK).
  Status WithContext(std::string_view context) const&;
  Status WithContext(std::string_view context) &&;

  // Explicitly discards an error the caller has decided not to handle.
  void IgnoreError() const {}

 private:
  struct Rep {
    StatusCode code;
    int sys_errno;
    std::string message;
  };
  std::unique_ptr<Rep> rep_;
};

bool operator==(const Status& a, const Status& b);

// Constructors for each code. IoErrorFromErrno appends strerror(err) and the errno number.
Status InvalidArgumentError(std::string message);
Status NotFoundError(std::string message);
Status AlreadyExistsError(std::string message);
Status ResourceExhaustedError(std::string message);
Status UnavailableError(std::string message);
Status IoErrorFromErrno(int err, std::string message);
Status FailedPreconditionError(std::string message);
Status OutOfRangeError(std::string message);
Status CancelledError(std::string message);
Status DataLossError(std::string message);
Status InternalError(std::string message);

// A T or an error. Construct from a T (success) or from a non-OK Status (failure).
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}                       // NOLINT: implicit by design
  Result(Status status) : status_(EnsureError(std::move(status))) {}  // NOLINT: implicit

  bool ok() const { return value_.has_value(); }
  const Status& status() const { return status_; }

  // REQUIRES: ok().
  T& value() & {
    assert(ok());
    return *value_;
  }
  const T& value() const& {
    assert(ok());
    return *value_;
  }
  T&& value() && {
    assert(ok());
    return std::move(*value_);
  }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  static Status EnsureError(Status s) {
    assert(!s.ok() && "Result constructed from an OK Status without a value");
    return s.ok() ? InternalError("Result constructed from an OK Status") : std::move(s);
  }
  std::optional<T> value_;
  Status status_;
};

}  // namespace strata

#define STRATA_INTERNAL_CONCAT2(a, b) a##b
#define STRATA_INTERNAL_CONCAT(a, b) STRATA_INTERNAL_CONCAT2(a, b)

// Returns the Status of `expr` from the enclosing function if it is not OK.
#define STRATA_RETURN_IF_ERROR(expr)                 \
  do {                                               \
    ::strata::Status strata_status_ = (expr);        \
    if (!strata_status_.ok()) return strata_status_; \
  } while (0)

// `lhs = value of expr` or returns its Status. `lhs` may declare a variable: `auto x`.
#define STRATA_ASSIGN_OR_RETURN(lhs, expr) \
  STRATA_INTERNAL_ASSIGN_OR_RETURN(STRATA_INTERNAL_CONCAT(strata_result_, __LINE__), lhs, expr)
#define STRATA_INTERNAL_ASSIGN_OR_RETURN(tmp, lhs, expr) \
  auto tmp = (expr);                                     \
  if (!tmp.ok()) return tmp.status();                    \
  lhs = std::move(tmp).value()
