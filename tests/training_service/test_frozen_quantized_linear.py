"""An int8 base keeps its int8 weight through the backward pass and trains the LoRA exactly as before."""
import copy

import pytest
import torch

from training_service.denoiser_setup import frozen_linear_filter, load_denoiser
from training_service.frozen_quantized_linear import FrozenQuantizedLinear, wrap_frozen_quantized
from diffusion_kit.families import FAMILIES

torchao = pytest.importorskip("torchao")


def _int8_lora_model():
    from peft import LoraConfig, inject_adapter_in_model
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 64)).to(torch.bfloat16)
    model.requires_grad_(False)
    model = inject_adapter_in_model(LoraConfig(r=4, init_lora_weights="gaussian", target_modules=["0", "2"]), model)
    quantize_(model, Int8WeightOnlyConfig(), filter_fn=frozen_linear_filter())
    for name, p in model.named_parameters():
        if "lora_B" in name:  # zero at init, which would leave lora_A without a gradient to compare
            torch.nn.init.normal_(p, std=0.1)
    return model


def _saved_shapes(model, x):
    saved = []

    def pack(t):
        saved.append((tuple(t.shape), type(t)))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(x).float().pow(2).mean().backward()
    return saved


def _close(got, reference):
    """Equal up to bf16 rounding: the dequantised weight multiplies in a different order than torchao's."""
    assert got.dtype == reference.dtype
    assert float((got.float() - reference.float()).norm() / reference.float().norm()) < 1e-2


def _lora_grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}


def test_the_backward_saves_no_dense_copy_of_a_quantised_weight():
    plain = _int8_lora_model()
    wrapped = copy.deepcopy(plain)
    assert wrap_frozen_quantized(wrapped, frozen_linear_filter()) == 2
    x = torch.randn(8, 64, dtype=torch.bfloat16)
    weight_shapes = {(128, 64), (64, 128)}
    dense_before = [s for s, t in _saved_shapes(plain, x) if s in weight_shapes and t is torch.Tensor]
    assert dense_before, "torchao's int8 linear no longer saves a dense weight: this wrapper may be unneeded"
    dense_after = [s for s, t in _saved_shapes(wrapped, x) if s in weight_shapes and t is torch.Tensor]
    assert dense_after == []


def test_outputs_are_unchanged_and_lora_gradients_agree():
    plain = _int8_lora_model()
    wrapped = copy.deepcopy(plain)
    wrap_frozen_quantized(wrapped, frozen_linear_filter())
    x = torch.randn(8, 64, dtype=torch.bfloat16)
    assert torch.equal(plain(x), wrapped(x))
    for model in (plain, wrapped):
        model(x).float().pow(2).mean().backward()
    reference, got = _lora_grads(plain), _lora_grads(wrapped)
    assert reference.keys() == got.keys() and len(got) == 4
    assert all(g.abs().sum() > 0 for g in reference.values())
    for name in reference:
        _close(got[name], reference[name])


def test_the_input_gradient_matches_when_the_input_needs_one():
    plain = _int8_lora_model()
    wrapped = copy.deepcopy(plain)
    wrap_frozen_quantized(wrapped, frozen_linear_filter())
    grads = []
    for model in (plain, wrapped):
        x = torch.randn(8, 64, dtype=torch.float32, generator=torch.Generator().manual_seed(1)).requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            model(x).float().sum().backward()
        grads.append(x.grad)
    _close(grads[1], grads[0])


def test_a_dense_or_trainable_linear_is_refused():
    with pytest.raises(TypeError):
        FrozenQuantizedLinear.wrapping(torch.nn.Linear(16, 16).requires_grad_(False))
    with pytest.raises(ValueError):
        FrozenQuantizedLinear.wrapping(torch.nn.Linear(16, 16))


def test_an_int8_denoiser_wraps_every_quantised_base_linear(tiny_models):
    denoiser = load_denoiser(FAMILIES["zimage"], str(tiny_models["zimage"]), "int8", "cpu", rank=4, alpha=4, seed=0,
                             gradient_checkpointing=False, compile_backend=None)
    accept = frozen_linear_filter()
    quantised = [n for n, m in denoiser.model.named_modules() if isinstance(m, torch.nn.Linear)
                 and type(m.weight) not in (torch.Tensor, torch.nn.Parameter)]
    assert quantised
    assert all(type(denoiser.model.get_submodule(n)) is FrozenQuantizedLinear for n in quantised)
    assert not [n for n, m in denoiser.model.named_modules() if type(m) is torch.nn.Linear and accept(m, n)]
