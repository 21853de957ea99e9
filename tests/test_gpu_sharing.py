"""Inference first on a shared GPU: a training job on the same device pauses between its steps while a Generate
runs or waits, and resumes once the inference service has been idle for its linger. Real broker, real inference
and training services over loopback, tiny models (on this host the device is a fake inventory's)."""
import asyncio
import threading
import time

import grpc
import pytest

from diffusion.v1 import broker_pb2
from diffusion.v1 import training_pb2 as pb
from diffusion.v1 import training_pb2_grpc
from gpu_broker.client import BrokerClient, LeaseRequest
from inference_service.busy_signal import BusySignal
from service_kit.server_runtime import CLIENT_OPTIONS
from service_kit.service_process import start_service
from tests.gpu_broker.harness import GiB
from tests.inference_service.harness import InferenceClient, result_of
from tests.test_metrics import METRICS, scrape, value
from tests.service_flags import TRAINING_ROOTS
from tests.training_service.jobs_helper import request

LINGER_S = 1.0


def kind(event):
    return event.WhichOneof("event")


def test_training_yields_between_steps_while_a_generation_runs_and_resumes_after(start_broker, tiny_models,
                                                                                  tmp_path):
    from PIL import Image

    dirs = {"out": tmp_path / "out", "adapters": tmp_path / "adapters", "data": tmp_path / "data"}
    dirs["data"].mkdir()
    for i in range(2):
        Image.new("RGB", (64, 64), (90 * i, 40, 160)).save(dirs["data"] / f"{i}.png")
    broker_proc, _ = start_broker(*METRICS, fake_devices="1x24GiB")
    training = start_service("training_service", *TRAINING_ROOTS, "--broker", broker_proc.address, "--output-dir",
                             str(dirs["out"]), "--adapter-store", str(dirs["adapters"]), *METRICS, timeout=180)
    inference = start_service("inference_service", "--broker", broker_proc.address, "--busy-linger", str(LINGER_S),
                              *InferenceClient.TEST_FLAGS, timeout=180)
    channel = grpc.insecure_channel(training.address, options=CLIENT_OPTIONS)
    stub = training_pb2_grpc.TrainingServiceStub(channel)
    client = InferenceClient(inference.address)
    events, first_step, resumed = [], threading.Event(), threading.Event()

    def watch(job_id):
        for event in stub.WatchTraining(pb.WatchTrainingRequest(job_id=job_id), timeout=240):
            events.append(event)
            if kind(event) == "step":
                first_step.set()
            if kind(event) == "phase" and event.phase.message.startswith("resumed"):
                resumed.set()

    try:
        client.load("tiny-z", tiny_models["zimage"])
        job_id = stub.StartTraining(request(tiny_models, dirs, steps=20000)).job_id
        watcher = threading.Thread(target=watch, args=(job_id,), daemon=True)
        watcher.start()
        assert first_step.wait(120), [kind(e) for e in events]
        asked_at = time.time()
        generation = result_of(client.generate("tiny-z", steps=2))
        done_at = time.time()
        assert resumed.wait(60), [(kind(e), e.phase.message) for e in events if kind(e) == "phase"]
        deadline = time.monotonic() + 30
        while not [e for e in events[-3:] if kind(e) == "step" and e.step.yielded.ToNanoseconds()]:
            assert time.monotonic() < deadline, "no step after the resume"
            time.sleep(0.05)
        broker_figures, training_figures = scrape(broker_proc), scrape(training)
        stub.StopTraining(pb.StopTrainingRequest(job_id=job_id, mode=pb.STOP_MODE_DISCARD), timeout=30)
        watcher.join(120)
    finally:
        client.close()
        channel.close()
        inference.stop()
        training.stop()

    sharing = [r for r in generation.result.resolved if r.control == "gpu_sharing"]
    assert [r.applied for r in sharing] == ["inference-first"], sharing
    paused = next(i for i, e in enumerate(events) if kind(e) == "phase" and e.phase.phase == pb.TRAINING_PHASE_YIELDING)
    back = next(i for i, e in enumerate(events) if kind(e) == "phase" and e.phase.message.startswith("resumed"))
    assert "'inference-0' is busy on this GPU" in events[paused].phase.message
    assert events[back].phase.phase == pb.TRAINING_PHASE_TRAINING
    assert not [e for e in events[paused:back] if kind(e) == "step"], "a step ran while the job yielded"
    # it paused once the generation was asked for, and resumed only after the service had been idle its linger
    assert events[paused].time.ToDatetime().timestamp() >= asked_at - 0.05
    assert events[back].time.ToDatetime().timestamp() >= done_at + LINGER_S * 0.8
    step_after = next(e.step for e in events[back:] if kind(e) == "step")
    assert step_after.yielded.ToNanoseconds() / 1e9 >= LINGER_S * 0.8
    # what an operator sees: the broker's yield transitions, the seconds the job yielded
    for what in ("yield_requested", "yield_withdrawn"):
        assert value(broker_figures, "diffusion_broker_transitions_total", kind=what) >= 1
    yielded = value(training_figures, "diffusion_training_yielded_seconds_total", family="zimage")
    assert yielded >= LINGER_S * 0.8


def test_a_lease_the_broker_no_longer_has_is_said_as_a_fallback_in_the_record(start_broker):
    """The signal never fails a generation: a SetBusy the broker refuses becomes a FELL_BACK record saying why."""
    proc, broker = start_broker()

    async def scenario():
        signal = BusySignal(linger_s=0.05)
        async with BrokerClient(proc.address) as client:
            async with client.lease(LeaseRequest("inference-0", memory_bytes=4 * GiB)) as held:
                signal.set(held, True)
                deadline = time.monotonic() + 5
                while [x.busy for x in (await client.status()).leases] != [True]:  # what the broker holds
                    assert time.monotonic() < deadline, "SetBusy was not sent"
                    await asyncio.sleep(0.02)
                assert signal.record(held).applied == "inference-first"
                signal.set(held, False)  # idle after the linger
                while [x.busy for x in (await client.status()).leases] != [False]:
                    assert time.monotonic() < deadline, "the lease stayed busy after the linger"
                    await asyncio.sleep(0.02)
                await asyncio.to_thread(broker.stub.Release, broker_pb2.ReleaseRequest(lease_id=held.lease_id))
                signal.set(held, True)
                while signal.record(held).applied != "not marked busy":
                    assert time.monotonic() < deadline, "the refused SetBusy was not recorded"
                    await asyncio.sleep(0.02)
                record = signal.record(held)
                assert record.fell_back() and "NOT_FOUND" in record.reason and "may run beside" in record.reason
        await signal.close()

    asyncio.run(asyncio.wait_for(scenario(), 30))


@pytest.mark.parametrize("linger_s", [0.0])
def test_no_broker_means_no_sharing_record(linger_s):
    assert BusySignal(linger_s).record(None) is None
