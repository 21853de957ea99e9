"""What the training job tests share: the request they start and a wait for a job's first step."""
from diffusion.v1 import common_pb2 as c
from diffusion.v1 import training_pb2 as pb


def request(tiny_models, dirs, **kw):
    return pb.StartTrainingRequest(**{
        "family": c.FAMILY_ZIMAGE, "base": c.ModelSource(local_dir=str(tiny_models["zimage"])),
        "dataset": pb.Dataset(image_dir=str(dirs["data"]), instance_prompt="a violet card"), "rank": 4,
        "resolution": 64, "steps": 4, "seed": 3, **kw})


def wait_first_step(service, job_id):
    seen = []
    for event in service.WatchTraining(pb.WatchTrainingRequest(job_id=job_id), timeout=120):
        if event.WhichOneof("event") == "step":
            return event.sequence
        seen.append(event)
    raise AssertionError(f"no step event: {seen}")


def trainer_pid(out_dir, job_id, timeout: float = 60.0) -> int:
    """The job's trainer process (its job folder's trainer.pid), waiting for it to start."""
    import time
    from pathlib import Path

    pid_file = Path(out_dir) / "jobs" / job_id / "trainer.pid"
    deadline = time.monotonic() + timeout
    while not pid_file.exists():
        assert time.monotonic() < deadline, "the trainer never started"
        time.sleep(0.05)
    return int(pid_file.read_text())


def trainer_alive(pid: int) -> bool:
    """Running, not a zombie waiting to be reaped."""
    from pathlib import Path

    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
