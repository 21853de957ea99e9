"""What a failed call says: its gRPC code, the google.rpc.ErrorInfo reason, and the CLI's exit code for it."""
from __future__ import annotations

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

# The command line's exit status per gRPC code (0 is success; argparse's own usage errors are 2 as well).
EXIT_CODES: dict[grpc.StatusCode, int] = {
    grpc.StatusCode.INVALID_ARGUMENT: 2,
    grpc.StatusCode.OUT_OF_RANGE: 2,
    grpc.StatusCode.NOT_FOUND: 3,
    grpc.StatusCode.FAILED_PRECONDITION: 4,
    grpc.StatusCode.ALREADY_EXISTS: 4,
    grpc.StatusCode.ABORTED: 4,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 5,
    grpc.StatusCode.UNAUTHENTICATED: 6,
    grpc.StatusCode.PERMISSION_DENIED: 6,
    grpc.StatusCode.UNAVAILABLE: 7,
    grpc.StatusCode.DEADLINE_EXCEEDED: 8,
    grpc.StatusCode.CANCELLED: 9,
}
EXIT_OTHER = 1
EXIT_JOB_FAILED = 10  # a training job that ended FAILED or CANCELLED


class ClientError(Exception):
    """A call that ended in an error status, with the service's machine-readable reason."""

    def __init__(self, code: grpc.StatusCode, message: str, reason: str = "", metadata: dict | None = None):
        super().__init__(f"{code.name}{f' ({reason})' if reason else ''}: {message}")
        self.code, self.message, self.reason, self.metadata = code, message, reason, dict(metadata or {})

    @property
    def retryable(self) -> bool:
        return self.code == grpc.StatusCode.UNAVAILABLE

    @property
    def exit_code(self) -> int:
        return EXIT_CODES.get(self.code, EXIT_OTHER)

    @classmethod
    def from_rpc(cls, error: grpc.RpcError) -> "ClientError":
        code = error.code() if callable(getattr(error, "code", None)) else grpc.StatusCode.UNKNOWN
        reason, metadata = "", {}
        try:
            status = rpc_status.from_call(error)
        except (ValueError, AttributeError):  # a status without details, or not a call at all
            status = None
        for detail in status.details if status is not None else ():
            if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                info = error_details_pb2.ErrorInfo()
                detail.Unpack(info)
                reason, metadata = info.reason, dict(info.metadata)
        details = error.details() if callable(getattr(error, "details", None)) else str(error)
        return cls(code, details or "", reason, metadata)
