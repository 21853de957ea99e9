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


def _training(broker_proc, tmp_path):
    from PIL import Image

    dirs = {"out": tmp_path / "out", "adapters": tmp_path / "adapters", "data": tmp_path / "data"}
    dirs["data"].mkdir()
    for i in range(2):
        Image.new("RGB", (72, 64), (90 * i, 40, 160)).save(dirs["data"] / f"{i}.png")
    proc = start_service("training_service", *TRAINING_ROOTS, "--broker", broker_proc.address, "--output-dir",
                         str(dirs["out"]), "--adapter-store", str(dirs["adapters"]), timeout=180)
    return proc, dirs


def test_a_training_job_pinned_to_a_device_trains_there_and_a_doomed_pin_creates_nothing(start_broker, tiny_models,
                                                                                         tmp_path):
    from service_kit.error_interceptor import error_info

    broker_proc, broker = start_broker(fake_devices="2x24GiB,1x1MiB")
    proc, dirs = _training(broker_proc, tmp_path)
    channel = grpc.insecure_channel(proc.address, options=CLIENT_OPTIONS)
    stub = training_pb2_grpc.TrainingServiceStub(channel)
    timeline = broker.timeline()
    try:
        for pin, granted in ((None, "granted device 0"), (1, "granted device 1")):  # best fit takes device 0
            extra = {} if pin is None else {"device_index": pin}
            job_id = stub.StartTraining(request(tiny_models, dirs, steps=1, **extra)).job_id
            events = list(stub.WatchTraining(pb.WatchTrainingRequest(job_id=job_id), timeout=120))
            said = [e.phase.message for e in events if e.WhichOneof("event") == "phase" and "granted" in e.phase.message]
            assert said and said[0].startswith(granted), said
            assert events[-1].finished.state == pb.TRAINING_JOB_STATE_SUCCEEDED
            records = [r for e in events if e.WhichOneof("event") == "resolved" for r in e.resolved.resolved]
            assert [r.applied for r in records if r.control == "device"] == ([] if pin is None else ["device 1"])
        jobs_before = len(stub.ListTrainingJobs(pb.ListTrainingJobsRequest()).jobs)
        acquires_before = timeline.kinds().count("GRANTED")
        for pin, code, reason in ((3, grpc.StatusCode.INVALID_ARGUMENT, "UNKNOWN_DEVICE"),
                                  (2, grpc.StatusCode.RESOURCE_EXHAUSTED, "NEVER_FITS")):  # device 2 has 1 MiB
            try:
                stub.StartTraining(request(tiny_models, dirs, steps=1, device_index=pin))
                raise AssertionError(f"device {pin} was taken")
            except grpc.RpcError as e:
                assert e.code() == code and error_info(e).reason == reason, e.details()
        assert len(stub.ListTrainingJobs(pb.ListTrainingJobsRequest()).jobs) == jobs_before  # no job was created
        assert timeline.kinds().count("GRANTED") == acquires_before and broker.status().leases == []
    finally:
        channel.close()
        proc.stop()
