"""Partial gradient checkpointing: which requests are refused, and that checkpointing one block call in every N
changes which activations are kept, never the gradients."""
import math

import pytest
import torch

from diffusion_kit.families import FAMILIES
from service_kit.errors import InvalidArgument
from training_service.checkpoint_interval import MAX_INTERVAL, EveryNthBlockCall, checked_interval
from training_service.denoiser_setup import load_denoiser


@pytest.mark.parametrize("checkpointing, asked, runs", [
    (False, 0, 1), (True, 0, 1), (True, 1, 1), (True, 3, 3), (True, MAX_INTERVAL, MAX_INTERVAL),
])
def test_the_interval_a_request_runs(checkpointing, asked, runs):
    assert checked_interval(checkpointing, asked) == runs


@pytest.mark.parametrize("checkpointing, asked, says", [
    (False, 2, "applies only with gradient_checkpointing=true"),
    (False, 1, "applies only with gradient_checkpointing=true"),
    (True, -1, f"between 0 and {MAX_INTERVAL}"),
    (True, MAX_INTERVAL + 1, f"between 0 and {MAX_INTERVAL}"),
])
def test_an_interval_that_cannot_apply_is_refused(checkpointing, asked, says):
    with pytest.raises(InvalidArgument) as e:
        checked_interval(checkpointing, asked)
    assert e.value.reason == "BAD_VALUE" and says in str(e.value)


def _grads_and_counter(base_dir, family, interval):
    """One forward and backward of the tiny denoiser with checkpointing one block call in every `interval`
    (0: no checkpointing); the LoRA gradients, and the function that checkpointed."""
    denoiser = load_denoiser(FAMILIES[family], str(base_dir), "fp32", "cpu", rank=4, alpha=4, seed=0,
                             gradient_checkpointing=interval > 0, checkpoint_interval=max(1, interval),
                             compile_backend=None)
    model = denoiser.model
    counter = model._gradient_checkpointing_func if interval > 1 else None
    torch.manual_seed(1)
    cfg = model.config
    tokens, text = 16, 8
    latents = torch.randn(1, tokens, cfg.in_channels)
    out = model(hidden_states=latents, encoder_hidden_states=torch.randn(1, text, cfg.joint_attention_dim),
                pooled_projections=torch.randn(1, cfg.pooled_projection_dim), timestep=torch.tensor([0.5]),
                img_ids=torch.zeros(tokens, 3), txt_ids=torch.zeros(text, 3),
                guidance=torch.tensor([3.5]) if cfg.guidance_embeds else None, return_dict=False)[0]
    out.square().mean().backward()
    return [p.grad.clone() for p in denoiser.params], counter, cfg


@pytest.mark.parametrize("interval", [2, 3])
def test_one_block_call_in_every_n_is_checkpointed_and_the_gradients_do_not_change(tiny_models, interval):
    plain, _, cfg = _grads_and_counter(tiny_models["flux1"], "flux1", 0)
    every, _, _ = _grads_and_counter(tiny_models["flux1"], "flux1", 1)
    partial, counter, _ = _grads_and_counter(tiny_models["flux1"], "flux1", interval)
    calls = cfg.num_layers + cfg.num_single_layers
    assert isinstance(counter, EveryNthBlockCall)
    assert (counter.calls, counter.checkpointed) == (calls, math.ceil(calls / interval))
    for a, b, c in zip(plain, every, partial):
        torch.testing.assert_close(b, a)
        torch.testing.assert_close(c, a)
