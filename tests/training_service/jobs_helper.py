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
