"""The inference service under a real broker: preflights before Acquire, preemption, re-acquire."""
import time

import grpc
import pytest

from diffusion.v1 import common_pb2 as c
from diffusion.v1 import inference_pb2 as pb
from service_kit.error_interceptor import error_info
from service_kit.service_process import start_service
from tests.inference_service.harness import BackgroundStream, InferenceClient, progress_steps, result_of


@pytest.fixture
def broker_and_inference(start_broker):
    started = []

    def start(*flags):
        broker_proc, broker = start_broker(fake_devices="1x24GiB")
        proc = start_service("inference_service", "--broker", broker_proc.address, "--client-id", "inference-0",
                             *InferenceClient.TEST_FLAGS, *flags, timeout=180)
        client = InferenceClient(proc.address)
        started.append((proc, client))
        return broker, client, proc

    yield start
    for proc, client in started:
        client.close()
        proc.stop()


def test_doomed_loads_never_disturb_the_holder(broker_and_inference, tiny_models, tmp_path):
    broker, client, _ = broker_and_inference()
    timeline = broker.timeline()
    trainer = broker.granted("trainer", priority=0, purpose="LoRA job")
    (tmp_path / "notes.txt").write_text("not a model")
    doomed = [
        (pb.LoadRequest(model_id="m", priority=9, source=c.ModelSource(local_dir=str(tmp_path / "missing"))),
         grpc.StatusCode.NOT_FOUND, "MODEL_NOT_FOUND"),
        (pb.LoadRequest(model_id="m", priority=9, source=c.ModelSource(local_dir=str(tmp_path))),
         grpc.StatusCode.INVALID_ARGUMENT, "NOT_A_PIPELINE"),
        (pb.LoadRequest(model_id="m", priority=9, source=c.ModelSource(local_dir=str(tiny_models["zimage"])),
                        transformer_precision=c.PRECISION_FP8), grpc.StatusCode.FAILED_PRECONDITION,
         "PRECISION_UNAVAILABLE"),
        (pb.LoadRequest(model_id="m", priority=9, source=c.ModelSource(local_dir=str(tiny_models["zimage"])),
                        transformer_precision=c.PRECISION_NF4), grpc.StatusCode.FAILED_PRECONDITION, "NF4_UNAVAILABLE"),
        (pb.LoadRequest(model_id="m", priority=9, source=c.ModelSource(local_dir=str(tiny_models["zimage"])),
                        memory_mode=c.MEMORY_MODE_LOW_VRAM), grpc.StatusCode.FAILED_PRECONDITION,
         "OFFLOAD_NEEDS_ACCELERATOR"),
        (pb.LoadRequest(model_id="m", priority=9, family=c.FAMILY_FLUX1,
                        source=c.ModelSource(local_dir=str(tiny_models["zimage"]))), grpc.StatusCode.INVALID_ARGUMENT,
         "FAMILY_MISMATCH"),
        (pb.LoadRequest(model_id="bad id!", source=c.ModelSource(local_dir=str(tiny_models["zimage"]))),
         grpc.StatusCode.INVALID_ARGUMENT, "BAD_MODEL_ID"),
    ]
    for req, code, reason in doomed:
        with pytest.raises(grpc.RpcError) as e:
            client.load_request(req)
        assert e.value.code() == code, e.value.details()
        assert error_info(e.value).reason == reason
    assert trainer.kinds_so_far(0.3) == []
    assert timeline.kinds() == ["SNAPSHOT", "GRANTED"]  # no preempt, no queue entry, nothing else
    assert [l.holder.client_id for l in broker.status().leases] == ["trainer"]

    # A sound load at higher priority does preempt, and is granted once the trainer lets go.
    loading = BackgroundStream(client.stub.Load(pb.LoadRequest(
        model_id="tiny-z", priority=5, source=c.ModelSource(local_dir=str(tiny_models["zimage"])))))
    trainer.wait_for("preempt_requested", timeout=30)
    broker.release(trainer)
    assert loading.done.wait(60) and loading.error is None, loading.error
    assert loading.events[-1].phase == pb.LOAD_PHASE_READY
    assert pb.LOAD_PHASE_WAITING_FOR_GPU in [e.phase for e in loading.events]
    leases = broker.status().leases
    assert [l.holder.client_id for l in leases] == ["inference-0"]
    assert client.status().lease_id == leases[0].lease_id


def test_preempt_cancels_unloads_and_releases(broker_and_inference, tiny_models):
    broker, client, _ = broker_and_inference()
    client.load("tiny-z", tiny_models["zimage"], priority=3)
    running = BackgroundStream(client.generate_stream("tiny-z", steps=200, seeds=[1], width=128, height=128))
    assert running.progress.wait(30)
    urgent = broker.acquire("urgent", priority=9)
    assert urgent.wait_for("granted", timeout=30).granted.holder.client_id == "urgent"
    assert running.done.wait(10)
    assert running.error.code() == grpc.StatusCode.UNAVAILABLE and "preempted by 'urgent'" in running.error.details()
    assert max(progress_steps(running.events)) < 200
    assert list(client.status().models) == [] and not client.status().lease_id
    with pytest.raises(grpc.RpcError) as e:
        client.generate("tiny-z")
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE and error_info(e.value).reason == "UNLOADED_BY_PREEMPTION"


def test_reload_after_preempt(broker_and_inference, tiny_models):
    broker, client, _ = broker_and_inference("--reload-after-preempt")
    client.load("tiny-z", tiny_models["zimage"], priority=3)
    first = result_of(client.generate("tiny-z", seeds=[4]))
    urgent = broker.granted("urgent", priority=9)
    deadline = time.monotonic() + 10
    while client.status().models:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    waiting = BackgroundStream(client.generate_stream("tiny-z", steps=2, seeds=[4]))
    time.sleep(0.5)
    assert not waiting.done.is_set()  # re-acquiring: queued behind the urgent holder
    broker.release(urgent)
    assert waiting.done.wait(60) and waiting.error is None, waiting.error
    assert result_of(waiting.events).images[0].data == first.images[0].data
    assert [l.holder.client_id for l in broker.status().leases] == ["inference-0"]


def test_doomed_replacements_leave_the_resident_model_and_its_lease(broker_and_inference, tiny_models, tmp_path):
    """Each of these used to unload the resident model and release its lease before failing."""
    import shutil

    broker, client, _ = broker_and_inference()
    client.load("tiny-z", tiny_models["zimage"])
    timeline = broker.timeline()
    truncated = tmp_path / "truncated"
    shutil.copytree(tiny_models["zimage"], truncated)
    weights = next((truncated / "transformer").glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes()[:-100])
    source = c.ModelSource(local_dir=str(tiny_models["zimage"]))
    doomed = [
        (pb.LoadRequest(model_id="m", source=c.ModelSource(local_dir=str(truncated))),
         grpc.StatusCode.INVALID_ARGUMENT, "CORRUPT_WEIGHTS"),
        (pb.LoadRequest(model_id="m", source=source, device_index=5), grpc.StatusCode.INVALID_ARGUMENT,
         "UNKNOWN_DEVICE"),
        (pb.LoadRequest(model_id="m", source=source, device_index=2**31 - 1), grpc.StatusCode.INVALID_ARGUMENT,
         "BAD_DEVICE_INDEX"),
    ]
    for req, code, reason in doomed:
        with pytest.raises(grpc.RpcError) as e:
            client.load_request(req)
        assert (e.value.code(), error_info(e.value).reason) == (code, reason), e.value.details()
    assert [m.model_id for m in client.status().models] == ["tiny-z"]
    assert [l.holder.client_id for l in broker.status().leases] == ["inference-0"]
    assert timeline.kinds() == ["SNAPSHOT"]  # nothing released, nothing queued


def test_no_generation_runs_while_the_lease_is_lost(start_broker, tiny_models):
    """The broker dies: the model stays resident but nothing runs on it (UNAVAILABLE, retryable) until a broker
    on the same address grants the lease again."""
    import signal

    from service_kit.service_process import free_port

    address = f"127.0.0.1:{free_port()}"
    broker_proc, broker = start_broker(fake_devices="1x24GiB", listen=address)
    proc = start_service("inference_service", "--broker", address, *InferenceClient.TEST_FLAGS, timeout=180)
    client = InferenceClient(proc.address)
    try:
        client.load("tiny-z", tiny_models["zimage"])
        assert result_of(client.generate("tiny-z"))
        broker_proc.stop(signal.SIGKILL)

        def generate_reason():
            try:
                client.generate("tiny-z", timeout=30)
                return "OK"
            except grpc.RpcError as e:
                info = error_info(e)
                return info.reason if info else e.code().name

        deadline = time.monotonic() + 20
        while generate_reason() != "NO_LEASE":  # the lost stream is noticed within the keepalive
            assert time.monotonic() < deadline
            time.sleep(0.3)
        _, again = start_broker(fake_devices="1x24GiB", listen=address)
        deadline = time.monotonic() + 30
        while generate_reason() != "OK":  # the client library re-acquires the same budget
            assert time.monotonic() < deadline
            time.sleep(0.3)
        assert [l.holder.client_id for l in again.status().leases] == ["inference-0"]
    finally:
        client.close()
        proc.stop()
