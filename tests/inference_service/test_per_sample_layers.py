"""The registry's per-sample layers are exactly the Linear layers that see one row per sample.

int8 quantises those weight-only (its dynamic-activation matmul needs more than 16 rows), so a
layer missing from the list crashes a compiled int8 load, and a per-token layer on it loses speed.
Recorded by running each family's tiny pipeline (the real classes, so the real layer names).
"""
import pytest
import torch

from diffusion_kit.families import FAMILIES


def rows_seen_per_linear(pipeline_dir, spec) -> dict[str, int]:
    import diffusers

    pipe = getattr(diffusers, spec.pipeline_class).from_pretrained(str(pipeline_dir))
    pipe.set_progress_bar_config(disable=True)
    denoiser = getattr(pipe, spec.denoiser)
    rows: dict[str, int] = {}
    for name, module in denoiser.named_modules():
        if isinstance(module, torch.nn.Linear):
            module.register_forward_pre_hook(
                lambda mod, args, name=name: rows.__setitem__(name, max(rows.get(name, 0),
                                                                        args[0].numel() // args[0].shape[-1])))
    # Real CFG runs the negative prompt as a second sample, so one image is at most two rows per sample layer.
    pipe(prompt="a red cube", num_inference_steps=1, width=128, height=128, **{spec.guidance_kwarg: 2.0})
    return rows


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_per_sample_linears_match_what_the_denoiser_does(tiny_models, family):
    spec = FAMILIES[family]
    rows = rows_seen_per_linear(tiny_models[family], spec)
    assert len(rows) > 10
    wrong = {name: n for name, n in rows.items() if spec.is_per_sample(name) != (n <= 2)}
    assert not wrong, f"{family}: per_sample_linears misclassifies these layers (rows seen): {wrong}"
    assert any(spec.is_per_sample(name) for name in rows)
