"""Keep-alive: an idle model is unloaded and its lease released after its TTL; reload on demand."""
import time

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration
from grpc_health.v1 import health_pb2, health_pb2_grpc

from diffusion.v1 import common_pb2 as c
from diffusion.v1 import inference_pb2 as pb
from diffusion_kit.resolved import Source
from inference_service.keep_alive import resolve_keep_alive
from inference_service.readiness import model_health_name
from service_kit.error_interceptor import error_info
from service_kit.service_process import start_service
from tests.inference_service.harness import InferenceClient, result_of


@pytest.mark.parametrize("requested, default, seconds, applied, source", [
    (None, -1, None, "forever", Source.DEFAULT),
    (None, 300, 300.0, "300s idle", Source.DEFAULT),
    (0.0, -1, 0.0, "unload after each generation", Source.EXPLICIT),
    (-5.0, 300, None, "forever", Source.EXPLICIT),
    (2.5, 300, 2.5, "2.5s idle", Source.EXPLICIT),
])
def test_keep_alive_policy(requested, default, seconds, applied, source):
    got, record = resolve_keep_alive(requested, default)
    assert (got, record.applied, record.source) == (seconds, applied, source)


def keep_alive(seconds: float) -> Duration:
    d = Duration()
    d.FromNanoseconds(int(seconds * 1e9))
    return d


def inference_leases(broker) -> list:
    return [x for x in broker.status().leases if x.holder.client_id == "inference-0"]


def wait_until(predicate, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def test_idle_model_unloads_after_its_ttl_and_releases_its_lease(start_broker, tiny_models):
    broker_proc, broker = start_broker()
    proc = start_service("inference_service", "--broker", broker_proc.address, "--keep-alive", "1",
                         *InferenceClient.TEST_FLAGS, timeout=180)
    client = InferenceClient(proc.address)
    health = health_pb2_grpc.HealthStub(client.channel)
    try:
        loaded = client.load("z", tiny_models["zimage"])[-1].result
        record = {r.control: r for r in loaded.resolved}["keep_alive"]
        assert (record.applied, record.source) == ("1s idle", c.SETTING_SOURCE_DEFAULT)
        for _ in range(3):  # each generation restarts the idle clock
            time.sleep(0.6)
            assert result_of(client.generate("z")).images and inference_leases(broker)
        assert wait_until(lambda: not inference_leases(broker), timeout=10)
        check = health.Check(health_pb2.HealthCheckRequest(service=model_health_name("z")), timeout=10)
        assert check.status == health_pb2.HealthCheckResponse.NOT_SERVING
        with pytest.raises(grpc.RpcError) as e:
            client.generate("z")
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert error_info(e.value).reason == "MODEL_UNLOADED_IDLE" and "keep_alive" in e.value.details()

        # a Load's own value wins over the service's: negative keeps it, 0 unloads after each generation
        client.load("z", tiny_models["zimage"], keep_alive=keep_alive(-1))
        time.sleep(2.0)
        assert inference_leases(broker) and result_of(client.generate("z")).images
        client.load("z", tiny_models["zimage"], keep_alive=keep_alive(0))
        time.sleep(1.5)
        assert inference_leases(broker)  # 0 waits for the first generation
        assert result_of(client.generate("z")).images
        assert wait_until(lambda: not inference_leases(broker), timeout=5)
    finally:
        client.close()
        proc.stop()


def test_reload_on_demand_brings_an_idle_model_back(start_broker, tiny_models):
    broker_proc, broker = start_broker()
    proc = start_service("inference_service", "--broker", broker_proc.address, "--reload-on-demand",
                         *InferenceClient.TEST_FLAGS, timeout=180)
    client = InferenceClient(proc.address)
    try:
        client.load("z", tiny_models["zimage"], keep_alive=keep_alive(0.5))
        first = result_of(client.generate("z", seeds=[3])).images[0].data
        assert wait_until(lambda: not inference_leases(broker), timeout=10)
        again = result_of(client.generate("z", seeds=[3])).images[0].data  # reloaded, lease taken again
        assert again == first
        assert [m.model_id for m in client.stub.ListModels(pb.ListModelsRequest(), timeout=10).models] == ["z"]
    finally:
        client.close()
        proc.stop()


def test_keep_alive_beyond_a_month_is_invalid_argument(inference_service, tiny_models):
    _, client = inference_service
    with pytest.raises(grpc.RpcError) as e:
        client.load("z", tiny_models["zimage"], keep_alive=keep_alive(31 * 24 * 3600))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "keep_alive" in e.value.details()
