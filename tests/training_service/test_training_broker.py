"""Training under a real broker: preflights before Acquire, preemption suspends with a checkpoint, crashes release."""
import json
import os
import signal

import grpc
import pytest

from diffusion.v1 import common_pb2 as c
from diffusion.v1 import training_pb2 as pb
from diffusion.v1 import training_pb2_grpc
from service_kit.server_runtime import CLIENT_OPTIONS
from service_kit.service_process import start_service
from tests.service_flags import TRAINING_ROOTS
from tests.training_service.jobs_helper import request, trainer_pid, wait_first_step


@pytest.fixture
def stack(start_broker, dirs):
    broker_proc, broker = start_broker(fake_devices="1x24GiB")
    proc = start_service("training_service", *TRAINING_ROOTS, "--broker", broker_proc.address, "--output-dir", str(dirs["out"]),
                         "--adapter-store", str(dirs["adapters"]), timeout=180)
    channel = grpc.insecure_channel(proc.address, options=CLIENT_OPTIONS)
    yield broker, training_pb2_grpc.TrainingServiceStub(channel)
    channel.close()
    proc.stop()


def test_preflight_failures_never_disturb_the_holder(stack, tiny_models, dirs, tmp_path):
    broker, service = stack
    timeline = broker.timeline()
    holder = broker.granted("inference-0", priority=0)
    for bad in (request(tiny_models, dirs, dataset=pb.Dataset(image_dir=str(tmp_path / "none"))),
                request(tiny_models, dirs, base_precision=5), request(tiny_models, dirs, rank=-1),
                request(tiny_models, dirs, base_precision=c.PRECISION_FP8),  # fp8 needs CUDA: FAILED_PRECONDITION
                request(tiny_models, dirs, batch_size=1000), request(tiny_models, dirs, lr_schedule=42),
                request(tiny_models, dirs, resume_job_id="job-never-was")):
        with pytest.raises(grpc.RpcError):
            service.StartTraining(bad)
    assert holder.kinds_so_far(0.3) == [] and timeline.kinds() == ["SNAPSHOT", "GRANTED"]


def test_preempt_suspends_with_a_checkpoint_and_the_job_resumes(stack, tiny_models, dirs):
    broker, service = stack
    timeline = broker.timeline()
    job_id = service.StartTraining(request(tiny_models, dirs, steps=200, priority=1)).job_id
    wait_first_step(service, job_id)
    granted = timeline.wait_for("GRANTED", timeout=10)
    assert granted.transition.holder.client_id == "training-0"
    urgent = broker.acquire("urgent", priority=9)
    assert urgent.wait_for("granted", timeout=60).granted.holder.client_id == "urgent"
    events = list(service.WatchTraining(pb.WatchTrainingRequest(job_id=job_id), timeout=60))
    # (the first warning on a CPU host is the default precision's fallback to fp32)
    warning = next(e.warning for e in events
                   if e.WhichOneof("event") == "warning" and e.warning.reason != "SETTING_FELL_BACK")
    assert warning.reason == "PREEMPTED" and "urgent" in warning.message
    finished = events[-1].finished
    assert finished.state == pb.TRAINING_JOB_STATE_SUSPENDED and 0 < finished.steps_completed < 200
    released = timeline.wait_for("RELEASED", timeout=10)
    assert released.transition.holder.client_id == "training-0"
    broker.release(urgent)
    resumed_id = service.StartTraining(request(tiny_models, dirs, steps=200, priority=1, resume_job_id=job_id)).job_id
    first_step = next(e.step.step for e in service.WatchTraining(pb.WatchTrainingRequest(job_id=resumed_id), timeout=60)
                      if e.WhichOneof("event") == "step")
    assert first_step == finished.steps_completed + 1
    service.StopTraining(pb.StopTrainingRequest(job_id=resumed_id, mode=pb.STOP_MODE_DISCARD))


def test_killed_child_releases_the_lease(stack, tiny_models, dirs):
    broker, service = stack
    timeline = broker.timeline()
    job_id = service.StartTraining(request(tiny_models, dirs, steps=200)).job_id
    wait_first_step(service, job_id)
    assert [l.holder.client_id for l in broker.status().leases] == ["training-0"]
    os.kill(trainer_pid(dirs["out"], job_id), signal.SIGKILL)
    timeline.wait_for("RELEASED", timeout=15)
    assert list(broker.status().leases) == []
    events = list(service.WatchTraining(pb.WatchTrainingRequest(job_id=job_id), timeout=30))
    assert events[-1].finished.state == pb.TRAINING_JOB_STATE_FAILED
    assert "killed by SIGKILL" in events[-1].finished.message  # the cause, not the last line of stderr


def test_a_draining_service_checkpoints_then_gives_the_gpu_back(start_broker, tiny_models, dirs, tmp_path):
    import signal

    broker_proc, broker = start_broker(fake_devices="1x24GiB")
    proc = start_service("training_service", *TRAINING_ROOTS, "--broker", broker_proc.address, "--output-dir", str(tmp_path / "out"),
                         "--adapter-store", str(dirs["adapters"]), timeout=180)
    channel = grpc.insecure_channel(proc.address, options=CLIENT_OPTIONS)
    service = training_pb2_grpc.TrainingServiceStub(channel)
    timeline = broker.timeline()
    try:
        job_id = service.StartTraining(request(tiny_models, dirs, steps=400)).job_id
        wait_first_step(service, job_id)
        assert [lease.holder.client_id for lease in broker.status().leases] == ["training-0"]
    finally:
        channel.close()
    assert proc.stop(signal.SIGTERM, timeout=60) == 0
    timeline.wait_for("RELEASED", timeout=15)
    assert list(broker.status().leases) == []
    job = json.loads((tmp_path / "out" / "jobs" / job_id / "job.json").read_text())
    assert job["state"] == "SUSPENDED" and job["steps_completed"] >= 1
    assert (tmp_path / "out" / "jobs" / job_id / "checkpoint" / "identity.json").is_file()
    events = [json.loads(line) for line in (tmp_path / "out" / "jobs" / job_id / "events.jsonl").read_text().splitlines()]
    message = events[-1]["data"]["message"]  # a drain is no preemption, and says so
    assert "the training service stopped" in message and "preempted" not in message


def test_a_job_still_waiting_for_the_gpu_is_cancelled_by_a_drain(start_broker, tiny_models, dirs, tmp_path):
    import signal

    broker_proc, broker = start_broker(fake_devices="1x24GiB")
    holder = broker.granted("inference-0", priority=10, memory=24 * 2**30)  # the whole card, not preemptible by 0
    proc = start_service("training_service", *TRAINING_ROOTS, "--broker", broker_proc.address, "--output-dir", str(tmp_path / "out"),
                         "--adapter-store", str(dirs["adapters"]), timeout=180)
    channel = grpc.insecure_channel(proc.address, options=CLIENT_OPTIONS)
    service = training_pb2_grpc.TrainingServiceStub(channel)
    try:
        job_id = service.StartTraining(request(tiny_models, dirs, steps=5, priority=0)).job_id
        for event in service.WatchTraining(pb.WatchTrainingRequest(job_id=job_id), timeout=30):
            if event.WhichOneof("event") == "phase" and event.phase.phase == pb.TRAINING_PHASE_WAITING_FOR_GPU:
                break
    finally:
        channel.close()
    assert proc.stop(signal.SIGTERM, timeout=30) == 0
    job = json.loads((tmp_path / "out" / "jobs" / job_id / "job.json").read_text())
    assert job["state"] == "CANCELLED" and job["steps_completed"] == 0
    assert [lease.holder.client_id for lease in broker.status().leases] == ["inference-0"]  # undisturbed
    assert holder.kinds_so_far(0.3) == []


def test_a_job_waiting_for_the_gpu_can_be_stopped(stack, tiny_models, dirs):
    broker, service = stack
    holder = broker.granted("inference-0", priority=9)  # the whole device, above the job's priority
    job_id = service.StartTraining(request(tiny_models, dirs, steps=4)).job_id
    for _ in range(100):
        if [w.holder.client_id for w in broker.status().queue] == ["training-0"]:
            break
        __import__("time").sleep(0.05)
    assert service.GetTrainingJob(pb.GetTrainingJobRequest(job_id=job_id)).job.state == pb.TRAINING_JOB_STATE_PENDING
    service.StopTraining(pb.StopTrainingRequest(job_id=job_id), timeout=10)
    finished = list(service.WatchTraining(pb.WatchTrainingRequest(job_id=job_id), timeout=30))[-1].finished
    assert finished.state == pb.TRAINING_JOB_STATE_CANCELLED and "StopTraining" in finished.message
    assert list(broker.status().queue) == [] and holder.kinds_so_far(0.3) == []  # withdrawn; the holder undisturbed
    with pytest.raises(grpc.RpcError) as e:  # and it stays stopped: nothing trains once the GPU frees
        service.StopTraining(pb.StopTrainingRequest(job_id=job_id), timeout=10)
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION


def test_a_job_whose_lease_is_lost_checkpoints_and_stops(start_broker, tiny_models, dirs, tmp_path):
    """The broker dies under a running job: the trainer must not go on computing outside the books."""
    import signal

    from service_kit.service_process import free_port

    address = f"127.0.0.1:{free_port()}"
    broker_proc, _ = start_broker(fake_devices="1x24GiB", listen=address)
    proc = start_service("training_service", *TRAINING_ROOTS, "--broker", address, "--output-dir",
                         str(tmp_path / "out"), "--adapter-store", str(dirs["adapters"]), timeout=180)
    channel = grpc.insecure_channel(proc.address, options=CLIENT_OPTIONS)
    service = training_pb2_grpc.TrainingServiceStub(channel)
    try:
        job_id = service.StartTraining(request(tiny_models, dirs, steps=400)).job_id
        wait_first_step(service, job_id)
        broker_proc.stop(signal.SIGKILL)
        events = list(service.WatchTraining(pb.WatchTrainingRequest(job_id=job_id), timeout=60))
        assert "LEASE_LOST" in [e.warning.reason for e in events if e.WhichOneof("event") == "warning"]
        finished = events[-1].finished
        assert finished.state == pb.TRAINING_JOB_STATE_SUSPENDED and finished.steps_completed < 400
        assert "lease was lost" in finished.message
    finally:
        channel.close()
        proc.stop()


def test_a_finished_job_has_given_its_lease_back(stack, tiny_models, dirs):
    """A caller that sees SUCCEEDED and starts the next thing finds the GPU free: the end is recorded only after
    the trainer has exited and the lease is released."""
    broker, service = stack
    job_id = service.StartTraining(request(tiny_models, dirs, steps=2)).job_id
    events = list(service.WatchTraining(pb.WatchTrainingRequest(job_id=job_id), timeout=120))
    assert events[-1].finished.state == pb.TRAINING_JOB_STATE_SUCCEEDED
    assert [x.holder.client_id for x in broker.status().leases] == []
