"""strata's errors as Python exceptions: one table from the engine's Status codes to exception types.

Every failure of the engine reaches Python as a ``StrataError`` subclass carrying ``code`` (the
Status code's stable name, e.g. ``"io_error"``), the engine's message and, for failed system calls,
``errno``. Each type also derives from the built-in exception a Python user would catch for it
(``ValueError`` for a bad config, ``OSError`` for an I/O error, ...).
"""


class StrataError(RuntimeError):
    """A failure reported by strata's engine."""

    code = "internal"

    def __init__(self, message, code=None, errno=0):
        super().__init__(message)
        if code is not None:
            self.code = code
        self.message = message
        self.errno = errno
        if isinstance(self, OSError):
            self.strerror = message

    def __str__(self):
        return f"[{self.code}] {self.message}"


class InvalidArgumentError(StrataError, ValueError):
    code = "invalid_argument"


class NotFoundError(StrataError, FileNotFoundError):
    code = "not_found"


class AlreadyExistsError(StrataError, FileExistsError):
    code = "already_exists"


class ResourceExhaustedError(StrataError, MemoryError):
    code = "resource_exhausted"


class UnavailableError(StrataError):
    code = "unavailable"


class IoError(StrataError, OSError):
    code = "io_error"


class FailedPreconditionError(StrataError):
    code = "failed_precondition"


class OutOfRangeError(StrataError, IndexError):
    code = "out_of_range"


class CancelledError(StrataError):
    code = "cancelled"


class CudaError(StrataError):
    code = "cuda_error"


class DataLossError(StrataError):
    code = "data_loss"


class InternalError(StrataError):
    code = "internal"


# The one map (base/status.h's StatusCodeName -> type).
EXCEPTION_FOR_CODE = {
    cls.code: cls
    for cls in (
        InvalidArgumentError,
        NotFoundError,
        AlreadyExistsError,
        ResourceExhaustedError,
        UnavailableError,
        IoError,
        FailedPreconditionError,
        OutOfRangeError,
        CancelledError,
        CudaError,
        DataLossError,
        InternalError,
    )
}


def _from_status(code, message, errno=0):
    """Called by strata._C for a failing Status: the exception to raise."""
    cls = EXCEPTION_FOR_CODE.get(code, StrataError)
    return cls(message, code, errno)
