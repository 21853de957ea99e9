"""The one wrapper on every method handler: who calls, does the request parse and keep its limits,
and which status an error becomes. Servicers therefore need no try/except and never see a bad request.

In order, for every call:
1. authentication (when a token book is configured; health and reflection stay open);
2. parsing: bytes that are not the method's request message answer INVALID_ARGUMENT, not UNKNOWN;
3. the service's request limits (service_kit.request_limits), INVALID_ARGUMENT with google.rpc.BadRequest;
4. the handler, with the caller in service_kit.auth.current_caller();
5. a ServiceError becomes its canonical code with ErrorInfo (and BadRequest); anything else is a bug,
   logged with its traceback and answered INTERNAL, never UNKNOWN;
6. the call's final code and duration are counted (service_kit.metrics).
"""
from __future__ import annotations

import asyncio
import inspect
import logging
import time
import uuid
from typing import Any, Callable, Mapping

import grpc
from google.protobuf import any_pb2
from google.protobuf.message import DecodeError
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from service_kit.auth import ANONYMOUS, OPEN_SERVICES, Caller, TokenBook, set_caller
from service_kit.errors import ERROR_DOMAIN, InvalidArgument, Relayed, ServiceError
from service_kit.metrics import observe_call
from service_kit.request_limits import Rules, enforce

log = logging.getLogger(__name__)

# What one status may carry: it travels in metadata, whose default limit is 8 KiB.
MAX_MESSAGE_CHARS = 1000
MAX_METADATA_CHARS = 200
MAX_VIOLATIONS = 20


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 15] + f"... [{len(text)} chars]"


def to_rich_status(err: ServiceError) -> grpc.Status:
    """The canonical code, the message, an ErrorInfo(reason, domain, metadata) and, for bad fields, a BadRequest."""
    metadata = {_cut(k, 64): _cut(str(v), MAX_METADATA_CHARS) for k, v in list(err.metadata.items())[:16]}
    info = error_details_pb2.ErrorInfo(reason=err.reason, domain=ERROR_DOMAIN, metadata=metadata)
    details = [any_pb2.Any()]
    details[0].Pack(info)
    if err.violations:
        bad = error_details_pb2.BadRequest(field_violations=[
            error_details_pb2.BadRequest.FieldViolation(field=_cut(v.field, 200), description=_cut(v.description, 200))
            for v in err.violations[:MAX_VIOLATIONS]])
        details.append(any_pb2.Any())
        details[1].Pack(bad)
    message = _cut(err.message, MAX_MESSAGE_CHARS)
    status = status_pb2.Status(code=getattr(code_pb2, err.code.name), message=message, details=details)
    return rpc_status.to_status(status)


async def _abort(context: grpc.aio.ServicerContext, err: ServiceError) -> None:
    status = to_rich_status(err)
    await context.abort(status.code, status.details, status.trailing_metadata)


def _internal(err: Exception, method: str) -> ServiceError:
    from service_kit.errors import Internal

    ref = uuid.uuid4().hex[:8]
    log.error("unhandled error in %s (ref %s)", method, ref, exc_info=err)
    return Internal(f"{method} failed unexpectedly ({type(err).__name__}); the service log has the details "
                    f"under ref {ref}", reason="INTERNAL", metadata={"ref": ref})


class _Edge:
    """Parses, checks and runs one method's calls for one caller (or one authentication failure)."""

    def __init__(self, method: str, parse: Callable[[bytes], Any] | None, rules: Mapping[str, Rules],
                 caller: Caller | None, refusal: ServiceError | None):
        self.method, self.parse, self.rules = method, parse, rules
        self.caller, self.refusal = caller, refusal
        self.code = "INTERNAL"  # the failed call's code, once known

    def admit(self, raw):
        """The parsed, checked request; raises the ServiceError that answers the call instead."""
        if self.refusal is not None:
            raise self.refusal
        set_caller(self.caller)
        if self.parse is None:
            return raw
        try:
            request = self.parse(raw)
        except (DecodeError, ValueError, TypeError) as e:
            name = self.method.rsplit("/", 1)[-1]
            raise InvalidArgument(f"the request does not parse as the request message of {name}: {type(e).__name__}",
                                  reason="UNPARSEABLE_REQUEST") from None
        enforce(request, self.rules)
        return request

    async def fail(self, context, err: Exception) -> None:
        """Answers the call for `err`: its own code for a ServiceError, INTERNAL for a bug (never UNKNOWN)."""
        if isinstance(err, grpc.aio.BaseError):  # context.abort() ending the call: not an error of ours
            code = context.code() if callable(getattr(context, "code", None)) else None
            self.code = code.name if isinstance(code, grpc.StatusCode) else "ABORTED"
            raise err
        error = err if isinstance(err, ServiceError) else _internal(err, self.method)
        self.code = error.code.name
        if isinstance(error, Relayed):
            await context.abort(error.code, error.message, error.trailing_metadata)
        await _abort(context, error)

    def _count(self, started: float, code: str | None) -> None:
        observe_call(self.method, code or self.code, started)

    def unary(self, behavior):
        async def wrapped(raw, context):
            started, code = time.monotonic(), None
            try:
                result = await behavior(self.admit(raw), context)
                code = "OK"
                return result
            except asyncio.CancelledError:
                code = "CANCELLED"
                raise
            except Exception as err:  # noqa: BLE001 - the last net: a bug answers INTERNAL, not UNKNOWN
                await self.fail(context, err)
            finally:
                self._count(started, code)

        return wrapped

    def server_stream(self, behavior):
        if inspect.isasyncgenfunction(behavior):
            async def wrapped_gen(raw, context):
                started, code = time.monotonic(), None
                try:
                    async for item in behavior(self.admit(raw), context):
                        yield item
                    code = "OK"
                except (asyncio.CancelledError, GeneratorExit):
                    code = "CANCELLED"  # the caller went away or its deadline passed
                    raise
                except Exception as err:  # noqa: BLE001
                    await self.fail(context, err)
                finally:
                    self._count(started, code)

            return wrapped_gen
        # A handler that writes with context.write() (the health service's Watch) stays a coroutine.
        return self.unary(behavior)

    def client_stream(self, behavior):
        """Streamed requests (reflection): each message parsed as it arrives."""
        edge = self

        async def requests(iterator):
            async for raw in iterator:
                yield edge.admit(raw)

        def run(request_iterator, context):
            if self.refusal is not None:
                raise self.refusal
            set_caller(self.caller)
            return behavior(requests(request_iterator), context)

        if inspect.isasyncgenfunction(behavior):
            async def wrapped_gen(request_iterator, context):
                try:
                    async for item in run(request_iterator, context):
                        yield item
                except Exception as err:  # noqa: BLE001
                    await self.fail(context, err)

            return wrapped_gen

        async def wrapped(request_iterator, context):
            try:
                return await run(request_iterator, context)
            except Exception as err:  # noqa: BLE001
                await self.fail(context, err)

        return wrapped


class ErrorInterceptor(grpc.aio.ServerInterceptor):
    """Puts the edge (authentication, parsing, limits, error mapping) around every method handler."""

    def __init__(self, rules: Mapping[str, Rules] | None = None, tokens: TokenBook | None = None):
        self.rules = rules or {}
        self.tokens = tokens

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method
        caller, refusal = ANONYMOUS, None
        if self.tokens is not None and not method.startswith(OPEN_SERVICES):
            try:
                caller = self.tokens.authenticate(handler_call_details.invocation_metadata)
            except ServiceError as err:
                caller, refusal = None, err
        edge = _Edge(method, handler.request_deserializer, self.rules, caller, refusal)
        common = dict(request_deserializer=None, response_serializer=handler.response_serializer)
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(edge.unary(handler.unary_unary), **common)
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(edge.server_stream(handler.unary_stream), **common)
        if handler.stream_unary is not None:
            return grpc.stream_unary_rpc_method_handler(edge.client_stream(handler.stream_unary), **common)
        return grpc.stream_stream_rpc_method_handler(edge.client_stream(handler.stream_stream), **common)


def error_info(err: grpc.RpcError) -> error_details_pb2.ErrorInfo | None:
    """The ErrorInfo detail of a failed call, for clients and tests."""
    return _detail(err, error_details_pb2.ErrorInfo)


def bad_request(err: grpc.RpcError) -> error_details_pb2.BadRequest | None:
    """The BadRequest detail of a failed call: the fields at fault."""
    return _detail(err, error_details_pb2.BadRequest)


def _detail(err: grpc.RpcError, cls):
    status = rpc_status.from_call(err)
    if status is None:
        return None
    for detail in status.details:
        if detail.Is(cls.DESCRIPTOR):
            out = cls()
            detail.Unpack(out)
            return out
    return None
