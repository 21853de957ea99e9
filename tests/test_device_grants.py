"""A lease on device N means the work runs on device N: real broker with a fake two-device inventory, device 0
held by someone else, and the services told device 1. (On this CPU host the work itself stays on the CPU; what
changes is where it would run, recorded on the model and the job.)"""
import grpc

from diffusion.v1 import training_pb2 as pb
from diffusion.v1 import training_pb2_grpc
from service_kit.server_runtime import CLIENT_OPTIONS
from service_kit.service_process import start_service
from tests.inference_service.harness import InferenceClient
from tests.service_flags import TRAINING_ROOTS
from tests.training_service.jobs_helper import request


def test_inference_reports_and_records_the_device_its_lease_is_on(start_broker, tiny_models):
    broker_proc, broker = start_broker(fake_devices="2x24GiB")
    other = broker.granted("someone-else", device=0)  # the whole of device 0
    proc = start_service("inference_service", "--broker", broker_proc.address, *InferenceClient.TEST_FLAGS, timeout=180)
    client = InferenceClient(proc.address)
    try:
        model = client.load("tiny-z", tiny_models["zimage"])[-1].result
        record = next(r for r in model.resolved if r.control == "device")
        assert model.device_index == 1 and "device 1" in record.applied
        [lease] = [x for x in broker.status().leases if x.holder.client_id == "inference-0"]
        assert lease.device_index == 1
    finally:
        client.close()
        proc.stop()
        broker.release(other)


def test_a_training_job_is_told_the_device_its_lease_is_on(start_broker, tiny_models, tmp_path):
    from PIL import Image

    dirs = {"out": tmp_path / "out", "adapters": tmp_path / "adapters", "data": tmp_path / "data"}
    dirs["data"].mkdir()
    for i in range(2):
        Image.new("RGB", (72, 64), (90 * i, 40, 160)).save(dirs["data"] / f"{i}.png")
    broker_proc, broker = start_broker(fake_devices="2x24GiB")
    other = broker.granted("someone-else", device=0)
    proc = start_service("training_service", *TRAINING_ROOTS, "--broker", broker_proc.address, "--output-dir",
                         str(dirs["out"]), "--adapter-store", str(dirs["adapters"]), timeout=180)
    channel = grpc.insecure_channel(proc.address, options=CLIENT_OPTIONS)
    stub = training_pb2_grpc.TrainingServiceStub(channel)
    try:
        job_id = stub.StartTraining(request(tiny_models, dirs, steps=1)).job_id
        events = list(stub.WatchTraining(pb.WatchTrainingRequest(job_id=job_id), timeout=120))
        granted = [e.phase.message for e in events if e.WhichOneof("event") == "phase" and "granted" in e.phase.message]
        assert granted and granted[0].startswith("granted device 1 (fake-1)")
        assert events[-1].finished.state == pb.TRAINING_JOB_STATE_SUCCEEDED
    finally:
        channel.close()
        proc.stop()
        broker.release(other)
