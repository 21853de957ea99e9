"""The trainable denoiser: loaded at its base precision, given a LoRA, quantised, optionally compiled.

Order matters; each rule below fixes a failure seen in practice:
- nf4 quantises at load (bitsandbytes Linear4bit), then the LoRA wraps the 4-bit layers (QLoRA); or, with the
  torchao backend (nf4_weights), the frozen base linears get NF4Tensor weights *after* add_adapter, one layer at a
  time on the device, which the compiler traces into the block graphs;
- int8 quantises *after* add_adapter, only the frozen base layers (torchao weight-only), and runs eager;
  its backward reads the int8 weight (frozen_quantized_linear), not a saved bf16 copy;
- fp8 swaps the frozen linears for torchao Float8Linear with the filter (no LoRA, no proj_out, no
  dimension that is not a multiple of 16), and compiles;
- mxfp8 uses torchao's MXFP8 training wrapper (Blackwell); if it cannot apply, the base stays bf16
  and a warning says so.
LoRA parameters are always fp32; the step runs under bf16 autocast on a GPU, where the LoRA layers take their input
as it comes (lora_inputs_as_given).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from diffusion_kit.families import FamilySpec
from diffusion_kit.precision import Precision
from diffusion_kit.quant_probe import contained
from training_service.checkpoint_interval import EveryNthBlockCall
from training_service.frozen_quantized_linear import wrap_frozen_quantized
from training_service.nf4_weights import BACKENDS as NF4_BACKENDS, DEFAULT_BACKEND as NF4_DEFAULT
from training_service.nf4_weights import quantize_frozen_linears



def torch_dtype(precision: Precision) -> torch.dtype:
    """The dtype a base held at `precision` keeps its (unquantised) weights in."""
    return getattr(torch, precision.facts.torch_dtype)


def step_autocast(device: str, dtype: torch.dtype) -> torch.dtype | None:
    """The dtype a training step autocasts to: a half-precision base's own on a GPU; None (no autocast) on the CPU,
    where every dtype is exact, or for an fp32 base."""
    return dtype if device.startswith("cuda") and dtype != torch.float32 else None


def lora_inputs_as_given(model: torch.nn.Module) -> int:
    """The LoRA layers stop casting their input to their fp32 weights' dtype; returns how many. Only under autocast:
    there the cast is undone at once (autocast casts it back to the half dtype for the matmul), so each layer made
    two copies of its input per forward and two of its gradient per backward that change no bit: on FLUX.1's
    structure 754 copies a step, where the eager step is bound by the host's kernel launches (benchmarks.
    lora_input_casts counts them)."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    layers = [m for m in model.modules() if isinstance(m, BaseTunerLayer)]
    for layer in layers:
        layer.cast_input_dtype_enabled = False  # what peft.helpers.disable_input_dtype_casting sets, for good
    return len(layers)


def lora_inputs_for_step(model: torch.nn.Module, device: str, dtype: torch.dtype) -> int:
    """The LoRA layers take their input as given where the step autocasts (step_autocast), and keep peft's cast
    elsewhere; returns how many layers changed."""
    return lora_inputs_as_given(model) if step_autocast(device, dtype) is not None else 0


@dataclass
class Denoiser:
    model: torch.nn.Module
    params: list[torch.nn.Parameter]
    precision: Precision  # what the base actually is after any fallback
    compiled: bool
    warnings: list[tuple[str, str]] = field(default_factory=list)


def frozen_linear_filter(min_features: int = 16) -> Callable:
    """The frozen base linears worth a low-precision matmul: LoRA layers and the output projection stay high."""

    def accept(module, fqn: str) -> bool:
        return (isinstance(module, torch.nn.Linear) and "lora_" not in fqn and "proj_out" not in fqn
                and module.in_features >= min_features and module.out_features >= min_features
                and module.in_features % 16 == 0 and module.out_features % 16 == 0)

    return accept


def load_denoiser(family: FamilySpec, base_dir: str, precision: Precision, device: str, *, rank: int, alpha: float,
                  seed: int, gradient_checkpointing: bool, compile_backend: str | None, checkpoint_interval: int = 1,
                  nf4_backend: str = NF4_DEFAULT,
                  phase: Callable[[str, str], None] = lambda phase, message: None) -> Denoiser:
    import diffusers
    from peft import LoraConfig

    if nf4_backend not in NF4_BACKENDS:
        raise ValueError(f"nf4_backend is one of {', '.join(NF4_BACKENDS)}, not {nf4_backend!r}")
    cls = getattr(diffusers, family.denoiser_class)
    precision = Precision(precision)  # its key ("int8") reads as the same value
    dtype = torch_dtype(precision)
    kwargs = {"subfolder": family.denoiser, "dtype": dtype}
    bnb_nf4 = precision == Precision.NF4 and nf4_backend == NF4_DEFAULT
    if bnb_nf4:
        kwargs["quantization_config"] = diffusers.BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.bfloat16)
        phase("quantizing", "nf4 (bitsandbytes) at load")
    model = cls.from_pretrained(base_dir, **kwargs)
    model.requires_grad_(False)
    warnings: list[tuple[str, str]] = []
    if gradient_checkpointing and checkpoint_interval > 1:
        EveryNthBlockCall(checkpoint_interval).install(model)
    elif gradient_checkpointing:
        model.enable_gradient_checkpointing()
    torch.manual_seed(seed)  # peft draws the LoRA init from the global generator
    model.add_adapter(LoraConfig(r=rank, lora_alpha=alpha, init_lora_weights="gaussian",
                                 target_modules=list(family.lora_targets)))
    if precision == Precision.NF4 and not bnb_nf4:
        quantised, dense = quantize_frozen_linears(model, device, frozen_linear_filter())
        phase("quantizing", f"nf4 (torchao NF4Tensor) on {quantised} frozen base linears; {dense} that NF4's "
                            "blocks do not tile stay bf16")
    if not bnb_nf4:  # bitsandbytes placed the 4-bit model already
        model.to(device)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.data = p.data.to(device=device, dtype=torch.float32)
    lora_inputs_for_step(model, device, dtype)

    if precision == Precision.INT8:
        from torchao.quantization import Int8WeightOnlyConfig, quantize_

        phase("quantizing", "int8 weight-only (torchao) on the frozen base linears")
        quantize_(model, contained(Int8WeightOnlyConfig()), filter_fn=frozen_linear_filter())
        wrap_frozen_quantized(model, frozen_linear_filter())  # else autograd keeps a bf16 copy of each weight
    elif precision == Precision.FP8:
        from torchao.float8 import convert_to_float8_training

        phase("quantizing", "float8 training linears (torchao) on the frozen base")
        convert_to_float8_training(model, module_filter_fn=frozen_linear_filter())
    elif precision == Precision.MXFP8:
        try:
            from torchao.prototype.moe_training.config import MXFP8TrainingOpConfig
            from torchao.quantization import quantize_

            phase("quantizing", "mxfp8 training linears (torchao) on the frozen base")
            quantize_(model, contained(MXFP8TrainingOpConfig()), filter_fn=frozen_linear_filter(32))
        except Exception as e:  # noqa: BLE001 - reported, never silent
            precision = Precision.BF16
            warnings.append(("MXFP8_FELL_BACK", f"mxfp8 could not be applied ({type(e).__name__}: {e}); "
                                                "training continues with a bf16 base"))

    compiled = False
    if compile_backend is not None:
        phase("compiling", f"regional compile of the repeated blocks ({compile_backend}, dynamic shapes)")
        model.compile_repeated_blocks(dynamic=True, backend=compile_backend)
        compiled = True
    return Denoiser(model, params, precision, compiled, warnings)
