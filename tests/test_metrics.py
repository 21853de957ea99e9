"""Each service's Prometheus endpoint (--metrics-listen) during real work: calls by method and code, phase
latencies, images, leases by device and holder, training jobs by state."""
import time
import urllib.request

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from diffusion.v1 import common_pb2 as c
from diffusion.v1 import inference_pb2 as pb
from diffusion.v1 import training_pb2 as tpb
from diffusion.v1 import training_pb2_grpc
from service_kit.server_runtime import CLIENT_OPTIONS
from service_kit.service_process import start_service
from tests.datasets import write_cards
from tests.inference_service.harness import InferenceClient, result_of
from tests.service_flags import TRAINING_ROOTS

METRICS = ("--metrics-listen", "127.0.0.1:0")


def scrape(proc) -> dict[tuple, float]:
    """{(sample name, sorted labels): value} from the service's /metrics."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{proc.metrics_port}/metrics", timeout=10).read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples, name: str, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    root = tmp_path_factory.mktemp("metrics")
    broker = start_service("gpu_broker", "--fake-devices", "2x24GiB", *METRICS)
    inference = start_service("inference_service", "--broker", broker.address, *InferenceClient.TEST_FLAGS,
                              "--adapter-store", str(root / "adapters"), *METRICS, timeout=180)
    training = start_service("training_service", "--broker", broker.address, *TRAINING_ROOTS, "--output-dir",
                             str(root / "out"), "--adapter-store", str(root / "adapters"), *METRICS, timeout=180)
    yield broker, inference, training, root
    for proc in (training, inference, broker):
        proc.stop()


def test_metrics_follow_loads_generations_errors_and_leases(stack, tiny_models):
    broker, inference, _, _ = stack
    assert all(p.metrics_port for p in stack[:3])
    client = InferenceClient(inference.address)
    try:
        client.load("z", tiny_models["zimage"])
        for _ in range(2):
            assert result_of(client.generate("z", seeds=[1, 2], steps=3)).images
        with pytest.raises(grpc.RpcError):
            client.generate("not-loaded")
        mine = scrape(inference)
        service = "diffusion.v1.InferenceService"
        assert value(mine, "diffusion_rpc_calls_total", service=service, method="Generate", code="OK") == 2
        assert value(mine, "diffusion_rpc_calls_total", service=service, method="Generate",
                     code="FAILED_PRECONDITION") == 1
        assert value(mine, "diffusion_rpc_calls_total", service=service, method="Load", code="OK") == 1
        assert value(mine, "diffusion_images_generated_total", model="z") == 4
        # the second generation repeated the first one's prompt: its encoding was reused
        assert value(mine, "diffusion_prompt_encodings_total", model="z", outcome="encoded") >= 1
        assert value(mine, "diffusion_prompt_encodings_total", model="z", outcome="reused") >= 1
        assert value(mine, "diffusion_denoise_steps_total", model="z") == 6
        assert value(mine, "diffusion_generation_phase_seconds_count", phase="denoise") == 2
        assert value(mine, "diffusion_denoise_steps_per_second", model="z") > 0
        assert value(mine, "diffusion_model_load_seconds_count", family="zimage") == 1
        assert value(mine, "diffusion_inference_model_loaded", model="z") == 1
        assert ("diffusion_inference_queue_depth", ()) in mine

        books = scrape(broker)
        leased = value(books, "diffusion_broker_leased_bytes", device="0", holder="inference-0")
        assert leased > 0 and value(mine, "diffusion_inference_leased_bytes", device="0") == leased
        assert value(books, "diffusion_broker_leases", device="0", holder="inference-0") == 1
        assert value(books, "diffusion_broker_device_bytes", device="1") == 24 * 2**30
        assert value(books, "diffusion_broker_transitions_total", kind="granted") >= 1

        client.stub.Unload(pb.UnloadRequest(model_id="z"), timeout=60)
        assert value(scrape(broker), "diffusion_broker_leases", device="0", holder="inference-0") == 0
        after = scrape(inference)
        assert value(after, "diffusion_inference_model_loaded", model="z") == 0
        assert value(after, "diffusion_inference_unloads_total", reason="unload") == 1
    finally:
        client.close()


def test_training_metrics_count_steps_and_jobs_by_state(stack, tiny_models):
    _, _, training, root = stack
    data = write_cards(root / "data")
    stub = training_pb2_grpc.TrainingServiceStub(grpc.insecure_channel(training.address, options=CLIENT_OPTIONS))
    job = stub.StartTraining(tpb.StartTrainingRequest(
        family=c.FAMILY_ZIMAGE, base=c.ModelSource(local_dir=str(tiny_models["zimage"])),
        dataset=tpb.Dataset(image_dir=str(data), instance_prompt="a square"), steps=5, rank=4, resolution=64),
        timeout=120).job
    finished = [e for e in stub.WatchTraining(tpb.WatchTrainingRequest(job_id=job.job_id), timeout=300)
                if e.WhichOneof("event") == "finished"]
    assert finished[0].finished.state == tpb.TRAINING_JOB_STATE_SUCCEEDED
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and value(scrape(training), "diffusion_training_jobs", state="SUCCEEDED") < 1:
        time.sleep(0.2)
    samples = scrape(training)
    assert value(samples, "diffusion_training_jobs", state="SUCCEEDED") == 1
    assert value(samples, "diffusion_training_steps_total", family="zimage") == 5
    assert value(samples, "diffusion_training_steps_per_second", family="zimage") > 0
    assert value(samples, "diffusion_rpc_calls_total", service="diffusion.v1.TrainingService", method="StartTraining",
                 code="OK") == 1
