"""Both services start as `python -m` does (a fresh interpreter) and answer health, reflection and a first
real call."""
import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from diffusion.v1 import inference_pb2, inference_pb2_grpc, training_pb2, training_pb2_grpc
from service_kit.service_process import start_service


@pytest.mark.parametrize("module, service, call, implemented", [
    ("inference_service", "diffusion.v1.InferenceService",
     lambda ch: inference_pb2_grpc.InferenceServiceStub(ch).GetCapabilities(inference_pb2.GetCapabilitiesRequest()), True),
    ("training_service", "diffusion.v1.TrainingService",
     lambda ch: training_pb2_grpc.TrainingServiceStub(ch).GetTrainingInfo(training_pb2.GetTrainingInfoRequest()), True),
])
def test_service_starts_with_health_and_reflection(module, service, call, implemented):
    proc = start_service(module, timeout=180, fresh=True)
    assert proc.how == "a fresh interpreter"
    try:
        with grpc.insecure_channel(proc.address) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            assert health.Check(health_pb2.HealthCheckRequest(service=service)).status == \
                health_pb2.HealthCheckResponse.SERVING
            refl = reflection_pb2_grpc.ServerReflectionStub(channel)
            listed = next(refl.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")])))
            assert service in {s.name for s in listed.list_services_response.service}
            if implemented:
                assert call(channel).ByteSize() > 0
            else:
                with pytest.raises(grpc.RpcError) as e:
                    call(channel)
                assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED
    finally:
        assert proc.stop() == 0


@pytest.mark.parametrize("module, args", [
    ("gpu_broker", ("--fake-devices", "1x24GiB")),
    ("inference_service", ()),
    ("training_service", ()),
    ("inference_router", ("--worker", "127.0.0.1:1")),
])
def test_sigterm_right_after_the_listening_line_stops_gracefully(module, args):
    """The stop signals are handled from before the service listens: an orchestrator that stops a service the
    moment it is ready gets a drained exit (0), not a death by the signal."""
    proc = start_service(module, *args, timeout=180)
    assert proc.stop() == 0, proc.stderr_lines[-5:]
