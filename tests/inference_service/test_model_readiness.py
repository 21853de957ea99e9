"""Per-model readiness: the health service says SERVING for '<InferenceService>/<model_id>' only while that model
is loaded, so a gRPC readiness probe (Kubernetes) can gate traffic per model."""
import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from diffusion.v1 import inference_pb2 as pb
from inference_service.readiness import model_health_name
from service_kit.service_process import start_service
from tests.inference_service.harness import InferenceClient


def test_a_model_is_ready_only_while_it_is_loaded(tiny_models):
    proc = start_service("inference_service", *InferenceClient.TEST_FLAGS, timeout=180)
    client = InferenceClient(proc.address)
    health = health_pb2_grpc.HealthStub(client.channel)

    def status():
        return health.Check(health_pb2.HealthCheckRequest(service=model_health_name("tiny-z")), timeout=10).status

    try:
        with pytest.raises(grpc.RpcError) as e:
            status()
        assert e.value.code() == grpc.StatusCode.NOT_FOUND  # never loaded: the probe fails
        client.load("tiny-z", tiny_models["zimage"])
        assert status() == health_pb2.HealthCheckResponse.SERVING
        client.stub.Unload(pb.UnloadRequest(model_id="tiny-z"), timeout=60)
        assert status() == health_pb2.HealthCheckResponse.NOT_SERVING
    finally:
        client.close()
        proc.stop()
