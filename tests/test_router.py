"""The router: which worker a call goes to (a table), and beyond one host: two brokers with fake 2x80 GiB
inventories, four inference workers, two training services and a router in front of the workers, all real
processes on loopback, exporting their traces to a stand-in OTLP collector."""
from __future__ import annotations

import concurrent.futures
import threading

import grpc
import pytest

from diffusion.v1 import common_pb2
from diffusion.v1 import inference_pb2 as pb
from diffusion.v1 import training_pb2 as tpb
from diffusion.v1 import training_pb2_grpc
from diffusion_client.errors import ClientError
from inference_router.servicer import WORKER_HEADER
from inference_router.worker_choice import Refusal, WorkerView, for_generate, for_load
from service_kit.server_runtime import CLIENT_OPTIONS
from service_kit.service_process import start_service
from tests.datasets import write_cards
from tests.gpu_broker.harness import BrokerClientSync
from tests.inference_service.harness import InferenceClient, result_of
from tests.otlp_collector import Collector
from tests.service_flags import TRAINING_ROOTS
from tests.training_service.jobs_helper import request as training_request

A, B, C = "a:1", "b:1", "c:1"


def pick(result):
    return result.reason if isinstance(result, Refusal) else result.address


@pytest.mark.parametrize("workers, model, expected", [
    # the one worker with the model
    ([WorkerView(A, frozenset({"z"})), WorkerView(B, frozenset({"f"}))], "z", A),
    # of two with it, the one with fewer calls in flight
    ([WorkerView(A, frozenset({"z"}), in_flight=2), WorkerView(B, frozenset({"z"}), in_flight=1)], "z", B),
    # equally busy: the one picked longer ago
    ([WorkerView(A, frozenset({"z"}), last_picked=5), WorkerView(B, frozenset({"z"}), last_picked=3)], "z", B),
    # an unreachable holder is skipped
    ([WorkerView(A, frozenset({"z"}), reachable=False), WorkerView(B, frozenset({"z"}), in_flight=9)], "z", B),
    # nobody has it: load it first
    ([WorkerView(A, frozenset({"f"})), WorkerView(B)], "z", "MODEL_NOT_LOADED"),
    # its only holder stopped answering: retry, do not load
    ([WorkerView(A, frozenset({"z"}), reachable=False), WorkerView(B)], "z", "WORKER_UNAVAILABLE"),
])
def test_generate_goes_to_the_least_busy_worker_with_the_model(workers, model, expected):
    assert pick(for_generate(workers, model)) == expected


def test_a_generate_is_not_sent_twice_to_a_worker_that_failed_it():
    workers = [WorkerView(A, frozenset({"z"})), WorkerView(B, frozenset({"z"}), in_flight=3)]
    assert pick(for_generate(workers, "z", exclude=frozenset({A}))) == B
    assert pick(for_generate(workers, "z", exclude=frozenset({A, B}))) == "WORKER_UNAVAILABLE"


def test_not_loaded_names_what_is_loaded():
    refusal = for_generate([WorkerView(A, frozenset({"f"})), WorkerView(B, frozenset({"s"})),
                            WorkerView(C, frozenset({"q"}), reachable=False)], "z")
    assert "(loaded: f, s)" in refusal.message


@pytest.mark.parametrize("workers, model, expected", [
    # a worker that has it reloads or replaces it
    ([WorkerView(A), WorkerView(B, frozenset({"z"}))], "z", B),
    # a new model goes to a free worker, never over another model
    ([WorkerView(A, frozenset({"f"})), WorkerView(B)], "z", B),
    # a worker with a load under way is not free
    ([WorkerView(A, loading="f"), WorkerView(B, in_flight=4)], "z", B),
    # ...but a second load of the same model joins it there
    ([WorkerView(A, loading="z"), WorkerView(B)], "z", A),
    # every worker holds a model: refused, nobody evicted
    ([WorkerView(A, frozenset({"f"})), WorkerView(B, loading="s")], "z", "NO_FREE_WORKER"),
    # free but unreachable is not free
    ([WorkerView(A, frozenset({"f"})), WorkerView(B, reachable=False)], "z", "NO_FREE_WORKER"),
    ([WorkerView(A, reachable=False)], "z", "WORKER_UNAVAILABLE"),
])
def test_load_goes_to_the_holder_or_a_free_worker(workers, model, expected):
    assert pick(for_load(workers, model)) == expected


def _call_error(fn) -> ClientError:
    with pytest.raises(grpc.RpcError) as info:
        fn()
    return ClientError.from_rpc(info.value)


def _generate_via(router: InferenceClient, model_id: str) -> tuple[str, pb.GenerateResult]:
    call = router.stub.Generate(pb.GenerateRequest(model_id=model_id, prompt="a red cube", width=64, height=64,
                                                   steps=2), timeout=120)
    events = list(call)
    worker = dict(call.initial_metadata())[WORKER_HEADER]
    return worker, result_of(events).result


@pytest.mark.timeout(600)  # eleven processes on two cores: two minutes alone, more beside other test files
def test_two_hosts_four_workers_two_trainers_behind_one_router(tiny_models, tmp_path):
    data = write_cards(tmp_path / "data", size=(72, 64), count=2)
    started = []
    collector = Collector()

    def start(module, *args, **kw):
        proc = start_service(module, *args, timeout=180, env=collector.env(), **kw)
        started.append(proc)
        return proc

    try:
        hosts = {h: start("gpu_broker", "--fake-devices", "2x80GiB") for h in ("host-a", "host-b")}
        brokers = {h: BrokerClientSync(p.address) for h, p in hosts.items()}
        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            worker_futures = {f"{h}/{i}": pool.submit(start, "inference_service", "--broker", hosts[h].address,
                                                      "--client-id", f"inference-{h}-{i}",
                                                      *InferenceClient.TEST_FLAGS)
                              for h in hosts for i in (0, 1)}
            trainer_futures = {h: pool.submit(start, "training_service", *TRAINING_ROOTS, "--broker",
                                              hosts[h].address, "--client-id", f"training-{h}", "--output-dir",
                                              str(tmp_path / h / "out"), "--adapter-store",
                                              str(tmp_path / h / "adapters"))
                               for h in hosts}
            workers = {name: f.result() for name, f in worker_futures.items()}
            trainers = {h: f.result() for h, f in trainer_futures.items()}
        router_proc = start("inference_router", "--refresh", "0.5",
                            *[a for w in workers.values() for a in ("--worker", w.address)])
        router = InferenceClient(router_proc.address)
        direct = {name: InferenceClient(w.address) for name, w in workers.items()}

        # Loads through the router fill free workers; the same model loaded straight on a second worker is a
        # replica the router then spreads over. Device 1 of host-b is asked for explicitly.
        placed = {}
        for model_id, extra in (("z", {}), ("s", {}), ("q", {"device_index": 1})):
            call = router.stub.Load(pb.LoadRequest(model_id=model_id, source=common_pb2.ModelSource(
                local_dir=str(tiny_models["zimage"])), **extra), timeout=300)
            events = list(call)
            assert events[-1].phase == pb.LOAD_PHASE_READY
            placed[model_id] = dict(call.initial_metadata())[WORKER_HEADER]
        assert len(set(placed.values())) == 3
        spare = next(name for name, w in workers.items() if w.address not in placed.values())
        assert direct[spare].load("z", tiny_models["zimage"])[-1].phase == pb.LOAD_PHASE_READY

        refused = _call_error(lambda: list(router.stub.Load(pb.LoadRequest(
            model_id="f", source=common_pb2.ModelSource(local_dir=str(tiny_models["zimage"]))), timeout=60)))
        assert refused.code == grpc.StatusCode.FAILED_PRECONDITION and refused.reason == "NO_FREE_WORKER"

        missing = _call_error(lambda: _generate_via(router, "nope"))
        assert missing.code == grpc.StatusCode.FAILED_PRECONDITION and missing.reason == "MODEL_NOT_LOADED"
        assert "(loaded: q, s, z)" in missing.message

        # A training job on each host, while generations run through the router.
        trainer_stubs = {}
        jobs = {}
        for h, proc in trainers.items():
            channel = grpc.insecure_channel(proc.address, options=CLIENT_OPTIONS)
            trainer_stubs[h] = training_pb2_grpc.TrainingServiceStub(channel)
            jobs[h] = trainer_stubs[h].StartTraining(training_request(
                tiny_models, {"data": data}, steps=2, resolution=64)).job_id
        served = []
        lock = threading.Lock()

        def generate_z():
            worker, result = _generate_via(router, "z")
            with lock:
                served.append(worker)
            return result

        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            results = list(pool.map(lambda _: generate_z(), range(6)))
        assert all(r.image_count == 1 for r in results)
        replicas = {placed["z"], workers[spare].address}
        assert set(served) == replicas, served  # both replicas took generations

        # Every lease is on the device it names, and no device is granted beyond its memory.
        finished = {h: list(trainer_stubs[h].WatchTraining(tpb.WatchTrainingRequest(job_id=jobs[h]), timeout=180))
                    for h in hosts}
        for h, events in finished.items():
            assert events[-1].finished.state == tpb.TRAINING_JOB_STATE_SUCCEEDED, events[-1]
            granted = [e.phase.message for e in events if "granted device" in e.phase.message]
            assert granted, f"{h}: the job never said its device"
        for h, broker in brokers.items():
            status = broker.status()
            capacity = {d.index: d.total_bytes for d in status.devices}
            used = {}
            for lease in status.leases:
                used[lease.device_index] = used.get(lease.device_index, 0) + lease.memory_bytes
            assert all(used[d] <= capacity[d] for d in used), (h, used, capacity)
            assert len({lease.lease_id for lease in status.leases}) == len(status.leases)
            for name, client in direct.items():
                if not name.startswith(h):
                    continue
                mine = [x for x in status.leases if x.holder.client_id == f"inference-{name.replace('/', '-')}"]
                for model in client.status().models:
                    [lease] = mine
                    assert lease.device_index == model.device_index, (name, lease, model)
        q_worker = next(name for name, w in workers.items() if w.address == placed["q"])
        assert [m.device_index for m in direct[q_worker].status().models] == [1]

        # A replica's worker dies: the router takes the next generation to the other one.
        victim = next(name for name, w in workers.items() if w.address == placed["z"])
        workers[victim].stop(__import__("signal").SIGKILL)
        worker, result = _generate_via(router, "z")
        assert worker == workers[spare].address and result.image_count == 1

        # Unload through the router reaches the worker that has the model; the router's readiness follows.
        assert router.stub.Unload(pb.UnloadRequest(model_id="s"), timeout=60).freed_bytes >= 0
        gone = _call_error(lambda: _generate_via(router, "s"))
        assert gone.reason == "MODEL_NOT_LOADED"
        # A worker's refusal reaches the caller as the worker said it, its ErrorInfo included.
        outside = _call_error(lambda: list(router.stub.Load(pb.LoadRequest(
            model_id="x", source=common_pb2.ModelSource(local_dir="/usr/share")), timeout=60)))
        assert outside.code == grpc.StatusCode.PERMISSION_DENIED and outside.reason == "PATH_NOT_ALLOWED"

        _one_trace_per_call_spanning_the_broker(collector)
    finally:
        for proc in reversed(started):
            proc.stop()
        collector.stop()


def _one_trace_per_call_spanning_the_broker(collector: Collector) -> None:
    """Each Load, Generate and StartTraining is one trace: the router's span, the worker's and the broker's."""
    SERVER = 2

    def traces_with(*wanted: tuple[str, str]):
        def found(spans):
            by_trace = {}
            for s in spans:
                if s.kind == SERVER:
                    by_trace.setdefault(s.trace_id, set()).add((s.service, s.name.rsplit("/", 1)[-1]))
            return [t for t, names in by_trace.items() if set(wanted) <= names]
        return found

    load = traces_with(("inference_router", "Load"), ("inference_service", "Load"), ("gpu_broker", "Acquire"))
    generate = traces_with(("inference_router", "Generate"), ("inference_service", "Generate"))
    train = traces_with(("training_service", "StartTraining"), ("gpu_broker", "Acquire"))
    spans = collector.wait_for(lambda spans: load(spans) and generate(spans) and len(train(spans)) == 2)
    assert len(generate(spans)) >= 6  # one trace per Generate, never one shared by several
