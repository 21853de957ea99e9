"""The one place where domain errors become gRPC statuses, so servicers need no try/except."""
from __future__ import annotations

import logging
from typing import Any, Awaitable, Callable

import grpc
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from service_kit.errors import ERROR_DOMAIN, ServiceError

log = logging.getLogger(__name__)


def to_rich_status(err: ServiceError) -> grpc.Status:
    """The canonical code, the message, and an ErrorInfo(reason, domain, metadata) detail."""
    info = error_details_pb2.ErrorInfo(reason=err.reason, domain=ERROR_DOMAIN, metadata=err.metadata)
    detail = any_pb2.Any()
    detail.Pack(info)
    status = status_pb2.Status(code=getattr(code_pb2, err.code.name), message=err.message, details=[detail])
    return rpc_status.to_status(status)


async def _abort(context: grpc.aio.ServicerContext, err: ServiceError) -> None:
    status = to_rich_status(err)
    await context.abort(status.code, status.details, status.trailing_metadata)


def _wrap_unary(behavior: Callable[..., Awaitable[Any]]):
    async def wrapped(request, context):
        try:
            return await behavior(request, context)
        except ServiceError as err:
            await _abort(context, err)

    return wrapped


def _wrap_stream(behavior: Callable[..., Any]):
    async def wrapped(request, context):
        try:
            async for item in behavior(request, context):
                yield item
        except ServiceError as err:
            await _abort(context, err)

    return wrapped


class ErrorInterceptor(grpc.aio.ServerInterceptor):
    """Maps ServiceError raised by unary-unary and unary-stream handlers to rich statuses."""

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                _wrap_unary(handler.unary_unary),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                _wrap_stream(handler.unary_stream),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        return handler


def error_info(err: grpc.RpcError) -> error_details_pb2.ErrorInfo | None:
    """The ErrorInfo detail of a failed call, for clients and tests."""
    status = rpc_status.from_call(err)
    if status is None:
        return None
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            return info
    return None
