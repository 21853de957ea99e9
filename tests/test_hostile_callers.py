"""Hostile callers against the three real services on loopback, with bearer tokens on: every finding of the
outside test is reproduced here and must now answer with the right code, touch nothing, and echo nothing big.

One broker, one inference service and one training service are started once, each with a token file;
the inference and training services present their own tokens to the broker. The model and dataset
roots are folders of this test; a canary model and caption lie outside them.
"""
import os
import shutil
import struct
import time
import zlib

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from PIL import Image

from diffusion.v1 import broker_pb2, broker_pb2_grpc, common_pb2 as c
from diffusion.v1 import common_pb2
from diffusion.v1 import inference_pb2 as ipb
from diffusion.v1 import inference_pb2_grpc, training_pb2 as tpb, training_pb2_grpc
from service_kit.auth import digest
from service_kit.error_interceptor import bad_request, error_info
from service_kit.security import ClientSecurity, open_channel
from service_kit.service_process import start_service

TOKENS = {"admin": ("admin", 2**31 - 1), "alice": ("user", 10), "mallory": ("user", 10),
          "inference-0": ("user", 100), "training-0": ("user", 100), "router-0": ("user", 0)}


def token_of(identity: str) -> str:
    return f"token-of-{identity}-0123456789"


@pytest.fixture(scope="module")
def stack(tmp_path_factory, tiny_models):
    root = tmp_path_factory.mktemp("hostile")
    (root / "models").mkdir()
    (root / "datasets" / "cards").mkdir(parents=True)
    (root / "outside").mkdir()
    shutil.copytree(tiny_models["zimage"], root / "models" / "tiny-zimage")
    shutil.copytree(tiny_models["zimage"], root / "outside" / "tiny-zimage")  # a real pipeline, outside the roots
    for i in range(2):
        Image.new("RGB", (64, 64), (90 * i, 40, 160)).save(root / "datasets" / "cards" / f"{i}.png")
    Image.new("RGB", (64, 64), (1, 2, 3)).save(root / "outside" / "canary.png")
    (root / "outside" / "canary.txt").write_text("CANARY CAPTION")
    tokens = root / "tokens"
    tokens.write_text("".join(f"{who} {role} {ceiling} {digest(token_of(who))}\n"
                              for who, (role, ceiling) in TOKENS.items()))
    for who in ("inference-0", "training-0", "router-0"):
        (root / f"{who}.token").write_text(token_of(who) + "\n")
    auth = ("--auth-token-file", str(tokens))
    broker = start_service("gpu_broker", "--fake-devices", "1x24GiB", *auth)
    inference = start_service("inference_service", "--broker", broker.address, "--broker-token-file",
                              str(root / "inference-0.token"), "--model-root", str(root / "models"),
                              "--compile-backend", "aot_eager", "--adapter-store", str(root / "adapters"), *auth,
                              timeout=180)
    training = start_service("training_service", "--broker", broker.address, "--broker-token-file",
                             str(root / "training-0.token"), "--model-root", str(root / "models"),
                             "--dataset-root", str(root / "datasets"), "--output-dir", str(root / "out"),
                             "--adapter-store", str(root / "adapters"), "--checkpoint-minutes", "0", *auth,
                             timeout=180)
    router = start_service("inference_router", "--worker", inference.address, "--worker-token-file",
                           str(root / "router-0.token"), *auth)
    channels = []
    addresses = {"broker": broker.address, "inference": inference.address, "training": training.address,
                 "router": router.address}

    def connect(service: str, who: str | None):
        channel = open_channel(addresses[service], ClientSecurity(token=token_of(who) if who else None), aio=False)
        channels.append(channel)
        stub = {"broker": broker_pb2_grpc.GpuBrokerServiceStub, "inference": inference_pb2_grpc.InferenceServiceStub,
                "training": training_pb2_grpc.TrainingServiceStub,
                "router": inference_pb2_grpc.InferenceServiceStub}[service]
        return stub(channel)

    yield {"root": root, "connect": connect, "address": addresses}
    for channel in channels:
        channel.close()
    for proc in (router, training, inference, broker):
        proc.stop()


def code_reason(call, *args, **kw):
    try:
        result = call(*args, **kw)
        if hasattr(result, "__iter__") and not hasattr(result, "DESCRIPTOR"):
            list(result)
    except grpc.RpcError as e:
        info = error_info(e)
        return e.code(), info.reason if info else ""
    return grpc.StatusCode.OK, ""


def load(stack, who="alice", model_id="tiny", path=None, **fields):
    stub = stack["connect"]("inference", who)
    source = common_pb2.ModelSource(local_dir=str(path or stack["root"] / "models" / "tiny-zimage"))
    return list(stub.Load(ipb.LoadRequest(model_id=model_id, source=source, **fields), timeout=120))


# ---- 1. authentication and ownership ---------------------------------------------------------------

@pytest.mark.parametrize("service, method, request_", [
    ("broker", "Status", broker_pb2.StatusRequest()),
    ("inference", "GetInferenceStatus", ipb.GetInferenceStatusRequest()),
    ("training", "ListTrainingJobs", tpb.ListTrainingJobsRequest()),
])
def test_without_a_known_token_nothing_but_health_answers(stack, service, method, request_):
    assert code_reason(getattr(stack["connect"](service, None), method), request_, timeout=10) == \
        (grpc.StatusCode.UNAUTHENTICATED, "MISSING_TOKEN")
    channel = open_channel(stack["address"][service], ClientSecurity(token="forged"), aio=False)
    stub = {"broker": broker_pb2_grpc.GpuBrokerServiceStub, "inference": inference_pb2_grpc.InferenceServiceStub,
            "training": training_pb2_grpc.TrainingServiceStub}[service](channel)
    assert code_reason(getattr(stub, method), request_, timeout=10) == (grpc.StatusCode.UNAUTHENTICATED, "BAD_TOKEN")
    channel.close()
    # Health (Check and the Watch that used to answer UNKNOWN) stays open: probes have no token.
    with grpc.insecure_channel(stack["address"][service]) as plain:
        health = health_pb2_grpc.HealthStub(plain)
        assert health.Check(health_pb2.HealthCheckRequest(), timeout=5).status == \
            health_pb2.HealthCheckResponse.SERVING
        watch = health.Watch(health_pb2.HealthCheckRequest(), timeout=5)
        assert next(iter(watch)).status == health_pb2.HealthCheckResponse.SERVING
        watch.cancel()


def test_a_lease_belongs_to_its_holder_and_priority_has_a_ceiling(stack):
    load(stack)  # alice loads; the inference service holds the lease as inference-0
    mallory = stack["connect"]("broker", "mallory")
    lease = next(l for l in mallory.Status(broker_pb2.StatusRequest(), timeout=5).state.leases
                 if l.holder.client_id == "inference-0")
    assert lease.owner == "inference-0"
    assert code_reason(mallory.Release, broker_pb2.ReleaseRequest(lease_id=lease.lease_id), timeout=5) == \
        (grpc.StatusCode.PERMISSION_DENIED, "NOT_OWNER")
    assert code_reason(mallory.Cancel, broker_pb2.CancelRequest(lease_id=lease.lease_id), timeout=5) == \
        (grpc.StatusCode.PERMISSION_DENIED, "NOT_OWNER")
    forged = broker_pb2.AcquireRequest(holder=broker_pb2.Holder(client_id="inference-0", priority=1))
    assert code_reason(mallory.Acquire, forged, timeout=5) == (grpc.StatusCode.PERMISSION_DENIED, "CLIENT_ID_NOT_BOUND")
    urgent = broker_pb2.AcquireRequest(holder=broker_pb2.Holder(client_id="mallory", priority=2**31 - 1))
    assert code_reason(mallory.Acquire, urgent, timeout=5) == (grpc.StatusCode.PERMISSION_DENIED,
                                                              "PRIORITY_ABOVE_CEILING")
    # The same ceiling holds where a service passes the caller's priority on to the broker.
    assert code_reason(load, stack, "mallory", "m2", priority=11) == (grpc.StatusCode.PERMISSION_DENIED,
                                                                      "PRIORITY_ABOVE_CEILING")
    still = mallory.Status(broker_pb2.StatusRequest(), timeout=5).state.leases
    assert [l.lease_id for l in still] == [lease.lease_id]  # nothing was disturbed


def test_a_model_and_a_generation_belong_to_their_caller(stack):
    load(stack)
    alice, mallory = stack["connect"]("inference", "alice"), stack["connect"]("inference", "mallory")
    assert code_reason(mallory.Unload, ipb.UnloadRequest(model_id="tiny"), timeout=10) == \
        (grpc.StatusCode.PERMISSION_DENIED, "NOT_OWNER")
    assert code_reason(load, stack, "mallory", "mine") == (grpc.StatusCode.PERMISSION_DENIED, "NOT_OWNER")
    call = alice.Generate(ipb.GenerateRequest(model_id="tiny", prompt="a card", width=64, height=64, steps=200,
                                              generation_id="alices"), timeout=120)
    events = iter(call)
    while next(events).WhichOneof("event") != "progress":
        pass
    assert code_reason(mallory.CancelGeneration, ipb.CancelGenerationRequest(generation_id="alices"), timeout=5) == \
        (grpc.StatusCode.NOT_FOUND, "GENERATION_NOT_FOUND")
    assert mallory.GetInferenceStatus(ipb.GetInferenceStatusRequest(), timeout=5).running_generation_id == ""
    assert alice.GetInferenceStatus(ipb.GetInferenceStatusRequest(), timeout=5).running_generation_id == "alices"
    assert alice.CancelGeneration(ipb.CancelGenerationRequest(generation_id="alices"), timeout=5).was_running
    with pytest.raises(grpc.RpcError) as e:
        list(events)
    assert e.value.code() == grpc.StatusCode.CANCELLED


def test_through_the_router_every_call_is_its_callers(stack):
    """The router checks the token itself and forwards it: a worker sees the caller, not the router."""
    assert code_reason(stack["connect"]("router", None).ListModels, ipb.ListModelsRequest(), timeout=10) == \
        (grpc.StatusCode.UNAUTHENTICATED, "MISSING_TOKEN")
    load(stack)  # alice, straight at the worker
    alice, mallory = stack["connect"]("router", "alice"), stack["connect"]("router", "mallory")
    assert code_reason(mallory.Unload, ipb.UnloadRequest(model_id="tiny"), timeout=10) == \
        (grpc.StatusCode.PERMISSION_DENIED, "NOT_OWNER")
    call = alice.Generate(ipb.GenerateRequest(model_id="tiny", prompt="a card", width=64, height=64, steps=200,
                                              generation_id="alices-routed"), timeout=120)
    events = iter(call)
    while next(events).WhichOneof("event") != "progress":
        pass
    assert code_reason(mallory.CancelGeneration, ipb.CancelGenerationRequest(generation_id="alices-routed"),
                       timeout=5) == (grpc.StatusCode.NOT_FOUND, "GENERATION_NOT_FOUND")
    assert mallory.GetInferenceStatus(ipb.GetInferenceStatusRequest(), timeout=5).running_generation_id == ""
    assert alice.GetInferenceStatus(ipb.GetInferenceStatusRequest(), timeout=5).running_generation_id == \
        "alices-routed"
    assert alice.CancelGeneration(ipb.CancelGenerationRequest(generation_id="alices-routed"), timeout=5).was_running
    with pytest.raises(grpc.RpcError) as e:
        list(events)
    assert e.value.code() == grpc.StatusCode.CANCELLED


# ---- 2. what used to answer UNKNOWN or INTERNAL ----------------------------------------------------

def test_bytes_that_do_not_parse_answer_invalid_argument_on_every_method(stack):
    garbage = b"\x0a\xff\x01"  # field 1, length 255, then one byte
    services = [("broker", broker_pb2, "GpuBrokerService"), ("inference", ipb, "InferenceService"),
                ("training", tpb, "TrainingService")]
    seen = 0
    for service, module, name in services:
        with grpc.insecure_channel(stack["address"][service]) as channel:
            admin = (("authorization", f"Bearer {token_of('admin')}"),)
            methods = [f"/diffusion.v1.{name}/{m.name}" for m in module.DESCRIPTOR.services_by_name[name].methods]
            methods += ["/grpc.health.v1.Health/Check", "/grpc.health.v1.Health/Watch"]
            for method in methods:
                streaming = method.endswith(("/Acquire", "/Watch", "/Load", "/Generate", "/WatchTraining"))
                call = (channel.unary_stream if streaming else channel.unary_unary)(method)
                with pytest.raises(grpc.RpcError) as e:
                    result = call(garbage, timeout=10, metadata=admin)
                    if streaming:
                        list(result)
                assert (e.value.code(), error_info(e.value).reason) == (grpc.StatusCode.INVALID_ARGUMENT,
                                                                       "UNPARSEABLE_REQUEST"), method
                seen += 1
    assert seen == 6 + 2 + 7 + 2 + 9 + 2


@pytest.mark.parametrize("source, code, reason", [
    (common_pb2.ModelSource(local_dir="~nosuchuser/x"), grpc.StatusCode.INVALID_ARGUMENT, "BAD_PATH"),
    (common_pb2.ModelSource(local_dir="../../.."), grpc.StatusCode.INVALID_ARGUMENT, "BAD_PATH"),
    (common_pb2.ModelSource(hub_repo=common_pb2.HubRepo(repo_id="/")), grpc.StatusCode.INVALID_ARGUMENT, "BAD_REPO_ID"),
    (common_pb2.ModelSource(hub_repo=common_pb2.HubRepo(repo_id="../etc")), grpc.StatusCode.INVALID_ARGUMENT, "BAD_REPO_ID"),
    (common_pb2.ModelSource(hub_repo=common_pb2.HubRepo(repo_id="a b/c")), grpc.StatusCode.INVALID_ARGUMENT, "BAD_REPO_ID"),
    (common_pb2.ModelSource(hub_repo=common_pb2.HubRepo(repo_id="a--b/c")), grpc.StatusCode.INVALID_ARGUMENT, "BAD_REPO_ID"),
])
def test_hostile_sources(stack, source, code, reason):
    stub = stack["connect"]("inference", "alice")
    assert code_reason(stub.Load, ipb.LoadRequest(model_id="bad", source=source), timeout=30) == (code, reason)


def test_enums_out_of_range_name_the_field(stack):
    stub = stack["connect"]("inference", "alice")
    with pytest.raises(grpc.RpcError) as e:
        list(stub.Load(ipb.LoadRequest(model_id="m", memory_mode=99, speed_mode=-5,
                                       source=common_pb2.ModelSource(local_dir="/x")), timeout=10))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert [v.field for v in bad_request(e.value).field_violations] == ["memory_mode", "speed_mode"]


def _header(meta: dict) -> bytes:
    import json

    blob = json.dumps(meta).encode()
    return len(blob).to_bytes(8, "little") + blob


@pytest.mark.parametrize("suffix, content", [
    (".safetensors", b"\x00" * 4),  # shorter than the length prefix
    (".safetensors", (2**62).to_bytes(8, "little") + b"{}"),  # a header that claims 2**62 bytes
    (".safetensors", (20).to_bytes(8, "little") + b"\xff" * 20),  # a header that is not JSON
    (".safetensors", _header({"w": {"dtype": "F32", "data_offsets": [0, 16]}}) + b"\x00" * 16),  # no shape
    (".safetensors", _header({"w": {"dtype": "F32", "shape": [4, 4], "data_offsets": [0, 64]}}) + b"\x00" * 10),
    (".safetensors", _header({"w": {"dtype": "F32", "shape": [2**40, 2**40], "data_offsets": [0, 4]}}) + b"\0" * 4),
    (".gguf", b"GGUF" + os.urandom(64)),  # the magic, then garbage
], ids=["short", "huge-header", "not-json", "no-shape", "truncated", "impossible-shape", "garbage-gguf"])
def test_corrupt_weights_are_refused_while_the_model_stays(stack, suffix, content):
    load(stack)
    bad = stack["root"] / "models" / f"bad{suffix}"
    bad.write_bytes(content)
    stub = stack["connect"]("inference", "alice")
    base = common_pb2.ModelSource(local_dir=str(stack["root"] / "models" / "tiny-zimage"))
    source = common_pb2.ModelSource(single_file=common_pb2.SingleFileCheckpoint(path=str(bad), companions=base)) \
        if suffix == ".safetensors" else common_pb2.ModelSource(gguf=common_pb2.GgufTransformer(path=str(bad), base=base))
    assert code_reason(stub.Load, ipb.LoadRequest(model_id="bad", source=source), timeout=30) == \
        (grpc.StatusCode.INVALID_ARGUMENT, "CORRUPT_WEIGHTS")
    assert [m.model_id for m in stub.ListModels(ipb.ListModelsRequest(), timeout=5).models] == ["tiny"]


def test_requests_beyond_the_models_positional_range(stack):
    ready = load(stack)[-1].result
    # The tiny Z-Image's axes_lens (256, 32, 32) with patch 2 and VAE factor 2: 128 px a side, 224 prompt tokens.
    assert (ready.limits.max_width, ready.limits.max_height, ready.limits.max_prompt_tokens) == (128, 128, 224)
    stub = stack["connect"]("inference", "alice")
    for fields, reason in [(dict(width=512, height=512), "BAD_SIZE"), (dict(prompt="b" * 200), "PROMPT_TOO_LONG")]:
        req = ipb.GenerateRequest(**{"model_id": "tiny", "prompt": "a card", "width": 64, "height": 64, "steps": 1,
                                     **fields})
        assert code_reason(stub.Generate, req, timeout=30) == (grpc.StatusCode.INVALID_ARGUMENT, reason)
    ok = ipb.GenerateRequest(model_id="tiny", prompt="b" * 170, width=128, height=128, steps=1)
    assert list(stub.Generate(ok, timeout=60))[-1].result.image_count == 1


def _png_header_only(width: int, height: int) -> bytes:
    """A PNG whose header claims width x height, with one tiny compressed row: PIL reads the size without pixels."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\x00" * 4)) + \
        chunk(b"IEND", b"")


def training_request(stack, **kw):
    return tpb.StartTrainingRequest(**{
        "family": c.FAMILY_ZIMAGE, "base": common_pb2.ModelSource(local_dir=str(stack["root"] / "models" / "tiny-zimage")),
        "dataset": tpb.Dataset(image_dir=str(stack["root"] / "datasets" / "cards"), instance_prompt="a card"),
        "rank": 4, "resolution": 64, "steps": 2, "seed": 1, **kw})


def test_dataset_bomb_and_bad_numbers(stack):
    bomb = stack["root"] / "datasets" / "bomb"
    bomb.mkdir(exist_ok=True)
    (bomb / "big.png").write_bytes(_png_header_only(20000, 20000))
    stub = stack["connect"]("training", "alice")
    req = training_request(stack, dataset=tpb.Dataset(image_dir=str(bomb), instance_prompt="x"))
    assert code_reason(stub.StartTraining, req, timeout=30) == (grpc.StatusCode.INVALID_ARGUMENT, "BAD_IMAGE")
    assert code_reason(stub.StartTraining, training_request(stack, seed=-2**63), timeout=30) == \
        (grpc.StatusCode.INVALID_ARGUMENT, "BAD_SEED")
    assert code_reason(stub.StartTraining, training_request(stack, adapter_id="nl\n"), timeout=30) == \
        (grpc.StatusCode.INVALID_ARGUMENT, "BAD_ADAPTER_ID")
    assert code_reason(load, stack, "alice", "m\n") == (grpc.StatusCode.INVALID_ARGUMENT, "BAD_MODEL_ID")


# ---- 3. unbounded strings ---------------------------------------------------------------------------

def test_long_strings_are_refused_by_size_and_never_echoed(stack):
    broker = stack["connect"]("broker", "alice")
    huge = broker_pb2.AcquireRequest(holder=broker_pb2.Holder(client_id="alice", purpose="p" * 2**20))
    with pytest.raises(grpc.RpcError) as e:
        list(broker.Acquire(huge, timeout=10))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and len(e.value.details()) < 1000
    assert [v.field for v in bad_request(e.value).field_violations] == ["holder.purpose"]
    # Beyond the server's receive limit: gRPC itself refuses, before any of our code runs.
    over = broker_pb2.AcquireRequest(holder=broker_pb2.Holder(client_id="a" * (5 * 2**20)))
    assert code_reason(broker.Acquire, over, timeout=10)[0] == grpc.StatusCode.RESOURCE_EXHAUSTED
    inference = stack["connect"]("inference", "alice")
    for call, req in [(inference.Unload, ipb.UnloadRequest(model_id="m" * 100_000)),
                      (inference.CancelGeneration, ipb.CancelGenerationRequest(generation_id="g" * 100_000))]:
        with pytest.raises(grpc.RpcError) as e:
            call(req, timeout=10)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and len(e.value.details()) < 1000
    # A NOT_FOUND quotes the id, which the edge has already bounded.
    with pytest.raises(grpc.RpcError) as e:
        inference.CancelGeneration(ipb.CancelGenerationRequest(generation_id="g" * 64), timeout=10)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND and len(e.value.details()) < 200


# ---- 5. paths -----------------------------------------------------------------------------------------

def test_paths_outside_the_roots_are_refused_before_existence_is_checked(stack):
    root = stack["root"]
    (root / "models" / "escape").symlink_to(root / "outside" / "tiny-zimage")
    answers = {code_reason(load, stack, "alice", "x", path=p)
               for p in ("/root", "/proc/self/cwd", root / "outside" / "tiny-zimage", root / "outside" / "nothing",
                         root / "models" / "escape", root / "models" / ".." / "outside" / "tiny-zimage")}
    assert answers == {(grpc.StatusCode.PERMISSION_DENIED, "PATH_NOT_ALLOWED")}  # the same, existing or not
    assert code_reason(load, stack, "alice", "x", path=root / "models" / "nothing") == \
        (grpc.StatusCode.NOT_FOUND, "MODEL_NOT_FOUND")


def test_a_caption_outside_the_dataset_roots_never_comes_back(stack):
    root = stack["root"]
    stub = stack["connect"]("training", "alice")
    outside = training_request(stack, dataset=tpb.Dataset(image_dir=str(root / "outside")))
    assert code_reason(stub.StartTraining, outside, timeout=30) == (grpc.StatusCode.PERMISSION_DENIED,
                                                                   "PATH_NOT_ALLOWED")
    linked = root / "datasets" / "linked"
    linked.mkdir()
    (linked / "canary.png").symlink_to(root / "outside" / "canary.png")
    req = training_request(stack, dataset=tpb.Dataset(image_dir=str(linked)))
    assert code_reason(stub.StartTraining, req, timeout=30) == (grpc.StatusCode.PERMISSION_DENIED, "PATH_NOT_ALLOWED")
    sidecar = root / "datasets" / "sidecar"
    sidecar.mkdir()
    Image.new("RGB", (64, 64)).save(sidecar / "canary.png")
    (sidecar / "canary.txt").symlink_to(root / "outside" / "canary.txt")
    req = training_request(stack, dataset=tpb.Dataset(image_dir=str(sidecar)))
    assert code_reason(stub.StartTraining, req, timeout=30) == (grpc.StatusCode.PERMISSION_DENIED, "PATH_NOT_ALLOWED")


# ---- 6. tenancy -------------------------------------------------------------------------------------

def test_training_jobs_belong_to_their_caller(stack):
    alice, mallory = stack["connect"]("training", "alice"), stack["connect"]("training", "mallory")
    admin = stack["connect"]("training", "admin")
    job = alice.StartTraining(training_request(stack, checkpoint_every=2), timeout=60).job_id
    assert alice.GetTrainingJob(tpb.GetTrainingJobRequest(job_id=job), timeout=5).job.owner == "alice"
    for call, req in [(mallory.GetTrainingJob, tpb.GetTrainingJobRequest(job_id=job)),
                      (mallory.StopTraining, tpb.StopTrainingRequest(job_id=job)),
                      (mallory.DeleteTrainingJob, tpb.DeleteTrainingJobRequest(job_id=job)),
                      (mallory.WatchTraining, tpb.WatchTrainingRequest(job_id=job))]:
        assert code_reason(call, req, timeout=10) == (grpc.StatusCode.NOT_FOUND, "JOB_NOT_FOUND")
    assert job not in [j.job_id for j in mallory.ListTrainingJobs(tpb.ListTrainingJobsRequest(), timeout=5).jobs]
    resume = training_request(stack, resume_job_id=job)
    assert code_reason(mallory.StartTraining, resume, timeout=30) == (grpc.StatusCode.NOT_FOUND, "JOB_NOT_FOUND")
    events = list(alice.WatchTraining(tpb.WatchTrainingRequest(job_id=job), timeout=120))
    assert events[-1].finished.state == tpb.TRAINING_JOB_STATE_SUCCEEDED
    # The step-2 checkpoint is the final one: it is not written (and announced) twice.
    assert [e.checkpoint.step for e in events if e.WhichOneof("event") == "checkpoint"] == [2]
    assert alice.GetTrainingJob(tpb.GetTrainingJobRequest(job_id=job), timeout=5).job.train_time.ToNanoseconds() > 0
    assert job in [j.job_id for j in admin.ListTrainingJobs(tpb.ListTrainingJobsRequest(), timeout=5).jobs]
    second = alice.StartTraining(training_request(stack), timeout=60).job_id
    list(alice.WatchTraining(tpb.WatchTrainingRequest(job_id=second), timeout=120))
    first_page = alice.ListTrainingJobs(tpb.ListTrainingJobsRequest(page_size=1), timeout=5)
    assert [j.job_id for j in first_page.jobs] == [second] and first_page.next_page_token
    rest = alice.ListTrainingJobs(tpb.ListTrainingJobsRequest(page_size=1, page_token=first_page.next_page_token),
                                  timeout=5)
    assert [j.job_id for j in rest.jobs] == [job] and not rest.next_page_token
    adapter = events[-1].finished.adapter_id
    assert code_reason(mallory.DeleteAdapter, tpb.DeleteAdapterRequest(adapter_id=adapter), timeout=5) == \
        (grpc.StatusCode.PERMISSION_DENIED, "NOT_OWNER")
    assert alice.DeleteTrainingJob(tpb.DeleteTrainingJobRequest(job_id=job), timeout=5).job.job_id == job
    assert code_reason(alice.GetTrainingJob, tpb.GetTrainingJobRequest(job_id=job), timeout=5) == \
        (grpc.StatusCode.NOT_FOUND, "JOB_NOT_FOUND")
    assert not (stack["root"] / "out" / "jobs" / job).exists()


def test_a_truncated_training_base_is_refused_before_any_lease(stack):
    base = stack["root"] / "models" / "truncated-zimage"
    if not base.exists():
        shutil.copytree(stack["root"] / "models" / "tiny-zimage", base)
        weights = next((base / "transformer").glob("*.safetensors"))
        weights.write_bytes(weights.read_bytes()[:-64])
    broker = stack["connect"]("broker", "admin")
    # An earlier test's job may still be giving its lease back after its stream ended: wait until it has.
    deadline = time.monotonic() + 30
    while True:
        state = broker.Status(broker_pb2.StatusRequest(), timeout=5).state
        if not state.queue and all(lease.owner != "training-0" for lease in state.leases):
            break
        assert time.monotonic() < deadline, state
        time.sleep(0.05)
    before = state.sequence
    stub = stack["connect"]("training", "alice")
    req = training_request(stack, base=common_pb2.ModelSource(local_dir=str(base)))
    assert code_reason(stub.StartTraining, req, timeout=30) == (grpc.StatusCode.INVALID_ARGUMENT, "CORRUPT_WEIGHTS")
    assert broker.Status(broker_pb2.StatusRequest(), timeout=5).state.sequence == before  # no lease was asked for
