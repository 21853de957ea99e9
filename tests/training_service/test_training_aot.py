"""The blocks' training graphs compiled ahead of time (--aot-blocks): the first job compiles and saves them, a later
job of the same base and settings loads them instead of tracing again, and both train as the regular compile and
eager training do. A backend whose graphs cannot be saved trains with the regular compile and says why."""
import re

import grpc
import pytest

from diffusion.v1 import common_pb2 as c
from diffusion.v1 import training_pb2 as pb
from diffusion.v1 import training_pb2_grpc
from service_kit.server_runtime import CLIENT_OPTIONS
from service_kit.service_process import start_service
from tests.service_flags import TRAINING_ROOTS
from tests.training_service.jobs_helper import request
from tests.training_service.test_lora_recipe import config, examples, register_backend_once, run  # noqa: F401

pytestmark = pytest.mark.slow  # run first (tests/conftest.py): the workers then finish together


def job(stub, tiny_models, dirs, adapter_id, **kw):
    job_id = stub.StartTraining(request(tiny_models, dirs, steps=3, adapter_id=adapter_id, **kw)).job_id
    events = list(stub.WatchTraining(pb.WatchTrainingRequest(job_id=job_id), timeout=300))
    assert events[-1].finished.state == pb.TRAINING_JOB_STATE_SUCCEEDED, events[-1].finished.message
    records = [r for e in events[1:] if e.WhichOneof("event") == "resolved" for r in e.resolved.resolved]
    return [e.step.loss for e in events if e.WhichOneof("event") == "step"], records


def test_a_second_job_loads_the_graphs_the_first_compiled_and_trains_alike(tiny_models, dirs, tmp_path):
    proc = start_service("training_service", *TRAINING_ROOTS, "--output-dir", str(tmp_path / "out"),
                         "--adapter-store", str(tmp_path / "adapters"), "--compile-backend", "inductor",
                         "--compile-cache-dir", str(tmp_path / "compile"), "--aot-blocks",
                         timeout=180)
    channel = grpc.insecure_channel(proc.address, options=CLIENT_OPTIONS)
    stub = training_pb2_grpc.TrainingServiceStub(channel)
    try:
        eager, eager_records = job(stub, tiny_models, dirs, "eager")
        first, first_records = job(stub, tiny_models, dirs, "first", speed_mode=c.SPEED_MODE_DEFAULT)
        second, second_records = job(stub, tiny_models, dirs, "second", speed_mode=c.SPEED_MODE_DEFAULT)
    finally:
        channel.close()
        proc.stop()
    assert not [r for r in eager_records if r.control == "compile_ahead_of_time"]
    [compiled] = [r for r in first_records if r.control == "compile_ahead_of_time"]
    [loaded] = [r for r in second_records if r.control == "compile_ahead_of_time"]
    assert "compiled and saved" in compiled.applied and compiled.status == c.SETTING_STATUS_APPLIED, compiled
    assert "loaded from disk" in loaded.applied and loaded.status == c.SETTING_STATUS_APPLIED, loaded
    assert (tmp_path / "compile" / "aot-blocks").is_dir()
    assert len(first) == 3 and second == pytest.approx(first, rel=1e-5)
    assert first == pytest.approx(eager, rel=1e-4)


def test_graphs_that_cannot_be_saved_train_with_the_regular_compile_and_say_why(tiny_models, examples, tmp_path):  # noqa: F811
    register_backend_once("unsaveable_training", lambda gm, example_inputs: gm.forward)  # runs; cannot be saved
    eager = run(config(tiny_models, examples, steps=3)).state.losses
    said = []
    for attempt in range(2):
        events = []
        recipe = run(config(tiny_models, examples, steps=3, compile=True, compile_backend="unsaveable_training",
                            aot_dir=str(tmp_path / "aot")), events)
        [record] = [r for k, d in events if k == "resolved" for r in d["resolved"]]
        assert (record["control"], record["status"]) == ("compile_ahead_of_time", "SETTING_STATUS_FELL_BACK")
        assert "regular regional compile" in record["reason"]
        assert recipe.compiled and recipe.aot is None
        assert recipe.state.losses == pytest.approx(eager, rel=1e-4)
        said.append(record["reason"])
    assert "an earlier load could not" not in said[0] and "an earlier load could not" in said[1]  # remembered


def test_every_bucket_gets_its_graphs_and_a_later_job_adds_the_shapes_it_lacks(tiny_models, examples,  # noqa: F811
                                                                               tmp_path):
    """A graph traced on one bucket's shapes did not cover another bucket's: its steps ran every block eagerly.
    Now the warm-up runs one micro-batch of each bucket and batch size, and no step runs a block eagerly. A later
    job of other shapes (batch size 2: micro-batches of two) loaded those graphs and ran its block calls eagerly
    for the whole job; now its warm-up runs on the loaded graphs, the calls they miss get graphs saved beside
    them, and a third job of those shapes loads them all. (aot_eager: guards are dynamo's, whatever the backend.)"""
    eager_losses = {}

    def job(batch_size: int) -> str:
        kw = {"buckets": True, "batch_size": batch_size, "steps": 4}
        events = []
        recipe = run(config(tiny_models, examples, compile=True, compile_backend="aot_eager", aot_dir=str(tmp_path),
                            **kw), events)
        records = [r for k, d in events if k == "resolved" for r in d["resolved"]]
        assert [r["applied"] for r in records if "ran eagerly" in r["applied"]] == []
        assert len({recipe.examples[recipe.plan.at(i)[0]].bucket for i in range(4)}) > 1  # the steps met several
        if batch_size not in eager_losses:
            eager_losses[batch_size] = run(config(tiny_models, examples, **kw)).state.losses
        assert recipe.state.losses == pytest.approx(eager_losses[batch_size], rel=1e-4)
        [record] = [r for r in records if r["control"] == "compile_ahead_of_time"]
        return record["applied"]

    assert "compiled and saved" in job(1)
    extended = job(2)
    assert re.fullmatch(r"\d+ graph\(s\) compiled and saved, \d+ loaded in .*", extended), extended
    assert list(tmp_path.glob("*/extra-*/meta.json"))
    assert "loaded from disk" in job(2)


def test_graphs_are_traced_in_the_context_the_calls_run_in(tmp_path):
    """Training's forward runs under autocast; graphs traced, or loaded, outside it guard autocast off, so on the
    GPU every block call of every step ran eagerly. Traced and loaded in the calls' context, they cover the calls
    (here CPU autocast)."""
    import torch

    from diffusion_kit import aot_blocks

    torch.manual_seed(0)
    block = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.GELU()).requires_grad_(False)
    block[0].weight.requires_grad_(True)
    x = torch.randn(4, 32)

    def context():
        return torch.autocast("cpu", dtype=torch.bfloat16)

    def capture():
        with context():
            block(x)

    with context():
        expected = block(x)
    env = aot_blocks.environment("cpu", {"test": "autocast"})
    aot = aot_blocks.install_modules([block], tmp_path, env, capture, "inductor", {}, fallback=lambda: None,
                                     grad=True, context=context)
    with context():
        out = block(x)
    out.float().sum().backward()
    assert aot.take_misses() == 0 and out.dtype == torch.bfloat16
    assert torch.allclose(out.float(), expected.float(), atol=1e-2) and block[0].weight.grad is not None
    # loaded from disk (as a later job does), the graph's guards are rebuilt in that context too
    loaded = aot_blocks.install_modules([block], tmp_path, env, capture, "inductor", {}, fallback=lambda: None,
                                        grad=True, context=context)
    with context():
        again = block(x)
    assert loaded.loaded == 1 and loaded.take_misses() == 0, loaded.how()
    assert torch.equal(again, out)


def test_partially_checkpointed_blocks_keep_graphs_of_their_own_and_train_as_eager(tiny_models, examples,  # noqa: F811
                                                                                  tmp_path):
    """One block call in two checkpointed: the blocks run both inside a checkpoint (and again in its recompute)
    and outside one. Their graphs, kept apart from every-block checkpointing's, cover every call of both jobs:
    the first compiles and saves them, the second loads them, and both train as the eager job does."""
    kw = {"steps": 3, "gradient_checkpointing": True, "checkpoint_interval": 2}
    eager = run(config(tiny_models, examples, **kw)).state.losses
    applied = []
    for _ in range(2):
        events = []
        recipe = run(config(tiny_models, examples, compile=True, compile_backend="aot_eager", aot_dir=str(tmp_path),
                            **kw), events)
        records = [r for k, d in events if k == "resolved" for r in d["resolved"]]
        assert [r["applied"] for r in records if "ran eagerly" in r["applied"]] == []
        [record] = [r for r in records if r["control"] == "compile_ahead_of_time"]
        applied.append(record["applied"])
        assert recipe.state.losses == pytest.approx(eager, rel=1e-4)
    assert "compiled and saved" in applied[0] and "loaded from disk" in applied[1], applied
    every = run(config(tiny_models, examples, compile=True, compile_backend="aot_eager", aot_dir=str(tmp_path),
                       **{**kw, "checkpoint_interval": 1}), events := [])
    [record] = [r for k, d in events if k == "resolved" for r in d["resolved"]
                if r["control"] == "compile_ahead_of_time"]
    assert "compiled and saved" in record["applied"] and every.compiled  # not the interval's graphs
