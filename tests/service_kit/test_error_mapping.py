"""Domain errors map to canonical codes with an ErrorInfo detail."""
import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from service_kit import errors
from service_kit.error_interceptor import to_rich_status


@pytest.mark.parametrize("cls, code", [
    (errors.InvalidArgument, grpc.StatusCode.INVALID_ARGUMENT),
    (errors.NotFound, grpc.StatusCode.NOT_FOUND),
    (errors.FailedPrecondition, grpc.StatusCode.FAILED_PRECONDITION),
    (errors.ResourceExhausted, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (errors.Aborted, grpc.StatusCode.ABORTED),
    (errors.Unavailable, grpc.StatusCode.UNAVAILABLE),
    (errors.Cancelled, grpc.StatusCode.CANCELLED),
    (errors.DeadlineExceeded, grpc.StatusCode.DEADLINE_EXCEEDED),
])
def test_rich_status(cls, code):
    status = to_rich_status(cls("what to fix", reason="SOME_REASON", metadata={"k": "v"}))
    assert status.code == code and status.details == "what to fix"
    (key, blob), = [(k, v) for k, v in status.trailing_metadata if k == rpc_status.GRPC_DETAILS_METADATA_KEY]
    from google.rpc import status_pb2
    decoded = status_pb2.Status.FromString(blob)
    info = error_details_pb2.ErrorInfo()
    decoded.details[0].Unpack(info)
    assert (info.reason, info.domain, dict(info.metadata)) == ("SOME_REASON", "diffusion.v1", {"k": "v"})
