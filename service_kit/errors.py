"""Domain errors raised by engines, which know nothing of gRPC.

One interceptor per server (service_kit.error_interceptor) maps them to the
canonical status code plus a google.rpc.ErrorInfo, chosen by what the caller
should do next (AIP-193).
"""
from __future__ import annotations

from typing import Mapping

import grpc

ERROR_DOMAIN = "diffusion.v1"


class ServiceError(Exception):
    """An error with a canonical code, an UPPER_SNAKE reason and actionable text."""

    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN
    default_reason = "UNKNOWN"

    def __init__(self, message: str, *, reason: str | None = None, metadata: Mapping[str, str] | None = None):
        super().__init__(message)
        self.message = message
        self.reason = reason or self.default_reason
        self.metadata = dict(metadata or {})


class InvalidArgument(ServiceError):
    code = grpc.StatusCode.INVALID_ARGUMENT
    default_reason = "INVALID_ARGUMENT"


class NotFound(ServiceError):
    code = grpc.StatusCode.NOT_FOUND
    default_reason = "NOT_FOUND"


class FailedPrecondition(ServiceError):
    code = grpc.StatusCode.FAILED_PRECONDITION
    default_reason = "FAILED_PRECONDITION"


class ResourceExhausted(ServiceError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED
    default_reason = "RESOURCE_EXHAUSTED"


class Aborted(ServiceError):
    code = grpc.StatusCode.ABORTED
    default_reason = "ABORTED"


class Unavailable(ServiceError):
    code = grpc.StatusCode.UNAVAILABLE
    default_reason = "UNAVAILABLE"


class Cancelled(ServiceError):
    code = grpc.StatusCode.CANCELLED
    default_reason = "CANCELLED"


class DeadlineExceeded(ServiceError):
    code = grpc.StatusCode.DEADLINE_EXCEEDED
    default_reason = "DEADLINE_EXCEEDED"


class Internal(ServiceError):
    """A bug or an unexpected library failure: the message carries the exception, the log the traceback."""

    code = grpc.StatusCode.INTERNAL
    default_reason = "INTERNAL"


class Unimplemented(ServiceError):
    """The request is valid but this capability has not been built yet; the message says what is missing."""

    code = grpc.StatusCode.UNIMPLEMENTED
    default_reason = "UNIMPLEMENTED"
