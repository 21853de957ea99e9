"""A repeated prompt skips the text encoders and gives the same image; every family, through the service."""
import numpy as np
import pytest

from diffusion.v1 import common_pb2 as c
from inference_service.prompt_cache import PromptCache
from tests.inference_service.harness import decode, result_of


def encoding(generation) -> str:
    return next(r.applied for r in generation.result.resolved if r.control == "prompt_encoding")


@pytest.mark.parametrize("family", ["zimage", "flux1", "qwen_image", "sdxl"])
def test_a_repeated_prompt_reuses_its_encoding_and_renders_the_same_pixels(inference_service, tiny_models, family):
    _, client = inference_service
    loaded = client.load(f"tiny-{family}", tiny_models[family], speed_mode=c.SPEED_MODE_OFF)[-1].result
    assert next(r for r in loaded.resolved if r.control == "prompt_cache").applied.startswith("repeats reused")
    first = result_of(client.generate(f"tiny-{family}", "a violet lighthouse", seeds=[4], steps=2))
    again = result_of(client.generate(f"tiny-{family}", "a violet lighthouse", seeds=[4], steps=2))
    assert encoding(first).startswith("encoded") and encoding(again).startswith("cached"), (encoding(first),
                                                                                            encoding(again))
    assert again.result.timings.encode_prompt.ToNanoseconds() < first.result.timings.encode_prompt.ToNanoseconds()
    assert np.array_equal(np.asarray(decode(first.images[0])), np.asarray(decode(again.images[0])))
    # another prompt is encoded afresh (Qwen-Image's blank negative prompt, encoded before, is reused)
    other = encoding(result_of(client.generate(f"tiny-{family}", "a green door", seeds=[4], steps=2)))
    assert other.startswith("encoded") or (family == "qwen_image" and other == "1 of 2 encodings reused"), other
    # two images of the prompt: a hit where the pipeline repeats the embeddings itself, a miss where it encodes
    # per image count; either way the first image is the single one, up to batched-matmul rounding
    pair = result_of(client.generate(f"tiny-{family}", "a violet lighthouse", seeds=[4, 5], steps=2))
    assert len(pair.images) == 2
    diff = np.abs(np.asarray(decode(pair.images[0]), dtype=int) - np.asarray(decode(first.images[0]), dtype=int))
    assert diff.max() <= 2


def test_the_cache_keeps_its_byte_budget_and_evicts_the_oldest():
    import torch

    class Pipe:
        calls = 0

        def encode_prompt(self, prompt, device=None, num_images_per_prompt=1):
            Pipe.calls += 1
            return torch.full((num_images_per_prompt, 256), float(len(prompt))), None  # 1 KiB per image

    pipe, cache = Pipe(), PromptCache(max_bytes=2048)
    cache.install(pipe)
    a = pipe.encode_prompt("a", device="cpu")
    a[0].add_(1)  # the pipeline may change what it gets; the cache's copy does not move
    assert pipe.encode_prompt("a", device="cpu")[0][0, 0].item() == 1.0 and Pipe.calls == 1
    pipe.encode_prompt("bb", device="cpu")
    pipe.encode_prompt("ccc", device="cpu")  # 3 KiB would be over: "a" goes
    assert Pipe.calls == 3
    pipe.encode_prompt("a", device="cpu")
    assert Pipe.calls == 4
    pipe.encode_prompt("x", num_images_per_prompt=4)  # 4 KiB alone is over the budget: not kept
    pipe.encode_prompt("x", num_images_per_prompt=4)
    assert Pipe.calls == 6
    assert cache.counts() == (1, 6) and cache.counts() == (0, 0)  # read once: one generation's
    assert cache.record(0, 0) is None and cache.record(2, 0).applied.startswith("cached")
