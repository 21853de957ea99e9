"""A compile that fails falls back to the uncompiled model, said in the record, instead of failing the Load.

On the H200 (torch 2.11) inductor could not lower FLUX's blocks under the compiled loads' tracing flags, and every
compiled FLUX Load failed (INTERNAL) although the model itself was sound. Now only the compiler's own failures
are caught (compile_failed), the blocks and the decoder run their own forward again, and the record says why."""
import pytest
import torch

from diffusion_kit.compile_errors import compile_failed
from inference_service import pipeline_builder
from service_kit.errors import Cancelled
from tests.inference_service.test_aot_blocks import _build


class FromTheModel(RuntimeError):
    pass


def _inductor_error():
    from torch._inductor.exc import InductorError

    return InductorError(KeyError("unbacked_bindings"), None)


def _wrapped(outer: BaseException, inner: BaseException) -> BaseException:
    outer.__cause__ = inner
    return outer


def _in_handling(outer: BaseException, handled: BaseException) -> BaseException:
    outer.__context__ = handled
    return outer


@pytest.mark.parametrize("error, from_the_compiler", [
    (_inductor_error(), True),
    (_wrapped(RuntimeError("while lowering"), _inductor_error()), True),
    (torch._dynamo.exc.Unsupported("graph break"), True),
    (FromTheModel("shape mismatch in the block"), False),
    (torch.OutOfMemoryError("CUDA out of memory"), False),
    (Cancelled("load aborted during compiling", reason="LOAD_ABORTED"), False),
    (_wrapped(Cancelled("load aborted", reason="LOAD_ABORTED"), _inductor_error()), False),  # a cancel is a cancel
    (_in_handling(FromTheModel("raised in an except block"), _inductor_error()), False),
    (ValueError("a bad size"), False),
])
def test_only_the_compilers_own_failures_count(error, from_the_compiler):
    assert compile_failed(error) == from_the_compiler


def _register_failing_backend() -> str:
    from torch._dynamo import list_backends, register_backend

    if "fails_to_compile" not in list_backends(exclude_tags=()):
        def fails(gm, example_inputs):
            raise RuntimeError("this backend cannot compile any graph")
        register_backend(name="fails_to_compile")(fails)
    return "fails_to_compile"


@pytest.mark.parametrize("ahead_of_time", [False, True])
def test_a_failing_compile_runs_the_model_uncompiled_and_says_why(tiny_models, tmp_path, ahead_of_time):
    backend = _register_failing_backend()
    built = _build(tiny_models, tmp_path / "aot" if ahead_of_time else "", backend)
    try:
        records = {r.control: r for r in built.resolved}
        compiled = records["compile"]
        assert compiled.status.name == "FELL_BACK" and compiled.applied == "off", compiled
        assert "this backend cannot compile any graph" in compiled.reason and "runs uncompiled" in compiled.reason
        assert "compile_warmup" not in records and "compile_ahead_of_time" not in records
        assert [r.control for r in built.resolved].count("compile") == 1
        speed = built.plan.speed
        assert not speed.compile and speed.inference_mode and built.aot is None
        denoiser = built.pipe.transformer
        assert all(getattr(m, "_compiled_call_impl", None) is None for m in denoiser.modules())
        assert all("forward" not in m.__dict__ for m in denoiser.modules())
        with torch.inference_mode():  # and it generates
            out = built.pipe(prompt="a kite", height=64, width=64, num_inference_steps=1, guidance_scale=0.0,
                             output_type="latent").images
        assert torch.isfinite(out).all()
    finally:
        pipeline_builder.unload(built)


PLUGIN = '''
import os


def compiler(gm, example_inputs):
    if os.path.exists(os.environ["FAILS_LATER_SENTINEL"]):
        raise RuntimeError("this backend no longer compiles")
    return gm.forward
'''


def test_a_generation_whose_new_graph_fails_to_compile_runs_it_uncompiled_and_says_so(tiny_models, tmp_path):
    """A compiled model's first adapter traces its blocks again; when the compiler fails then, the generation ran
    into INTERNAL (and so would every later one needing a graph). Now the model stops tracing new graphs, the
    generation runs again with the calls its graphs do not cover uncompiled, and the record says so. The failing
    compiler is a real dynamo backend, installed as a plugin (the torch_dynamo_backends entry point)."""
    from diffusion.v1 import common_pb2 as c
    from diffusion.v1 import inference_pb2 as pb
    from diffusion_kit.adapter_store import AdapterStore
    from service_kit.service_process import start_service
    from tests.inference_service.harness import InferenceClient, result_of
    from tests.inference_service.lora_helper import publish_random_adapter
    from tests.inference_service.test_aot_blocks import FLAGS, pixels

    plugin = tmp_path / "plugin"
    plugin.mkdir()
    (plugin / "fails_later_backend.py").write_text(PLUGIN)
    info = plugin / "fails_later-0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fails-later\nVersion: 0\n")
    (info / "entry_points.txt").write_text("[torch_dynamo_backends]\nfails_later = fails_later_backend:compiler\n")
    sentinel = tmp_path / "fail-now"
    store = AdapterStore(tmp_path / "adapters")
    publish_random_adapter(store, "zimage", tiny_models["zimage"], "z-style", seed=1)
    env = {"PYTHONPATH": str(plugin), "FAILS_LATER_SENTINEL": str(sentinel)}
    proc = start_service("inference_service", *FLAGS, "--compile-backend", "fails_later", "--compile-cache-dir",
                         str(tmp_path / "cache"), "--adapter-store", str(store.root), env=env, fresh=True,
                         timeout=180)
    client = InferenceClient(proc.address)
    try:
        loaded = {r.control: r for r in client.load("z", tiny_models["zimage"],
                                                    speed_mode=c.SPEED_MODE_DEFAULT)[-1].result.resolved}
        assert loaded["compile"].status == c.SETTING_STATUS_APPLIED, loaded["compile"]
        first = client.generate("z", seeds=[3])
        base = pixels(result_of(first))
        sentinel.write_text("")
        styled = pb.AdapterRef(adapter_id="z-style", weight=1.0)
        events = client.generate("z", seeds=[3], adapters=[styled])
        adapted = result_of(events)
        # the steps the stream reports are the run that made the image: the second, counted from 1
        runs = lambda stream: [(e.progress.attempt, e.progress.step) for e in stream if e.HasField("progress")]  # noqa: E731
        steps = len(runs(first))
        assert steps and runs(first) == [(1, k) for k in range(1, steps + 1)]
        assert runs(events)[-steps:] == [(2, k) for k in range(1, steps + 1)], runs(events)
        said = {r.control: r for r in adapted.result.resolved}["compile"]
        assert said.status == c.SETTING_STATUS_FELL_BACK and said.applied == "compiled graphs only", said
        assert "this backend no longer compiles" in said.reason and "run uncompiled" in said.reason
        assert not pixels(adapted).tolist() == base.tolist()  # the adapter reached the image
        client.load("z-off", tiny_models["zimage"], speed_mode=c.SPEED_MODE_OFF)
        eager = pixels(result_of(client.generate("z-off", seeds=[3], adapters=[styled])))
        assert abs(pixels(adapted) - eager).max() <= 2  # the uncovered calls ran as the eager model runs them
    finally:
        client.close()
        proc.stop()


def test_unload_gives_the_process_its_dynamo_stance_back():
    """stop_tracing sets a process-wide stance; a later load must trace again (backend_flags restores it)."""
    from inference_service import backend_flags

    before = backend_flags.snapshot()
    assert before.dynamo_stance == "default"
    try:
        torch.compiler.set_stance("eager_on_recompile")
        assert backend_flags.snapshot().dynamo_stance == "eager_on_recompile"
    finally:
        backend_flags.restore(before)
    assert backend_flags.snapshot().dynamo_stance == "default"
