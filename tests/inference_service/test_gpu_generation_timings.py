"""A generation on CUDA, where the host queues work faster than the GPU runs it: the host stays at most one step
ahead, so each step's progress report comes when the GPU has run the step before it, a cancel leaves at most one
step queued, and the denoise time ends when the GPU has run the last step (the decode time is the decoder's own)."""
import pytest

from diffusion_kit.families import FAMILIES
from inference_service import generation

pytestmark = pytest.mark.gpu

STEPS = 4


def _sleep_cycles_for(ms: float) -> int:
    """GPU clock cycles that torch.cuda._sleep spins for about `ms` milliseconds on this device."""
    import torch

    cycles = 100_000_000
    torch.cuda._sleep(1000)  # the first call loads the kernel
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    return int(cycles * ms / start.elapsed_time(end))


def _slow_pipeline(tiny_models, step_ms: float):
    """The tiny Z-Image on CUDA, each denoiser call queueing about `step_ms` of GPU work and returning at once."""
    import diffusers
    import torch

    pipe = diffusers.ZImagePipeline.from_pretrained(str(tiny_models["zimage"])).to("cuda")
    pipe.set_progress_bar_config(disable=True)
    cycles = _sleep_cycles_for(step_ms)
    forward = pipe.transformer.forward

    def slow_forward(*args, **kwargs):
        torch.cuda._sleep(cycles)
        return forward(*args, **kwargs)

    pipe.transformer.forward = slow_forward
    return pipe


def _run(pipe, steps: int, on_step=lambda _: None, control=None):
    spec = generation.GenerationSpec("m", "a red kite", "", 64, 64, steps, 0.0, (5,), (), "png", None, ())
    return generation.run(pipe, FAMILIES["zimage"], spec, control or generation.RunControl(), on_step,
                          lambda _: None, inference_mode=True)


def test_progress_comes_as_the_gpu_runs_the_steps_and_a_cancel_leaves_one_queued(tiny_models):
    import time

    import torch

    from service_kit.errors import Cancelled

    step_ms, steps = 60.0, 6
    pipe = _slow_pipeline(tiny_models, step_ms)
    _run(pipe, 2)  # the first call on the device pays its libraries' set-up
    reports = []
    _run(pipe, steps, reports.append)
    # step k is reported once step k-1 has run (unpaced, the host reported steps the GPU had not begun)
    for report in reports:
        assert report.elapsed_s >= 0.8 * (report.step - 1) * step_ms / 1000, [(r.step, r.elapsed_s) for r in reports]
    control = generation.RunControl()
    stop = lambda report: report.step == 2 and control.stop("the test cancels")  # noqa: E731
    with pytest.raises(Cancelled):
        _run(pipe, steps, stop, control)
    raised = time.perf_counter()
    torch.cuda.synchronize()
    # what the cancel left queued: the third step (unpaced: every step the host had run ahead to)
    assert time.perf_counter() - raised < 1.5 * step_ms / 1000


def test_denoise_time_ends_when_the_gpu_ran_the_last_step(tiny_models):
    step_ms = 60.0
    pipe = _slow_pipeline(tiny_models, step_ms)
    _run(pipe, 2)  # the first call on the device pays its libraries' set-up
    out = _run(pipe, STEPS)
    # before the wait, the host queued the last steps and returned: denoise 122 ms, decode 124 ms (an H100)
    assert out.denoise_s >= 0.8 * STEPS * step_ms / 1000, (out.denoise_s, out.decode_s)
    assert out.decode_s < step_ms / 1000, (out.denoise_s, out.decode_s)
