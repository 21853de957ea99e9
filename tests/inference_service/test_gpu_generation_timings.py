"""A generation's timings on CUDA, where the host queues work and runs ahead of the GPU: the denoise time ends when
the GPU has run the last step, not when the host queued it, so the decode time is the decoder's own."""
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


def test_denoise_time_ends_when_the_gpu_ran_the_last_step(tiny_models):
    import diffusers
    import torch

    pipe = diffusers.ZImagePipeline.from_pretrained(str(tiny_models["zimage"])).to("cuda")
    pipe.set_progress_bar_config(disable=True)
    step_ms = 60.0
    cycles = _sleep_cycles_for(step_ms)
    forward = pipe.transformer.forward

    def slow_forward(*args, **kwargs):  # each call queues ~60 ms of GPU work and returns at once
        torch.cuda._sleep(cycles)
        return forward(*args, **kwargs)

    pipe.transformer.forward = slow_forward
    spec = generation.GenerationSpec("m", "a red kite", "", 64, 64, STEPS, 0.0, (5,), (), "png", None, ())
    run = lambda: generation.run(pipe, FAMILIES["zimage"], spec, generation.RunControl(),  # noqa: E731
                                 lambda _: None, lambda _: None, inference_mode=True)
    run()  # the first call on the device pays its libraries' set-up
    out = run()
    # before the wait, the host queued all four steps in a few milliseconds: denoise ~0 s, decode ~0.24 s
    assert out.denoise_s >= 0.8 * STEPS * step_ms / 1000, (out.denoise_s, out.decode_s)
    assert out.decode_s < step_ms / 1000, (out.denoise_s, out.decode_s)
