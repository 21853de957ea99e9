"""How many tensor operations one eager LoRA training step runs, with the LoRA layers casting their input to their
fp32 weights' dtype (peft's default) and taking it as given (training_service.denoiser_setup.lora_inputs_as_given),
under bf16 autocast as the trainer's GPU step runs.

The eager step on a GPU is bound by the host's kernel launches (docs/bench/training.md), so the count of operations
is what matters, and it depends on the model's structure, not its width: the families' full block structure (FLUX.1:
19 double and 38 single blocks; Z-Image: 30 blocks and 2 refiner layers each side) at a narrow width runs here on the
CPU, counted at the ATen dispatcher. Each row also says whether the loss and every LoRA gradient were bit-identical.

    python -m benchmarks.lora_input_casts [--families flux1,zimage] [--out FILE]
"""
from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from benchmarks.bench_record import Recorder, host_description
from diffusion_kit.families import FAMILIES
from training_service.denoiser_setup import lora_inputs_as_given


class OpCount(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


def narrow(family: str):
    """The family's denoiser with its full block structure at a narrow width, and one step's inputs."""
    import diffusers

    g, bf = torch.Generator().manual_seed(1), torch.bfloat16
    if family == "flux1":
        model = diffusers.FluxTransformer2DModel(
            in_channels=16, num_layers=19, num_single_layers=38, attention_head_dim=16, num_attention_heads=2,
            joint_attention_dim=32, pooled_projection_dim=32, axes_dims_rope=(4, 4, 8), guidance_embeds=True)
        inputs = dict(hidden_states=torch.randn(1, 64, 16, generator=g), encoder_hidden_states=torch.randn(
            1, 8, 32, generator=g), pooled_projections=torch.randn(1, 32, generator=g), timestep=torch.full((1,), 0.5),
            img_ids=torch.zeros(64, 3), txt_ids=torch.zeros(8, 3), guidance=torch.full((1,), 3.5), return_dict=False)
    else:
        model = diffusers.ZImageTransformer2DModel(
            dim=32, n_layers=30, n_refiner_layers=2, n_heads=2, n_kv_heads=2, cap_feat_dim=16, axes_dims=[8, 4, 4],
            axes_lens=[256, 32, 32])
        with torch.no_grad():  # created with torch.empty upstream
            model.x_pad_token.fill_(1.0)
            model.cap_pad_token.fill_(1.0)
        inputs = dict(x=[torch.randn(16, 1, 16, 16, generator=g)], t=torch.full((1,), 0.5),
                      cap_feats=[torch.randn(8, 16, generator=g)], return_dict=False)
    inputs = {k: [v.to(bf) for v in x] if isinstance(x, list) else x.to(bf) if torch.is_tensor(x) and k not in
              ("img_ids", "txt_ids") else x for k, x in inputs.items()}
    return model.to(bf), inputs


def step(family: str, as_given: bool) -> tuple[float, list[torch.Tensor], collections.Counter, int]:
    from peft import LoraConfig

    torch.manual_seed(0)
    model, inputs = narrow(family)
    model.requires_grad_(False)
    model.add_adapter(LoraConfig(r=4, lora_alpha=4, init_lora_weights="gaussian",
                                 target_modules=list(FAMILIES[family].lora_targets)))
    for p in model.parameters():
        if p.requires_grad:
            p.data = p.data.float()
    layers = lora_inputs_as_given(model) if as_given else 0
    count = OpCount()
    with count:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(**inputs)[0]
            out = torch.stack(out) if isinstance(out, list) else out
            loss = out.float().pow(2).mean()
        loss.backward()
    return loss.item(), [p.grad for p in model.parameters() if p.requires_grad], count.ops, layers


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--families", default="flux1,zimage")
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    command = "python -m benchmarks.lora_input_casts " + " ".join(sys.argv[1:])
    for family in args.families.split(","):
        record = Recorder("lora-input-casts", args.out, family, command, host_description())
        cast_loss, cast_grads, cast_ops, _ = step(family, False)
        loss, grads, ops, layers = step(family, True)
        identical = loss == cast_loss and all(torch.equal(a, b) for a, b in zip(grads, cast_grads))
        for mode, counted in (("lora inputs cast", cast_ops), ("lora inputs as given", ops)):
            record(mode, "ops_per_step", sum(counted.values()), "ATen ops", copies=counted["aten._to_copy"],
                   lora_layers=layers, bit_identical=identical)


if __name__ == "__main__":
    main()
