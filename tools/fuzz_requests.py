"""Fuzzes every method of the three services with requests built from their descriptors, and counts the answers.

    python -m tools.fuzz_requests --cases 10000 --out docs/bench/fuzz.jsonl

Starts a broker, an inference service (with a tiny Z-Image loaded, so Generate reaches the model)
and a training service on loopback, then sends each method hypothesis-drawn requests: valid, edge
and hostile values, enum numbers the proto does not define, huge strings and lists, hostile paths,
and raw bytes that are no message at all. Every answer's status code is counted; UNKNOWN or
INTERNAL is a bug. tests/test_fuzz.py runs the same strategies, fewer of them, in `make test`.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import grpc
from google.protobuf.descriptor import FieldDescriptor
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

# Streams that never end by themselves (a lease is held, a watch is live): their first event is the answer.
ENDLESS = ("/diffusion.v1.GpuBrokerService/Acquire", "/diffusion.v1.GpuBrokerService/Watch")
HOSTILE_STRINGS = ["", " ", "/", "/root", "/proc/self/cwd", "../../..", "~nosuchuser/x", "~/", "/etc/passwd",
                   "a\n", "nl\n", "\x00", "a b/c", "../etc", "owner/name", "tiny-org/tiny-zimage", "C:\\\\x",
                   "%s%s%n", "' OR 1=1 --", "\u202e\u0000\ud7ff", "🦙" * 3, "job-000000000000", "lease-x", "req-x"]
EDGE_INTS = [0, 1, -1, 2, 16, 64, 128, 200, 201, 4096, 4097, 2**31 - 1, -2**31, 2**63 - 1, -2**63]
BIG_SIZES = [129, 257, 4097, 70_000, 1_000_000]


def string_strategy(extra: list[str]) -> st.SearchStrategy:
    big = st.builds(lambda n, ch: ch * n, st.sampled_from(BIG_SIZES), st.sampled_from(["a", "é", "🦙", "\n"]))
    return st.one_of(st.sampled_from(HOSTILE_STRINGS + extra), st.text(max_size=40), big)


def int_strategy(fd: FieldDescriptor) -> st.SearchStrategy:
    signed64 = fd.type in (FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_SINT64, FieldDescriptor.TYPE_SFIXED64)
    lo, hi = (-2**63, 2**63 - 1) if signed64 else (-2**31, 2**31 - 1)
    return st.one_of(st.sampled_from([v for v in EDGE_INTS if lo <= v <= hi]), st.integers(lo, hi),
                     st.integers(-20, 300))


def message_strategy(desc, extra: list[str], depth: int = 3) -> st.SearchStrategy:
    """Messages of type `desc`, each field present or not, with values from the strategies above."""
    if depth <= 0:
        return st.just({})
    fields = {}
    for fd in desc.fields:
        if fd.message_type is not None:
            if fd.message_type.full_name == "google.protobuf.Duration":
                one = st.builds(lambda s, n: {"seconds": s, "nanos": n}, st.integers(-10**12, 10**12),
                                st.integers(-2 * 10**9, 2 * 10**9))
            else:
                one = message_strategy(fd.message_type, extra, depth - 1)
        elif fd.type == FieldDescriptor.TYPE_STRING:
            one = string_strategy(extra)
        elif fd.type == FieldDescriptor.TYPE_BYTES:
            one = st.binary(max_size=64)
        elif fd.type == FieldDescriptor.TYPE_BOOL:
            one = st.booleans()
        elif fd.type in (FieldDescriptor.TYPE_FLOAT, FieldDescriptor.TYPE_DOUBLE):
            one = st.floats(width=32 if fd.type == FieldDescriptor.TYPE_FLOAT else 64)
        elif fd.type == FieldDescriptor.TYPE_ENUM:
            one = st.one_of(st.sampled_from([v.number for v in fd.enum_type.values]), st.integers(-5, 120))
        else:
            one = int_strategy(fd)
        if fd.is_repeated:
            # A few of anything, or many small ones (past every count limit).
            many = st.just("w") if fd.type == FieldDescriptor.TYPE_STRING else \
                st.just({}) if fd.message_type is not None else one
            one = st.one_of(st.lists(one, max_size=4), st.lists(many, min_size=17, max_size=1000))
        fields[fd.name] = st.one_of(st.none(), one)
    return st.fixed_dictionaries(fields).map(lambda d: {k: v for k, v in d.items() if v is not None})


def build(cls, values: dict):
    """A message from drawn values; a value the message type cannot hold (a oneof's second member) is dropped."""
    msg = cls()
    for name, value in values.items():
        fd = cls.DESCRIPTOR.fields_by_name[name]
        try:
            if fd.message_type is not None and not fd.is_repeated:
                if fd.message_type.full_name == "google.protobuf.Duration":
                    getattr(msg, name).seconds, getattr(msg, name).nanos = value["seconds"], value["nanos"]
                else:
                    getattr(msg, name).CopyFrom(build(fd.message_type._concrete_class, value))
            elif fd.message_type is not None:
                getattr(msg, name).extend(build(fd.message_type._concrete_class, v) for v in value)
            elif fd.is_repeated:
                getattr(msg, name).extend(value)
            else:
                setattr(msg, name, value)
        except (ValueError, TypeError, OverflowError):
            continue  # e.g. a nanos a Duration cannot hold: protobuf refuses it on our side, no request is sent
    return msg


def call_once(channel, method: str, streaming: bool, payload: bytes, timeout: float = 5.0) -> str:
    """The status of one call with `payload` as its serialized request; a stream is read for a few events.

    A stream gets a second to end; one that never ends by itself (ENDLESS) is cancelled after its first event."""
    identity = lambda b: b  # noqa: E731
    stub = (channel.unary_stream if streaming else channel.unary_unary)(method, request_serializer=identity,
                                                                         response_deserializer=identity)
    try:
        result = stub(payload, timeout=1.0 if streaming else timeout)
        if streaming:
            for i, _ in enumerate(result):
                if method in ENDLESS or i >= 20:
                    result.cancel()
                    return "OK"
        return "OK"
    except grpc.RpcError as e:
        return e.code().name


def services(address: dict[str, str]):
    """(address, full method name, request class, streaming) for every method of the services (the router
    answers the InferenceService API in front of the inference service)."""
    from diffusion.v1 import broker_pb2, inference_pb2, training_pb2

    out = []
    for key, module, name in (("broker", broker_pb2, "GpuBrokerService"), ("inference", inference_pb2,
                                                                          "InferenceService"),
                              ("training", training_pb2, "TrainingService"),
                              ("router", inference_pb2, "InferenceService")):
        for m in module.DESCRIPTOR.services_by_name[name].methods:
            out.append((key, address[key], f"/{m.containing_service.full_name}/{m.name}",
                        m.input_type._concrete_class, m.server_streaming))
    return out


def fuzz_method(channel, method: str, cls, streaming: bool, cases: int, counts: Counter, extra: list[str],
                seed: int = 0) -> None:
    """`cases` drawn requests for one method (a tenth of them raw bytes), their answers added to `counts`."""
    from hypothesis import seed as fix_seed

    @fix_seed(seed)
    @settings(max_examples=cases, deadline=None, database=None, derandomize=False,
              suppress_health_check=list(HealthCheck))
    @given(values=message_strategy(cls.DESCRIPTOR, extra), raw=st.one_of(st.none(), st.none(), st.none(),
                                                                          st.binary(max_size=64)))
    def one(values, raw):
        payload = raw if raw is not None else build(cls, values).SerializeToString()
        counts[call_once(channel, method, streaming, payload)] += 1

    one()


def start_stack(workdir: Path):
    """Broker, inference (a tiny Z-Image loaded as 'tiny'), training and a router in front of the inference
    service, roots inside `workdir`."""
    from diffusion.v1 import common_pb2
    from diffusion.v1 import inference_pb2 as ipb
    from diffusion.v1 import inference_pb2_grpc
    from demos.tiny_pipelines import save_tiny_pipeline
    from service_kit.service_process import start_service

    models, data = workdir / "models", workdir / "datasets"
    data.mkdir(parents=True, exist_ok=True)
    model_dir = models / "tiny-zimage"
    if not (model_dir / "model_index.json").exists():
        save_tiny_pipeline("zimage", model_dir)
    broker = start_service("gpu_broker", "--fake-devices", "1x24GiB", "--log-level", "ERROR")
    inference = start_service("inference_service", "--broker", broker.address, "--model-root", str(models),
                              "--compile-backend", "aot_eager", "--adapter-store", str(workdir / "adapters"),
                              "--log-level", "ERROR", timeout=180)
    training = start_service("training_service", "--broker", broker.address, "--model-root", str(models),
                             "--dataset-root", str(data), "--output-dir", str(workdir / "out"), "--adapter-store",
                             str(workdir / "adapters"), "--log-level", "ERROR", timeout=180)
    with grpc.insecure_channel(inference.address) as channel:
        list(inference_pb2_grpc.InferenceServiceStub(channel).Load(
            ipb.LoadRequest(model_id="tiny", source=common_pb2.ModelSource(local_dir=str(model_dir))), timeout=120))
    router = start_service("inference_router", "--worker", inference.address, "--log-level", "ERROR")
    return [broker, inference, training, router], [str(model_dir), str(data), "tiny"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.fuzz_requests", description=__doc__.splitlines()[0])
    p.add_argument("--cases", type=int, default=10_000, help="requests per service, spread over its methods")
    p.add_argument("--out", type=Path, help="append one JSON line per service here")
    p.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "fuzz-requests")
    args = p.parse_args(argv)
    procs, extra = start_stack(args.workdir)
    address = dict(zip(("broker", "inference", "training", "router"), (p.address for p in procs)))
    try:
        per_service: dict[str, Counter] = {}
        seconds: dict[str, float] = {}
        methods = services(address)
        for key in ("broker", "inference", "training", "router"):
            t0 = time.perf_counter()
            mine = [m for m in methods if m[0] == key]
            counts = per_service.setdefault(key, Counter())
            with grpc.insecure_channel(address[key]) as channel:
                for i, (_, _, method, cls, streaming) in enumerate(mine):
                    share = args.cases // len(mine) + (1 if i < args.cases % len(mine) else 0)
                    fuzz_method(channel, method, cls, streaming, share, counts, extra, seed=i)
            seconds[key] = round(time.perf_counter() - t0, 1)
            print(json.dumps({"service": key, "cases": sum(counts.values()), "codes": dict(counts)}), flush=True)
        bad = {k: {c: n for c, n in v.items() if c in ("UNKNOWN", "INTERNAL")} for k, v in per_service.items()}
        if args.out:
            import subprocess

            commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                    cwd=Path(__file__).resolve().parent.parent).stdout.strip()
            with open(args.out, "a") as f:
                for key, counts in per_service.items():
                    f.write(json.dumps({"bench": "fuzz", "service": key, "cases": sum(counts.values()),
                                        "codes": dict(sorted(counts.items())),
                                        "unknown_or_internal": sum(bad[key].values()),
                                        "seconds": seconds[key], "commit": commit,
                                        "host": "CPU, 2 cores (no GPU); services on loopback",
                                        "command": "python -m tools.fuzz_requests " + " ".join(argv or sys.argv[1:]),
                                        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}) + "\n")
        return 1 if any(bad.values()) else 0
    finally:
        for proc in reversed(procs):
            proc.stop()


if __name__ == "__main__":
    sys.exit(main())
