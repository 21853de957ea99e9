"""The low_vram tier's model moves: which models stay (a table), and the moves on real tiny pipelines.

Without a GPU the "device" is the CPU: every move still makes a separate device copy and every move off still
drops or copies back, so what is checked here (pixels, which models stay, host copies kept and not copied
back, changed weights and adapters kept) is the same code the GPU runs; page-locking is the GPU test's
(tests/inference_service/test_gpu_modes.py).
"""
import numpy as np
import pytest
import torch

from diffusion_kit.adapter_store import AdapterStore
from diffusion_kit.resolved import Status
from inference_service.model_residency import evictions, weights_budget
from inference_service.pinned_offload import PinnedOffload, moves_record, unswappable
from inference_service.prompt_cache import PromptCache
from tests.inference_service.lora_helper import publish_random_adapter


@pytest.mark.parametrize("resident, incoming, budget, out", [
    ([], 10, 100, []),
    ([("vae", 1), ("transformer", 60)], 30, 100, []),  # fits beside both
    ([("vae", 1), ("transformer", 60)], 40, 100, ["vae"]),  # least recently used goes first, even if small
    ([("transformer", 60), ("vae", 1)], 40, 100, ["transformer"]),
    ([("a", 30), ("b", 30), ("c", 30)], 50, 100, ["a", "b"]),
    ([("a", 30), ("b", 30)], 200, 100, ["a", "b"]),  # larger than the budget alone: placed alone
    ([("a", 30)], 70, 100, []),  # exactly full
])
def test_what_moves_off_for_a_model_to_fit(resident, incoming, budget, out):
    assert evictions(resident, incoming, budget) == out


def test_the_budget_leaves_room_beside_the_largest_for_the_small_ones():
    flux_transformer, flux_vae, flux_clip = int(22.2 * 2**30), int(0.16 * 2**30), int(0.23 * 2**30)
    budget = weights_budget(flux_transformer)
    assert flux_transformer + flux_vae + flux_clip <= budget < flux_transformer + int(9.5 * 2**30)  # not T5 too


def pipeline(path):
    import diffusers

    pipe = diffusers.ZImagePipeline.from_pretrained(str(path))
    pipe.set_progress_bar_config(disable=True)
    return pipe


def render(pipe, prompt="a red kite", seed=3):
    with torch.inference_mode():
        out = pipe(prompt=prompt, height=64, width=64, num_inference_steps=2, guidance_scale=0.0,
                   generator=torch.Generator("cpu").manual_seed(seed), output_type="np").images
    return np.asarray(out)


def offloaded(path, budget=None):
    pipe = pipeline(path)
    models = {n: m for n, m in pipe.components.items() if isinstance(m, torch.nn.Module)}
    offload = PinnedOffload(models, "cpu", budget, pin=False)
    offload.attach()
    return pipe, offload


def host_pointers(model):
    return {name: t.data_ptr() for name, t in model.named_parameters()}


def test_models_that_fit_stay_and_a_repeated_prompt_moves_nothing(tiny_models):
    reference = render(pipeline(tiny_models["zimage"]))
    pipe, offload = offloaded(tiny_models["zimage"])
    sizes = offload.model_bytes()
    assert set(sizes) == {"vae", "text_encoder", "transformer"}
    # as on a large model: room for the denoiser and the VAE, not the text encoder too
    offload.budget_bytes = sizes["transformer"] + sizes["vae"]
    PromptCache(max_bytes=2**20).install(pipe)
    hosts = host_pointers(pipe.transformer)

    assert np.array_equal(render(pipe), reference)
    moves = offload.take()
    assert moves.names == ["text_encoder", "transformer", "vae"] and moves.copied_back == 0
    assert moves.bytes == sum(sizes.values())
    assert offload.resident() == ["transformer", "vae"]  # the text encoder, least recently used, made room
    assert all(t.data_ptr() != hosts[n] for n, t in pipe.transformer.named_parameters())  # a device copy

    assert np.array_equal(render(pipe), reference)  # the prompt's embeddings are reused: nothing moves
    assert offload.take().names == [] and offload.resident() == ["transformer", "vae"]
    assert np.array_equal(render(pipe, prompt="a blue kite"), render(pipeline(tiny_models["zimage"]), "a blue kite"))
    # a new prompt: the transformer, least recently used, makes room for the text encoder and comes back
    # (the VAE, least recently used by then, making room for it)
    assert offload.take().names == ["text_encoder", "transformer", "vae"]
    assert offload.resident() == ["transformer", "vae"]


def test_one_model_at_a_time_moves_each_on_once_and_copies_nothing_back(tiny_models):
    reference = render(pipeline(tiny_models["zimage"]))
    pipe, offload = offloaded(tiny_models["zimage"], budget=1)
    hosts = host_pointers(pipe.transformer)
    for _ in range(2):
        assert np.array_equal(render(pipe), reference)
        moves = offload.take()
        assert moves.names == ["text_encoder", "transformer", "vae"] and moves.copied_back == 0
        assert offload.resident() == ["vae"]
    # off the device, the transformer holds its load-time host tensors again: no copy was made to move it off
    assert host_pointers(pipe.transformer) == hosts
    record = moves_record(moves)
    assert record.control == "model_moves" and record.applied.startswith("text_encoder, transformer, vae: ")


def test_a_weight_changed_on_the_device_is_copied_back_and_kept(tiny_models):
    pipe, offload = offloaded(tiny_models["zimage"], budget=1)
    offload.bring("transformer")
    weight = next(pipe.transformer.parameters())
    with torch.no_grad():
        weight.add_(1.0)
    changed = weight.detach().clone()
    offload.bring("vae")  # moves the transformer off
    assert offload.take().copied_back == changed.numel() * changed.element_size()
    assert torch.equal(weight.detach(), changed)  # host copy now holds the change
    offload.bring("transformer")
    assert torch.equal(weight.detach(), changed)


@pytest.mark.parametrize("budget", [1, None], ids=["one-at-a-time", "default-budget"])
def test_adapters_loaded_on_or_off_the_device_survive_the_moves(tiny_models, tmp_path, budget):
    store = AdapterStore(tmp_path / "store")
    path = store.path(publish_random_adapter(store, "zimage", tiny_models["zimage"], "kite").adapter_id)
    plain = pipeline(tiny_models["zimage"])
    plain.load_lora_weights(str(path), weight_name="pytorch_lora_weights.safetensors", adapter_name="kite")
    reference = render(plain)
    assert not np.array_equal(reference, render(pipeline(tiny_models["zimage"])))  # the adapter does something

    pipe, offload = offloaded(tiny_models["zimage"], budget)
    render(pipe)  # whatever stays on the device is there when the adapter is loaded
    pipe.load_lora_weights(str(path), weight_name="pytorch_lora_weights.safetensors", adapter_name="kite")
    for _ in range(2):
        assert np.array_equal(render(pipe), reference)
    pipe.delete_adapters("kite")
    assert np.array_equal(render(pipe), render(pipeline(tiny_models["zimage"])))


def test_quantised_tensors_are_named_as_unswappable():
    class Wrapped(torch.Tensor):
        pass

    model = torch.nn.Linear(2, 2)
    assert unswappable(model) is None
    model.weight = torch.nn.Parameter(torch.ones(2, 2).as_subclass(Wrapped), requires_grad=False)
    assert "weight is a" in unswappable(model)


@pytest.mark.parametrize("family", ["flux1", "qwen_image", "sdxl"])
def test_every_family_renders_the_same_pixels_one_model_at_a_time(tiny_models, family):
    import diffusers

    from diffusion_kit.families import FAMILIES

    spec = FAMILIES[family]

    def build():
        pipe = getattr(diffusers, spec.pipeline_class).from_pretrained(str(tiny_models[family]))
        pipe.set_progress_bar_config(disable=True)
        return pipe

    def draw(pipe):
        with torch.inference_mode():
            return np.asarray(pipe(prompt="a red kite", height=64, width=64, num_inference_steps=2,
                                   generator=torch.Generator("cpu").manual_seed(3), output_type="np",
                                   **{spec.guidance_kwarg: spec.default_guidance}).images)

    reference = draw(build())
    pipe = build()
    models = {n: m for n, m in pipe.components.items() if isinstance(m, torch.nn.Module)}
    offload = PinnedOffload(models, "cpu", 1, pin=False)
    offload.attach()
    for _ in range(2):
        out = draw(pipe)
        # tiny FLUX on the CPU is not bit-identical from run to run even without offload
        assert np.array_equal(out, reference) or (family == "flux1" and np.abs(out - reference).max() < 1e-5)
        moves = offload.take()
        assert spec.denoiser in moves.names and "vae" in moves.names and moves.copied_back == 0, moves
    assert offload.resident() == ["vae"]


@pytest.mark.parametrize("weights_gib, host_gib, refused", [
    (31.4, 125, False),  # FLUX.1-dev on the H200 host
    (31.4, 62, True),
    (19.1, 32, True),
    (2, 32, False),
])
def test_weights_are_not_page_locked_past_half_the_host(weights_gib, host_gib, refused):
    from inference_service.pinned_offload import pin_refusal

    why = pin_refusal(int(weights_gib * 2**30), int(host_gib * 2**30))
    assert (why is not None) == refused
    if refused:
        assert f"{host_gib:.1f} GiB" in why


def test_the_record_says_why_nothing_was_page_locked(tiny_models):
    pipe, offload = offloaded(tiny_models["zimage"])
    record = offload.record()
    assert record.applied == "pageable" and record.status is Status.FELL_BACK and "no accelerator" in record.reason
