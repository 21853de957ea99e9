"""Cancellation before every model call: a cancel during the prompt encode skips the denoiser, one after the
last step skips the VAE decode (both used to run: the check sat at step boundaries only)."""
import pytest

from diffusion_kit.families import FAMILIES
from inference_service.generation import GenerationSpec, RunControl, run
from service_kit.errors import Cancelled


@pytest.fixture(scope="module")
def pipe(tiny_models):
    import diffusers

    pipe = diffusers.ZImagePipeline.from_pretrained(str(tiny_models["zimage"]))
    pipe.set_progress_bar_config(disable=True)
    return pipe


def spec(steps=3):
    return GenerationSpec("m", "a card", "", 64, 64, steps, 0.0, (1,), (), 0, None, ())


def calls(pipe):
    seen = {"transformer": 0, "decoder": 0}  # calls that ran to the end
    handles = [pipe.transformer.register_forward_hook(lambda *_: seen.__setitem__("transformer", seen["transformer"] + 1)),
               pipe.vae.decoder.register_forward_hook(lambda *_: seen.__setitem__("decoder", seen["decoder"] + 1))]
    return seen, handles


def test_a_cancel_during_the_prompt_encode_skips_the_denoiser(pipe):
    control = RunControl()
    seen, handles = calls(pipe)
    hook = pipe.text_encoder.register_forward_hook(lambda *_: control.stop("caller went away"))
    try:
        with pytest.raises(Cancelled, match="before the transformer call"):
            run(pipe, FAMILIES["zimage"], spec(), control, lambda r: None, lambda p: None, True)
    finally:
        hook.remove()
        for h in handles:
            h.remove()
    assert seen == {"transformer": 0, "decoder": 0}


def test_a_cancel_after_the_last_step_skips_the_decode(pipe):
    control = RunControl()
    seen, handles = calls(pipe)

    def on_step(report):
        if report.step == report.total:
            control.stop("deadline expired")

    try:
        with pytest.raises(Cancelled, match="before the vae decode call"):
            run(pipe, FAMILIES["zimage"], spec(), control, on_step, lambda p: None, True)
    finally:
        for h in handles:
            h.remove()
    assert seen == {"transformer": 3, "decoder": 0}
