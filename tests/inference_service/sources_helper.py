"""Builds the other load sources from a tiny pipeline: a single-file denoiser, a GGUF denoiser, a hub cache entry."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

from diffusion_kit.families import FAMILIES


def denoiser_file(pipeline_dir: Path, family: str) -> Path:
    folder = Path(pipeline_dir) / FAMILIES[family].denoiser
    (weights,) = folder.glob("*.safetensors")
    return weights


def write_single_file(pipeline_dir: Path, family: str, out: Path) -> Path:
    shutil.copyfile(denoiser_file(pipeline_dir, family), out)
    return out


def write_gguf(pipeline_dir: Path, family: str, out: Path) -> tuple[Path, int]:
    """Q8_0 for every 2-D weight whose rows fit 32-element blocks, f32 for the rest (as real GGUF files do)."""
    import gguf
    from safetensors.torch import load_file

    writer = gguf.GGUFWriter(str(out), arch=family)
    quantized = 0
    for name, tensor in load_file(denoiser_file(pipeline_dir, family)).items():
        array = tensor.float().numpy()
        if name.endswith(".weight") and array.ndim == 2 and array.shape[-1] % 32 == 0:
            q = gguf.quants.quantize(array, gguf.GGMLQuantizationType.Q8_0)
            writer.add_tensor(name, q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
            quantized += 1
        else:
            writer.add_tensor(name, array.astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out, quantized


def seed_hub_cache(cache: Path, repo_id: str, pipeline_dir: Path, revision: str = "0" * 40) -> Path:
    """Lays a pipeline out the way huggingface_hub caches a downloaded repo, so offline loads find it."""
    root = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = root / "snapshots" / revision
    shutil.copytree(pipeline_dir, snapshot)
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text(revision)
    json.loads((snapshot / "model_index.json").read_text())  # sanity: a pipeline
    return snapshot
