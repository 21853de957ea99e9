"""A compile that fails falls back to the uncompiled model, said in the record, instead of failing the Load.

On the H200 (torch 2.11) inductor could not lower FLUX's blocks under the compiled loads' tracing flags, and every
compiled FLUX Load failed (INTERNAL) although the model itself was sound. Now only the compiler's own failures
are caught (compile_failed), the blocks and the decoder run their own forward again, and the record says why."""
import pytest
import torch

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
    assert pipeline_builder.compile_failed(error) == from_the_compiler


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
