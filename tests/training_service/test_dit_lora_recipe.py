"""The DiT LoRA recipe on a tiny Z-Image, in-process on the CPU: loss, resume bit-identity, export."""
import pytest
import torch
from PIL import Image

from diffusion_kit.adapter_store import WEIGHTS, AdapterInfo, AdapterStore
from training_service.dit_lora_recipe import DiTLoraRecipe, RecipeConfig


@pytest.fixture(scope="module")
def examples(tmp_path_factory):
    root = tmp_path_factory.mktemp("recipe-data")
    out = []
    for i in range(3):
        path = root / f"img{i}.png"
        Image.new("RGB", (80, 64), (60 * i, 120, 30 + 40 * i)).save(path)
        out.append((str(path), f"a colour card number {i}"))
    return out


def config(tiny_models, examples, **kw):
    return RecipeConfig(**{"family": "zimage", "base_dir": str(tiny_models["zimage"]), "examples": examples, "rank": 4,
                           "alpha": 4.0, "learning_rate": 1e-3, "steps": 6, "resolution": 64, "seed": 7,
                           "warmup_steps": 2, **kw})


def run(cfg, events=None, resume_from=None, stop_after=None):
    recipe = DiTLoraRecipe(cfg, emit=(lambda kind, data: events.append((kind, data))) if events is not None
                           else (lambda kind, data: None))
    recipe.setup()
    if resume_from:
        recipe.load_checkpoint(resume_from)
    stop = (lambda: recipe.state.step >= stop_after) if stop_after else (lambda: False)
    recipe.train(should_stop=stop)
    return recipe


def test_phased_setup_and_one_event_per_step(tiny_models, examples):
    events = []
    recipe = run(config(tiny_models, examples), events)
    phases = [d["phase"] for k, d in events if k == "phase"]
    assert phases == ["encoding_text", "caching_latents", "loading_transformer"]
    steps = [d for k, d in events if k == "step"]
    assert [s["step"] for s in steps] == [1, 2, 3, 4, 5, 6]
    assert all(torch.isfinite(torch.tensor(s["loss"])) and s["grad_norm"] >= 0 for s in steps)
    assert steps[0]["lr"] == pytest.approx(1e-3)  # warmup factor after the first step: 2/2
    b_weights = [v for k, v in recipe.lora_state().items() if "lora_B" in k]
    assert any(v.abs().sum() > 0 for v in b_weights)  # the adapter learned something


def test_resume_is_bit_identical(tiny_models, examples, tmp_path):
    straight = run(config(tiny_models, examples))
    first = run(config(tiny_models, examples), stop_after=3)
    checkpoint = first.save_checkpoint(tmp_path / "ckpt")
    resumed = run(config(tiny_models, examples), resume_from=checkpoint)
    assert resumed.state.losses == straight.state.losses
    a, b = straight.lora_state(), resumed.lora_state()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_checkpoint_of_another_run_is_refused(tiny_models, examples, tmp_path):
    checkpoint = run(config(tiny_models, examples, steps=2)).save_checkpoint(tmp_path / "ckpt")
    other = DiTLoraRecipe(config(tiny_models, examples, steps=2, rank=8))
    other.setup()
    with pytest.raises(ValueError, match="rank"):
        other.load_checkpoint(checkpoint)


def test_exported_adapter_changes_the_image_and_weight_zero_is_base(tiny_models, examples, tmp_path):
    from diffusers import ZImagePipeline

    recipe = run(config(tiny_models, examples))
    exported = recipe.export_adapter(tmp_path / "export")
    store = AdapterStore(tmp_path / "store")
    store.publish(AdapterInfo("trained", "zimage", str(tiny_models["zimage"]), 4, 4.0, {}, steps=6, resolution=64),
                  exported / WEIGHTS)
    pipe = ZImagePipeline.from_pretrained(tiny_models["zimage"])
    pipe.set_progress_bar_config(disable=True)

    def image():
        return pipe("a colour card", height=64, width=64, num_inference_steps=2,
                    generator=torch.Generator().manual_seed(3), output_type="np").images[0]

    base = image()
    pipe.load_lora_weights(str(store.path("trained")), weight_name=WEIGHTS, adapter_name="trained")
    pipe.set_adapters(["trained"], adapter_weights=[1.0])
    assert not (image() == base).all()
    pipe.set_adapters(["trained"], adapter_weights=[0.0])
    assert (image() == base).all()
