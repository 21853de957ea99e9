"""The edge's request limits: the walk itself (tables), and that every request field of the three services is
bounded, fits the server's receive limit, and is documented in the proto comments."""
import re
from pathlib import Path

import pytest

from diffusion.v1 import broker_pb2, common_pb2, inference_pb2, training_pb2
from gpu_broker.request_rules import RULES as BROKER_RULES
from inference_service.request_rules import RULES as INFERENCE_RULES
from service_kit.request_limits import Limit, Rules, check, largest_request_bytes, unbounded_fields
from service_kit.server_runtime import HEALTH_RULES, MAX_REQUEST_BYTES
from training_service.request_rules import RULES as TRAINING_RULES

SERVICES = [
    (broker_pb2.DESCRIPTOR.services_by_name["GpuBrokerService"], BROKER_RULES),
    (inference_pb2.DESCRIPTOR.services_by_name["InferenceService"], INFERENCE_RULES),
    (training_pb2.DESCRIPTOR.services_by_name["TrainingService"], TRAINING_RULES),
]


def violations(message, table):
    return [(v.field, v.reason) for v in check(message, table)]


@pytest.mark.parametrize("message, expected", [
    # A forged huge client id and purpose: both named, neither echoed.
    (broker_pb2.AcquireRequest(holder=broker_pb2.Holder(client_id="x" * 129, purpose="p" * 257)),
     [("holder.client_id", ""), ("holder.purpose", "")]),
    (broker_pb2.AcquireRequest(holder=broker_pb2.Holder(client_id="inference-0")), []),
    (broker_pb2.AcquireRequest(holder=broker_pb2.Holder(client_id="a b")), [("holder.client_id", "")]),
    (broker_pb2.AcquireRequest(), [("holder", "MISSING_CLIENT_ID")]),
    # Enum numbers the proto does not define, both signs (they used to reach MemoryMode.Name and raise).
    (inference_pb2.LoadRequest(model_id="m", memory_mode=99, speed_mode=-5),
     [("memory_mode", "UNKNOWN_ENUM_VALUE"), ("speed_mode", "UNKNOWN_ENUM_VALUE")]),
    # '$' accepted a trailing newline; the edge matches the whole value.
    (inference_pb2.LoadRequest(model_id="m\n"), [("model_id", "BAD_MODEL_ID")]),
    (inference_pb2.LoadRequest(model_id="m", source=common_pb2.ModelSource(
        hub_repo=common_pb2.HubRepo(repo_id="../etc"))), [("source.hub_repo.repo_id", "BAD_REPO_ID")]),
    (inference_pb2.LoadRequest(model_id="m", source=common_pb2.ModelSource(
        hub_repo=common_pb2.HubRepo(repo_id="a b/c"))), [("source.hub_repo.repo_id", "BAD_REPO_ID")]),
    (inference_pb2.LoadRequest(model_id="m", source=common_pb2.ModelSource(
        hub_repo=common_pb2.HubRepo(repo_id="/"))), [("source.hub_repo.repo_id", "BAD_REPO_ID")]),
    (inference_pb2.GenerateRequest(model_id="m", prompt="p", seeds=[1] * 17), [("seeds", "")]),
    (inference_pb2.GenerateRequest(model_id="m", prompt="p", adapters=[inference_pb2.AdapterRef(adapter_id="nl\n")]),
     [("adapters[0].adapter_id", "BAD_ADAPTER_ID")]),
    (inference_pb2.GenerateRequest(model_id="m", prompt="x" * 4097, output_format=7),
     [("prompt", ""), ("output_format", "UNKNOWN_ENUM_VALUE")]),
    (training_pb2.StartTrainingRequest(seed=-2**63), [("seed", "BAD_SEED")]),
    (training_pb2.StartTrainingRequest(trigger_words=["w"] * 17), [("trigger_words", "BAD_VALUE")]),
    (training_pb2.StartTrainingRequest(trigger_words=["w" * 65]), [("trigger_words[0]", "BAD_VALUE")]),
    (training_pb2.StartTrainingRequest(learning_rate=float("nan")), [("learning_rate", "BAD_VALUE")]),
    (training_pb2.StartTrainingRequest(adapter_id="nl\n"), [("adapter_id", "BAD_ADAPTER_ID")]),
    (training_pb2.StartTrainingRequest(dataset=training_pb2.Dataset(image_dir="/x\x00y")),
     [("dataset.image_dir", "")]),
    (training_pb2.ListTrainingJobsRequest(page_size=101), [("page_size", "")]),
])
def test_violations(message, expected):
    table = {"broker": BROKER_RULES, "inference": INFERENCE_RULES, "training": TRAINING_RULES}[
        {"broker_pb2": "broker", "inference_pb2": "inference", "training_pb2": "training"}[
            type(message).__module__.rsplit(".", 1)[-1]]]
    assert violations(message, table) == expected


def test_durations_and_oneofs():
    table = {"diffusion.v1.CancelRequest": Rules(required_oneofs=("target",))}
    assert violations(broker_pb2.CancelRequest(), table) == [("target", "")]
    req = broker_pb2.AcquireRequest()
    req.release_grace.seconds, req.release_grace.nanos = 1, 2_000_000_000
    assert ("release_grace", "") in violations(req, {})
    assert Limit(max_len=8, required=True).describe() == "required; at most 8 characters"


@pytest.mark.parametrize("service, table", SERVICES, ids=lambda x: getattr(x, "name", ""))
def test_every_request_field_is_bounded(service, table):
    missing = []
    for method in service.methods:
        missing += unbounded_fields(method.input_type, table)
    assert missing == []


@pytest.mark.parametrize("service, table", SERVICES, ids=lambda x: getattr(x, "name", ""))
def test_largest_valid_request_fits_the_receive_limit(service, table):
    for method in service.methods:
        assert largest_request_bytes(method.input_type, table) < MAX_REQUEST_BYTES, method.name
    assert not unbounded_fields(
        __import__("grpc_health.v1.health_pb2", fromlist=["x"]).HealthCheckRequest.DESCRIPTOR, HEALTH_RULES)


def _comments() -> dict[str, str]:
    """'<Message>.<field>' -> the comment above it in proto/diffusion/v1/*.proto."""
    out = {}
    for path in sorted(Path("proto/diffusion/v1").glob("*.proto")):
        message, comment = None, []
        for line in path.read_text().splitlines():
            stripped = line.strip()
            if m := re.match(r"message (\w+) \{", stripped):
                message, comment = m.group(1), []
            elif stripped.startswith("//"):
                comment.append(stripped[2:].strip())
            elif m := re.match(r"(?:optional |repeated )?[\w.]+ (\w+) = \d+;", stripped):
                if message:
                    out[f"{message}.{m.group(1)}"] = " ".join(comment)
                comment = []
            else:
                comment = []
    return out


def test_every_limit_is_in_the_proto_comments():
    comments = _comments()
    missing = []
    for table in (BROKER_RULES, INFERENCE_RULES, TRAINING_RULES):
        for type_name, rules in table.items():
            message = type_name.rsplit(".", 1)[-1]
            for name, limit in rules.fields.items():
                text = comments.get(f"{message}.{name}", "").replace(",", "")
                for number in (limit.max_len, limit.max_items, limit.max):
                    if number is not None and str(int(number)) not in text:
                        missing.append(f"{message}.{name}: {number}")
    assert missing == []
