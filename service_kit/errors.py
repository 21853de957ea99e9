"""Domain errors raised by engines, which know nothing of gRPC.

One interceptor per server (service_kit.error_interceptor) maps them to the
canonical status code plus a google.rpc.ErrorInfo, chosen by what the caller
should do next (AIP-193).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import grpc

ERROR_DOMAIN = "diffusion.v1"
# A caller's value quoted in an error is cut to this many characters: the status travels in
# metadata, and a long id must not turn INVALID_ARGUMENT into "metadata exceeds limit".
ECHO_CHARS = 80


def clip(value: object, limit: int = ECHO_CHARS) -> str:
    """repr() of a caller's value, cut to `limit` characters with the full length said."""
    text = repr(value)
    if len(text) <= limit:
        return text
    size = len(value) if isinstance(value, (str, bytes)) else len(text)
    return f"{text[:limit]}... ({size} characters)"


@dataclass(frozen=True)
class FieldViolation:
    """One bad field of a request, as google.rpc.BadRequest reports it: `field` is its path, e.g. holder.client_id."""

    field: str
    description: str
    reason: str = ""  # the ErrorInfo reason this violation answers with, when it is the first


class ServiceError(Exception):
    """An error with a canonical code, an UPPER_SNAKE reason and actionable text."""

    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN
    default_reason = "UNKNOWN"

    def __init__(self, message: str, *, reason: str | None = None, metadata: Mapping[str, str] | None = None,
                 violations: Sequence[FieldViolation] = (), field: str = ""):
        super().__init__(message)
        self.message = message
        self.reason = reason or self.default_reason
        self.metadata = dict(metadata or {})
        # INVALID_ARGUMENT names the fields at fault (google.rpc.BadRequest); `field` is the one-field shorthand.
        self.violations = tuple(violations) or ((FieldViolation(field, message),) if field else ())


class InvalidArgument(ServiceError):
    code = grpc.StatusCode.INVALID_ARGUMENT
    default_reason = "INVALID_ARGUMENT"


class Unauthenticated(ServiceError):
    """No credentials, or credentials this server does not know."""

    code = grpc.StatusCode.UNAUTHENTICATED
    default_reason = "UNAUTHENTICATED"


class PermissionDenied(ServiceError):
    """The caller is known but may not do this: a path outside the roots, another caller's resource, a priority above
    its ceiling."""

    code = grpc.StatusCode.PERMISSION_DENIED
    default_reason = "PERMISSION_DENIED"


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


class Relayed(ServiceError):
    """A status one of our services answered to a call another forwarded (the router to a worker): the caller gets
    its code, message and rich details (ErrorInfo, BadRequest) as the service that decided sent them."""

    STATUS_DETAILS_KEY = "grpc-status-details-bin"

    def __init__(self, error: grpc.aio.AioRpcError):
        code = error.code()
        super().__init__(error.details() or "", reason="RELAYED")
        # UNKNOWN never comes from our services; if a worker's answer ever is, say so as a bug would be said.
        self.code = grpc.StatusCode.INTERNAL if code is grpc.StatusCode.UNKNOWN else code
        self.trailing_metadata = () if code is grpc.StatusCode.UNKNOWN else tuple(
            (k, v) for k, v in (error.trailing_metadata() or ()) if k == self.STATUS_DETAILS_KEY)
