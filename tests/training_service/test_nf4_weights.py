"""torchao's NF4Tensor as the nf4 base (nf4_weights): which linears it holds, and a LoRA trained over it on the CPU,
eager and compiled, on a Z-Image wide enough for its blocks' linears to be quantised."""
import shutil

import pytest
import torch
from PIL import Image

from diffusion_kit.precision import Precision
from training_service.denoiser_setup import frozen_linear_filter
from training_service.lora_recipe import LoraRecipe, RecipeConfig
from training_service.nf4_weights import quantize_frozen_linears, tiles


def nf4_tensor_type():
    try:
        from torchao.quantization import NF4Tensor
    except ImportError:
        from torchao.dtypes.nf4tensor import NF4Tensor
    return NF4Tensor


class Block(torch.nn.Module):
    _keep_in_fp32_modules = ["t_embedder"]
    _skip_layerwise_casting_patterns = ["norm"]  # diffusers' layerwise casting only: bitsandbytes quantises these

    def __init__(self):
        super().__init__()
        self.to_q = torch.nn.Linear(128, 128)  # 16384 weights: NF4's blocks (64 x 256) tile it
        self.to_out = torch.nn.Linear(128, 96)  # 12288: they do not
        self.t_embedder = torch.nn.Linear(256, 64)  # tiles, but the model keeps it in fp32
        self.norm1 = torch.nn.Sequential(torch.nn.Linear(64, 256))  # FLUX.1's modulations are named so: quantised
        self.lora_A = torch.nn.Linear(128, 4)  # the filter leaves LoRA layers out


def test_only_frozen_tiled_linears_outside_the_fp32_modules_are_quantised():
    torch.manual_seed(0)
    block = Block().to(torch.bfloat16).requires_grad_(False)
    dense_q = block.to_q.weight.detach().clone()
    x = torch.randn(3, 128, dtype=torch.bfloat16)
    before = block.to_q(x)
    assert tiles(block.to_q.weight) and not tiles(block.to_out.weight) and tiles(block.t_embedder.weight)
    assert quantize_frozen_linears(block, "cpu", frozen_linear_filter()) == (2, 1)
    assert isinstance(block.to_q.weight, nf4_tensor_type()) and not block.to_q.weight.requires_grad
    assert isinstance(block.norm1[0].weight, nf4_tensor_type())
    for kept in (block.to_out, block.t_embedder, block.lora_A):
        assert not isinstance(kept.weight, nf4_tensor_type()) and kept.weight.dtype == torch.bfloat16
    after = block.to_q(x)  # the layer's own forward, through NF4Tensor's linear
    assert after.dtype == torch.bfloat16 and not torch.equal(after, before)  # 4 bits per weight: not exact
    assert (after - before).norm() / before.norm() < 0.15
    assert (block.to_q.weight.get_original_weight() - dense_q).abs().mean() < 0.1 * dense_q.abs().mean()

    block.to_out.weight.requires_grad_(True)
    with pytest.raises(ValueError, match="to_out is trainable"):
        quantize_frozen_linears(block, "cpu", lambda m, name: name == "to_out")


@pytest.fixture(scope="module")
def wide_zimage(tiny_models, tmp_path_factory):
    """The tiny Z-Image with a denoiser four times as wide (dim 128), so its attention linears are NF4-tiled."""
    from diffusers import ZImageTransformer2DModel

    root = tmp_path_factory.mktemp("wide-zimage") / "zimage"
    shutil.copytree(tiny_models["zimage"], root)
    torch.manual_seed(0)
    wide = ZImageTransformer2DModel(
        all_patch_size=(2,), all_f_patch_size=(1,), in_channels=16, dim=128, n_layers=2, n_refiner_layers=1,
        n_heads=2, n_kv_heads=2, cap_feat_dim=16, axes_dims=[32, 16, 16], axes_lens=[256, 32, 32])
    with torch.no_grad():
        wide.x_pad_token.fill_(1.0)
        wide.cap_pad_token.fill_(1.0)
    shutil.rmtree(root / "transformer")
    wide.save_pretrained(root / "transformer")
    return root


def train(base, tmp_path, events=None, **kw):
    path = tmp_path / "card.png"
    Image.new("RGB", (64, 64), (30, 140, 90)).save(path)
    phases = []
    cfg = RecipeConfig(family="zimage", base_dir=str(base), examples=[(str(path), "a green card")], rank=4,
                       alpha=4.0, learning_rate=1e-3, steps=2, resolution=64, seed=7, **kw)

    def emit(kind, data):
        if kind == "phase":
            phases.append(data.get("message", ""))
        if events is not None:
            events.append((kind, data))

    recipe = LoraRecipe(cfg, emit=emit)
    recipe.setup()
    before = [p.detach().clone() for p in recipe.params]
    recipe.train(sample_dir=tmp_path / "samples")
    return recipe, before, phases


def test_a_lora_trains_over_nf4_tensor_weights_eager_and_compiled_alike(wide_zimage, tmp_path):
    events = []
    recipe, before, phases = train(wide_zimage, tmp_path, events, precision=Precision.NF4, nf4_backend="torchao",
                                   sample_every=2, sample_prompts=["a card"])
    (sample,) = [d for k, d in events if k == "sample"]  # the pipeline renders over the nf4 base too
    assert sample["step"] == 2 and (tmp_path / "samples").is_dir()
    (record,) = [r for k, d in events if k == "resolved" for r in d["resolved"] if r["control"] == "nf4_weights"]
    assert (record["requested"], record["applied"], record["source"]) == (
        "torchao", "torchao NF4Tensor", "SETTING_SOURCE_EXPLICIT"), record
    nf4 = [n for n, p in recipe.model.named_parameters() if isinstance(p, nf4_tensor_type())]
    # q, k, v and out of the four blocks' attention (2 layers, a noise and a context refiner), under their LoRA
    attention = [n for n in nf4 if ".attention." in n]
    assert len(attention) == 16 and all(".base_layer." in n for n in attention), nf4
    assert len(nf4) > 16 and "t_embedder.mlp.0.weight" in nf4  # the modulations and embedders too, as bitsandbytes
    assert any(m.startswith(f"nf4 (torchao NF4Tensor) on {len(nf4)} frozen base linears") for m in phases), phases
    losses = recipe.state.losses
    assert len(losses) == 2 and all(torch.isfinite(torch.tensor(losses)))
    assert any(not torch.equal(a, b) for a, b in zip(before, recipe.params))  # the LoRA learned
    assert all(p.dtype == torch.float32 and not isinstance(p, nf4_tensor_type()) for p in recipe.params)

    compiled, _, _ = train(wide_zimage, tmp_path, precision=Precision.NF4, nf4_backend="torchao", compile=True,
                           compile_backend="aot_eager")
    assert compiled.compiled and compiled.state.losses == pytest.approx(losses, rel=1e-4)
    dense, _, _ = train(wide_zimage, tmp_path, precision=Precision.BF16)
    assert dense.state.losses != losses and dense.state.losses == pytest.approx(losses, rel=0.05)


@pytest.mark.parametrize("precision, backend, counts", [
    ("nf4", "bitsandbytes", False),  # the default: checkpoints from before the choice still resume
    ("nf4", "torchao", True),
    ("bf16", "torchao", False),  # no nf4 base: the backend changes nothing
])
def test_a_checkpoint_names_its_nf4_backend_where_it_changes_the_run(precision, backend, counts):
    cfg = RecipeConfig(family="zimage", base_dir="/b", examples=[], precision=precision, nf4_backend=backend)
    assert ("nf4_backend" in cfg.identity()) is counts
    other = RecipeConfig(family="zimage", base_dir="/b", examples=[], precision=precision)
    assert other.identity_differences(cfg.identity()) == (["nf4_backend"] if counts else [])


def test_an_unknown_nf4_backend_is_refused(wide_zimage, tmp_path):
    with pytest.raises(ValueError, match="nf4_backend is one of bitsandbytes, torchao"):
        train(wide_zimage, tmp_path, precision=Precision.NF4, nf4_backend="gguf")


@pytest.mark.gpu
@pytest.mark.timeout(900)
def test_on_a_gpu_nf4_tensor_weights_train_like_bitsandbytes_and_compile(wide_zimage, tmp_path):
    """The same job's losses with either nf4 backend (the same 4-bit format, quantised by two codes), and the
    torchao one compiled with inductor like its eager run; the default backend says so in the record."""
    kw = dict(precision=Precision.NF4, device="cuda", gradient_checkpointing=True)
    events = []
    bnb, _, _ = train(wide_zimage, tmp_path, events, **kw)
    (record,) = [r for k, d in events if k == "resolved" for r in d["resolved"] if r["control"] == "nf4_weights"]
    assert (record["applied"], record["source"]) == ("bitsandbytes Linear4bit", "SETTING_SOURCE_DEFAULT"), record
    eager, _, _ = train(wide_zimage, tmp_path, nf4_backend="torchao", **kw)
    compiled, _, _ = train(wide_zimage, tmp_path, nf4_backend="torchao", compile=True, **kw)
    assert compiled.compiled and compiled.state.losses == pytest.approx(eager.state.losses, rel=2e-2)
    assert eager.state.losses == pytest.approx(bnb.state.losses, rel=5e-2)
