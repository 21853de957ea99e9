"""Training jobs over real loopback gRPC: a child process per job, Watch with replay, Stop, crash handling."""
import os
import signal
import time

import grpc
import pytest

from diffusion.v1 import common_pb2 as c
from diffusion.v1 import training_pb2 as pb
from diffusion.v1 import training_pb2_grpc
from diffusion_kit.adapter_store import AdapterStore
from service_kit.error_interceptor import error_info
from service_kit.server_runtime import CLIENT_OPTIONS
from service_kit.service_process import start_service
from tests.service_flags import TRAINING_ROOTS
from tests.training_service.jobs_helper import request, trainer_alive, trainer_pid, wait_first_step


def start_training_service(dirs):
    proc = start_service("training_service", *TRAINING_ROOTS, "--output-dir", str(dirs["out"]), "--adapter-store",
                         str(dirs["adapters"]), "--compile-backend", "aot_eager", "--compile-cache-dir",
                         str(dirs["out"].parent / "compile"), timeout=180)
    channel = grpc.insecure_channel(proc.address, options=CLIENT_OPTIONS)
    return proc, channel, training_pb2_grpc.TrainingServiceStub(channel)


@pytest.fixture(scope="module")
def service(dirs):
    proc, channel, stub = start_training_service(dirs)
    yield stub
    channel.close()
    proc.stop()


def kinds(events):
    return [e.WhichOneof("event") for e in events]


def test_start_watch_complete_and_replay(service, tiny_models, dirs):
    started = service.StartTraining(request(tiny_models, dirs, adapter_id="violet"))
    assert started.job.state in (pb.TRAINING_JOB_STATE_PENDING, pb.TRAINING_JOB_STATE_RUNNING)
    events = list(service.WatchTraining(pb.WatchTrainingRequest(job_id=started.job_id), timeout=120))
    assert kinds(events)[0] == "resolved" and kinds(events)[-1] == "finished"
    # No base_precision on a CPU host: the default NF4 fell back to fp32, in the record and on the stream.
    base = next(r for r in events[0].resolved.resolved if r.control == "base_precision")
    assert (base.applied, base.status) == ("PRECISION_FP32", c.SETTING_STATUS_FELL_BACK)
    warning = events[1].warning
    assert warning.reason == "SETTING_FELL_BACK" and "PRECISION_NF4 needs a CUDA GPU" in warning.message
    assert events[0].resolved.resolved[0].applied == "PRECISION_FP32"
    steps = [e.step for e in events if e.WhichOneof("event") == "step"]
    assert [s.step for s in steps] == [1, 2, 3, 4] and all(s.total_steps == 4 for s in steps)
    assert [e.sequence for e in events] == list(range(1, len(events) + 1))
    finished = events[-1].finished
    assert finished.state == pb.TRAINING_JOB_STATE_SUCCEEDED and finished.adapter_id == "violet"
    assert finished.steps_completed == 4
    adapter = AdapterStore(dirs["adapters"]).get("violet")
    assert (adapter.family, adapter.rank, adapter.steps, adapter.job_id) == ("zimage", 4, 4, started.job_id)
    # A watcher that reconnects from sequence k gets exactly the events from k on.
    k = events[3].sequence
    replay = list(service.WatchTraining(pb.WatchTrainingRequest(job_id=started.job_id, from_sequence=k), timeout=30))
    assert [e.SerializeToString() for e in replay] == [e.SerializeToString() for e in events[3:]]
    job = service.GetTrainingJob(pb.GetTrainingJobRequest(job_id=started.job_id)).job
    assert job.state == pb.TRAINING_JOB_STATE_SUCCEEDED and job.last_sequence == events[-1].sequence
    assert started.job_id in [j.job_id for j in service.ListTrainingJobs(pb.ListTrainingJobsRequest()).jobs]


@pytest.mark.parametrize("mode, adapter_published", [(pb.STOP_MODE_SAVE, True), (pb.STOP_MODE_DISCARD, False)])
def test_stop_at_a_step_boundary(service, tiny_models, dirs, mode, adapter_published):
    adapter_id = f"stopped-{mode}"
    job_id = service.StartTraining(request(tiny_models, dirs, steps=200, adapter_id=adapter_id)).job_id
    wait_first_step(service, job_id)
    service.StopTraining(pb.StopTrainingRequest(job_id=job_id, mode=mode))
    events = list(service.WatchTraining(pb.WatchTrainingRequest(job_id=job_id), timeout=120))
    finished = events[-1].finished
    assert finished.state == pb.TRAINING_JOB_STATE_CANCELLED and 1 <= finished.steps_completed < 200
    assert (adapter_id in [a.adapter_id for a in AdapterStore(dirs["adapters"]).list()]) is adapter_published
    with pytest.raises(grpc.RpcError) as e:
        service.StopTraining(pb.StopTrainingRequest(job_id=job_id))
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION


def test_killed_child_fails_the_job_and_the_service_lives_on(service, tiny_models, dirs):
    job_id = service.StartTraining(request(tiny_models, dirs, steps=200, checkpoint_every=2)).job_id
    saved = _watch_until(service, job_id, lambda e: e.WhichOneof("event") == "checkpoint")
    os.kill(trainer_pid(dirs["out"], job_id), signal.SIGKILL)
    events = list(service.WatchTraining(pb.WatchTrainingRequest(job_id=job_id), timeout=60))
    finished = events[-1].finished
    assert finished.state == pb.TRAINING_JOB_STATE_FAILED and "killed by SIGKILL" in finished.message
    assert f"resume_job_id={job_id}" in finished.message and saved.checkpoint.step >= 2  # says where to go on from
    assert service.GetTrainingInfo(pb.GetTrainingInfoRequest()).families  # the service is fine


def test_unknown_job_is_not_found(service):
    with pytest.raises(grpc.RpcError) as e:
        list(service.WatchTraining(pb.WatchTrainingRequest(job_id="job-nope"), timeout=10))
    assert e.value.code() == grpc.StatusCode.NOT_FOUND


def test_jobs_survive_a_service_restart(dirs, tiny_models):
    proc, channel, stub = start_training_service(dirs)
    try:
        job_id = stub.StartTraining(request(tiny_models, dirs, steps=2)).job_id
        events = list(stub.WatchTraining(pb.WatchTrainingRequest(job_id=job_id), timeout=120))
    finally:
        channel.close()
        proc.stop()
    proc, channel, stub = start_training_service(dirs)
    try:
        assert stub.GetTrainingJob(pb.GetTrainingJobRequest(job_id=job_id)).job.state == pb.TRAINING_JOB_STATE_SUCCEEDED
        again = list(stub.WatchTraining(pb.WatchTrainingRequest(job_id=job_id), timeout=30))
        assert [e.SerializeToString() for e in again] == [e.SerializeToString() for e in events]
    finally:
        channel.close()
        proc.stop()


def test_stopped_job_resumes_bit_identically(service, tiny_models, dirs):
    from safetensors.torch import load_file

    def losses(events):
        return [(e.step.step, e.step.loss) for e in events if e.WhichOneof("event") == "step"]

    straight_id = service.StartTraining(request(tiny_models, dirs, steps=6, adapter_id="straight")).job_id
    straight = list(service.WatchTraining(pb.WatchTrainingRequest(job_id=straight_id), timeout=120))

    first_id = service.StartTraining(request(tiny_models, dirs, steps=6, adapter_id="first-part")).job_id
    wait_first_step(service, first_id)
    service.StopTraining(pb.StopTrainingRequest(job_id=first_id, mode=pb.STOP_MODE_SAVE))
    first = list(service.WatchTraining(pb.WatchTrainingRequest(job_id=first_id), timeout=120))
    reached = first[-1].finished.steps_completed
    resumed_id = service.StartTraining(request(tiny_models, dirs, steps=6, adapter_id="resumed",
                                               resume_job_id=first_id)).job_id
    resumed = list(service.WatchTraining(pb.WatchTrainingRequest(job_id=resumed_id), timeout=120))
    assert resumed[-1].finished.state == pb.TRAINING_JOB_STATE_SUCCEEDED
    assert losses(first) + losses(resumed) == losses(straight)
    notes = {e.phase.phase: e.phase.message for e in resumed if e.WhichOneof("event") == "phase"}
    assert "0 encoded" in notes[pb.TRAINING_PHASE_ENCODING_TEXT]  # the service's encode cache served the rerun
    assert "0 encoded" in notes[pb.TRAINING_PHASE_CACHING_LATENTS]
    assert [s for s, _ in losses(resumed)] == list(range(reached + 1, 7))
    store = AdapterStore(dirs["adapters"])
    a, b = (load_file(store.path(i) / "pytorch_lora_weights.safetensors") for i in ("straight", "resumed"))
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)
    # A resume with different settings is refused before anything starts.
    with pytest.raises(grpc.RpcError) as e:
        service.StartTraining(request(tiny_models, dirs, steps=6, rank=8, resume_job_id=first_id))
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "rank" in e.value.details()
    # So is one whose images changed since the checkpoint (same names, new contents).
    import os

    image = sorted(dirs["data"].glob("*.png"))[0]
    before = image.stat()
    os.utime(image, ns=(before.st_atime_ns, before.st_mtime_ns + 10**9))
    try:
        with pytest.raises(grpc.RpcError) as e:
            service.StartTraining(request(tiny_models, dirs, steps=6, resume_job_id=first_id))
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "dataset_fingerprint" in e.value.details()
    finally:
        os.utime(image, ns=(before.st_atime_ns, before.st_mtime_ns))


def test_list_and_delete_adapters(service, tiny_models, dirs):
    job_id = service.StartTraining(request(tiny_models, dirs, steps=2, adapter_id="to-delete",
                                           trigger_words=["sks"])).job_id
    list(service.WatchTraining(pb.WatchTrainingRequest(job_id=job_id), timeout=120))
    listed = {a.adapter_id: a for a in service.ListAdapters(pb.ListAdaptersRequest(family=c.FAMILY_ZIMAGE)).adapters}
    adapter = listed["to-delete"]
    assert (adapter.family, adapter.rank, adapter.steps, list(adapter.trigger_words), adapter.job_id) == \
        (c.FAMILY_ZIMAGE, 4, 2, ["sks"], job_id)
    assert adapter.size_bytes > 0
    assert not service.ListAdapters(pb.ListAdaptersRequest(family=c.FAMILY_FLUX1)).adapters
    # A live process that has it loaded pins it: deleting is refused until it lets go.
    store = AdapterStore(dirs["adapters"])
    store.pin("to-delete", "inference-test")
    with pytest.raises(grpc.RpcError) as e:
        service.DeleteAdapter(pb.DeleteAdapterRequest(adapter_id="to-delete"))
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "inference-test" in e.value.details()
    store.unpin("to-delete", "inference-test")
    assert service.DeleteAdapter(pb.DeleteAdapterRequest(adapter_id="to-delete")).adapter.adapter_id == "to-delete"
    with pytest.raises(grpc.RpcError) as e:
        service.DeleteAdapter(pb.DeleteAdapterRequest(adapter_id="to-delete"))
    assert e.value.code() == grpc.StatusCode.NOT_FOUND


def test_speed_mode_default_compiles_and_says_how(service, tiny_models, dirs):
    job_id = service.StartTraining(request(tiny_models, dirs, steps=2, speed_mode=c.SPEED_MODE_DEFAULT)).job_id
    events = list(service.WatchTraining(pb.WatchTrainingRequest(job_id=job_id), timeout=120))
    assert events[-1].finished.state == pb.TRAINING_JOB_STATE_SUCCEEDED, events[-1].finished.message
    speed = next(r for r in events[0].resolved.resolved if r.control == "speed_mode")
    assert speed.applied == "regional_compile"
    compiling = [e.phase.message for e in events
                 if e.WhichOneof("event") == "phase" and e.phase.phase == pb.TRAINING_PHASE_COMPILING]
    assert len(compiling) == 1 and "aot_eager" in compiling[0]
    ahead = next(r for e in events if e.WhichOneof("event") == "resolved" for r in e.resolved.resolved
                 if r.control == "compile_ahead_of_time")  # on by default: the graphs are kept for the next job
    assert ahead.status == c.SETTING_STATUS_APPLIED and "compiled and saved" in ahead.applied, ahead


FAMILY_PROTOS = {"zimage": c.FAMILY_ZIMAGE, "flux1": c.FAMILY_FLUX1, "qwen_image": c.FAMILY_QWEN_IMAGE,
                 "sdxl": c.FAMILY_SDXL}


def family_request(tiny_models, dirs, family, **kw):
    return request(tiny_models, dirs, family=FAMILY_PROTOS[family],
                   base=c.ModelSource(local_dir=str(tiny_models[family])), **kw)


@pytest.mark.parametrize("family", list(FAMILY_PROTOS))
def test_every_family_trains_with_buckets_batches_and_samples(service, tiny_models, dirs, family):
    interval = {"sdxl": 2, "qwen_image": 3}.get(family, 0)  # partial checkpointing; a U-Net's blocks share a count
    job_id = service.StartTraining(family_request(
        tiny_models, dirs, family, steps=4, batch_size=2, gradient_accumulation_steps=2, sample_every=2,
        sample_prompts=["a violet card"],
        lr_schedule=pb.LR_SCHEDULE_COSINE, gradient_checkpointing=True, gradient_checkpointing_interval=interval,
        dataset=pb.Dataset(image_dir=str(dirs["data"]), instance_prompt="a violet card", aspect_ratio_buckets=True),
        adapter_id=f"every-{family}")).job_id
    events = list(service.WatchTraining(pb.WatchTrainingRequest(job_id=job_id), timeout=180))
    assert events[-1].finished.state == pb.TRAINING_JOB_STATE_SUCCEEDED, events[-1].finished.message
    resolved = {r.control: r.applied for r in events[0].resolved.resolved}
    assert resolved["lr_schedule"].startswith("cosine")
    assert resolved["gradient_checkpointing"] == (f"true (1 block call in every {interval})" if interval else "true")
    assert resolved["aspect_ratio_buckets"] == "true" and resolved["optimizer"] == "adamw"
    assert resolved["effective_batch"].startswith("4 ")
    assert resolved["gpu_memory"].endswith(("KiB", "MiB"))  # a tiny model's estimate, from its weights on disk
    assert resolved["checkpoints"].startswith("at least every 10 min")  # the service's safety net
    phases = [(e.phase.phase, e.phase.message) for e in events if e.WhichOneof("event") == "phase"]
    assert [p for p, _ in phases] == [pb.TRAINING_PHASE_ENCODING_TEXT, pb.TRAINING_PHASE_CACHING_LATENTS,
                                      pb.TRAINING_PHASE_LOADING_TRANSFORMER, pb.TRAINING_PHASE_TRAINING,
                                      pb.TRAINING_PHASE_SAVING, pb.TRAINING_PHASE_PUBLISHING]
    steps = [e.step for e in events if e.WhichOneof("event") == "step"]
    assert [s.step for s in steps] == [1, 2, 3, 4] and all(s.samples_per_second > 0 for s in steps)
    assert steps[0].eta.ToNanoseconds() > 0 and steps[-1].elapsed.ToNanoseconds() > 0
    samples = [e.sample for e in events if e.WhichOneof("event") == "sample"]
    assert [(s.step, s.prompt) for s in samples] == [(2, "a violet card"), (4, "a violet card")]
    assert all(s.png.startswith(b"\x89PNG") for s in samples)
    assert AdapterStore(dirs["adapters"]).get(f"every-{family}").family == family


@pytest.fixture(scope="module")
def inference(dirs):
    from tests.inference_service.harness import InferenceClient

    proc = start_service("inference_service", *InferenceClient.TEST_FLAGS, "--adapter-store", str(dirs["adapters"]),
                         timeout=180)
    client = InferenceClient(proc.address)
    yield client
    client.close()
    proc.stop()


@pytest.mark.parametrize("family", list(FAMILY_PROTOS))
def test_trained_adapter_loads_in_the_inference_service(service, inference, tiny_models, dirs, family):
    from diffusion.v1 import inference_pb2 as ipb
    from tests.inference_service.harness import decode, result_of

    adapter_id = f"for-inference-{family}"
    job_id = service.StartTraining(family_request(tiny_models, dirs, family, steps=3, adapter_id=adapter_id,
                                                  learning_rate=1e-2)).job_id
    events = list(service.WatchTraining(pb.WatchTrainingRequest(job_id=job_id), timeout=120))
    assert events[-1].finished.adapter_id == adapter_id, events[-1].finished.message
    inference.load(family, tiny_models[family])

    def image(weight=None):
        adapters = [] if weight is None else [ipb.AdapterRef(adapter_id=adapter_id, weight=weight)]
        return decode(result_of(inference.generate(family, seeds=[5], adapters=adapters)).images[0]).tobytes()

    base = image()
    assert image(1.0) != base
    assert image(0.0) == base


def _service_on(out, dirs):
    return start_training_service({**dirs, "out": out})


def _watch_until(stub, job_id, predicate, timeout=120):
    for event in stub.WatchTraining(pb.WatchTrainingRequest(job_id=job_id), timeout=timeout):
        if predicate(event):
            return event
    raise AssertionError("the stream ended first")


def _first_resumed_step(stub, tiny_models, dirs, job_id) -> int:
    """Resumes job_id, returns the first step the new job reports, and discards it."""
    resumed = stub.StartTraining(request(tiny_models, dirs, steps=400, resume_job_id=job_id)).job_id
    first = _watch_until(stub, resumed, lambda e: e.WhichOneof("event") == "step")
    stub.StopTraining(pb.StopTrainingRequest(job_id=resumed, mode=pb.STOP_MODE_DISCARD))
    _watch_until(stub, resumed, lambda e: e.WhichOneof("event") == "finished")
    return first.step.step


def test_sigterm_suspends_running_jobs_with_a_checkpoint_and_they_resume(tiny_models, dirs, tmp_path):
    import signal

    proc, channel, stub = _service_on(tmp_path / "out", dirs)
    try:
        job_id = stub.StartTraining(request(tiny_models, dirs, steps=400)).job_id
        _watch_until(stub, job_id, lambda e: e.WhichOneof("event") == "step")
    finally:
        channel.close()
        assert proc.stop(signal.SIGTERM, timeout=60) == 0  # drained: the job checkpointed first
    proc, channel, stub = _service_on(tmp_path / "out", dirs)
    try:
        events = list(stub.WatchTraining(pb.WatchTrainingRequest(job_id=job_id), timeout=30))
        assert "SERVICE_STOPPING" in [e.warning.reason for e in events if e.WhichOneof("event") == "warning"]
        finished = events[-1].finished
        assert finished.state == pb.TRAINING_JOB_STATE_SUSPENDED and 1 <= finished.steps_completed < 400
        assert _first_resumed_step(stub, tiny_models, dirs, job_id) == finished.steps_completed + 1
    finally:
        channel.close()
        proc.stop()


def test_a_crashed_service_leaves_a_final_event_and_the_last_checkpoint_resumes(tiny_models, dirs, tmp_path):
    import signal

    proc, channel, stub = _service_on(tmp_path / "out", dirs)
    try:
        job_id = stub.StartTraining(request(tiny_models, dirs, steps=400, checkpoint_every=2)).job_id
        saved = _watch_until(stub, job_id, lambda e: e.WhichOneof("event") == "checkpoint")
    finally:
        channel.close()
        proc.stop(signal.SIGKILL)
    proc, channel, stub = _service_on(tmp_path / "out", dirs)
    try:
        job = stub.GetTrainingJob(pb.GetTrainingJobRequest(job_id=job_id)).job
        assert job.state == pb.TRAINING_JOB_STATE_FAILED
        events = list(stub.WatchTraining(pb.WatchTrainingRequest(job_id=job_id), timeout=30))
        assert events[-1].finished.state == pb.TRAINING_JOB_STATE_FAILED
        assert f"resume_job_id={job_id}" in events[-1].finished.message
        assert saved.checkpoint.step >= 2
        # From the newest checkpoint on disk, not from zero.
        assert _first_resumed_step(stub, tiny_models, dirs, job_id) > saved.checkpoint.step
    finally:
        channel.close()
        proc.stop()


def test_a_hub_base_is_preflighted_from_two_small_files_and_fetched_by_the_job(tiny_models, dirs, tmp_path):
    from tests.inference_service.sources_helper import seed_hub_cache

    cache = tmp_path / "hub"
    seed_hub_cache(cache, "tiny-org/tiny-flux", tiny_models["flux1"])
    proc = start_service("training_service", *TRAINING_ROOTS, "--output-dir", str(tmp_path / "out"), "--adapter-store",
                         str(dirs["adapters"]), timeout=180,
                         env={"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"})
    channel = grpc.insecure_channel(proc.address, options=CLIENT_OPTIONS)
    stub = training_pb2_grpc.TrainingServiceStub(channel)
    try:
        hub = c.ModelSource(hub_repo=c.HubRepo(repo_id="tiny-org/tiny-flux"))
        job_id = stub.StartTraining(request(tiny_models, dirs, family=c.FAMILY_FLUX1, base=hub, steps=2,
                                            adapter_id="from-the-hub")).job_id
        events = list(stub.WatchTraining(pb.WatchTrainingRequest(job_id=job_id), timeout=120))
        assert events[-1].finished.state == pb.TRAINING_JOB_STATE_SUCCEEDED, events[-1].finished.message
        phases = [e.phase.phase for e in events if e.WhichOneof("event") == "phase"]
        assert phases[0] == pb.TRAINING_PHASE_DOWNLOADING
        assert AdapterStore(dirs["adapters"]).get("from-the-hub").base == "tiny-org/tiny-flux"
        for repo_id, code, reason in [("nobody/not-cached", grpc.StatusCode.NOT_FOUND, "NOT_CACHED_OFFLINE"),
                                      ("no-slash", grpc.StatusCode.INVALID_ARGUMENT, "BAD_REPO_ID")]:
            with pytest.raises(grpc.RpcError) as e:
                stub.StartTraining(request(tiny_models, dirs, family=c.FAMILY_FLUX1, base=c.ModelSource(
                    hub_repo=c.HubRepo(repo_id=repo_id))))
            assert (e.value.code(), error_info(e.value).reason) == (code, reason)
        with pytest.raises(grpc.RpcError) as e:  # a hub repo of another family
            stub.StartTraining(request(tiny_models, dirs, base=hub))
        assert error_info(e.value).reason == "FAMILY_MISMATCH"
    finally:
        channel.close()
        proc.stop()


def test_an_adapter_id_is_claimed_before_training_not_after(service, tiny_models, dirs):
    first = service.StartTraining(request(tiny_models, dirs, steps=3, adapter_id="claimed")).job_id
    with pytest.raises(grpc.RpcError) as e:  # another running job will publish it
        service.StartTraining(request(tiny_models, dirs, steps=3, adapter_id="claimed"))
    assert (e.value.code(), error_info(e.value).reason) == (grpc.StatusCode.FAILED_PRECONDITION, "ADAPTER_EXISTS")
    assert first in e.value.details()
    events = list(service.WatchTraining(pb.WatchTrainingRequest(job_id=first), timeout=120))
    assert events[-1].finished.state == pb.TRAINING_JOB_STATE_SUCCEEDED
    with pytest.raises(grpc.RpcError) as e:  # now it is in the store
        service.StartTraining(request(tiny_models, dirs, steps=3, adapter_id="claimed"))
    assert error_info(e.value).reason == "ADAPTER_EXISTS" and "already exists" in e.value.details()


def test_a_killed_service_takes_its_trainer_children_with_it(tiny_models, dirs, tmp_path):
    """Even a child still loading (it prints nothing for seconds) dies at once: its lease died with the service."""
    import signal

    proc, channel, stub = _service_on(tmp_path / "out", dirs)
    try:
        job_id = stub.StartTraining(request(tiny_models, dirs, steps=400)).job_id
        pid = trainer_pid(tmp_path / "out", job_id)
    finally:
        channel.close()
        proc.stop(signal.SIGKILL)
    deadline = time.monotonic() + 1.0
    while trainer_alive(pid):
        assert time.monotonic() < deadline, "the trainer child outlived its service"
        time.sleep(0.05)


def test_a_full_disk_stops_the_job_records_why_and_leaves_nothing_running(tiny_models, dirs, tmp_path):
    """The job's event log and record are pointed at /dev/full (every write fails with ENOSPC, as on a full
    disk) while the job trains. Before: the job was FAILED in memory only, a watcher never got `finished`,
    the child trained on without being read (then blocked on its pipe) and SIGTERM of the service hung."""
    import os
    import threading

    proc, channel, stub = _service_on(tmp_path / "out", dirs)
    stopped = False
    try:
        job_id = stub.StartTraining(request(tiny_models, dirs, steps=100_000)).job_id
        job_dir = tmp_path / "out" / "jobs" / job_id
        seen, done = [], threading.Event()

        def watch():
            for event in stub.WatchTraining(pb.WatchTrainingRequest(job_id=job_id), timeout=120):
                seen.append(event)
            done.set()

        threading.Thread(target=watch, daemon=True).start()
        deadline = time.monotonic() + 60
        while not any(e.WhichOneof("event") == "step" for e in seen):
            assert time.monotonic() < deadline, "the job never stepped"
            time.sleep(0.05)
        for name in ("events.jsonl", "job.json.tmp"):
            link = job_dir / f"{name}.full"
            os.symlink("/dev/full", link)
            os.replace(link, job_dir / name)
        assert done.wait(60), "a watcher attached before the failure never saw the job end"
        finished = seen[-1].finished
        assert finished.state == pb.TRAINING_JOB_STATE_FAILED and "could not be written" in finished.message
        assert not trainer_alive(trainer_pid(tmp_path / "out", job_id))
        assert stub.GetTrainingJob(pb.GetTrainingJobRequest(job_id=job_id)).job.state == pb.TRAINING_JOB_STATE_FAILED
        with pytest.raises(grpc.RpcError) as e:
            stub.StopTraining(pb.StopTrainingRequest(job_id=job_id))
        assert error_info(e.value).reason == "JOB_ENDED"
        assert not (job_dir / "job.json.tmp").exists()  # the failed record write left no temporary behind
        started = time.monotonic()
        proc.stop()
        stopped = True
        assert time.monotonic() - started < 15  # SIGTERM drains at once: no child is left to wait for
    finally:
        channel.close()
        if not stopped:
            proc.stop()
