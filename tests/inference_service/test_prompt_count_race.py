"""A prompt's token count while the pipeline encodes on another thread (as the GPU worker does under load).

Seen in a soak: a short prompt was now and then refused as 512 tokens (PROMPT_TOO_LONG), because the count
shared the pipeline's fast tokenizer, whose padding settings the pipeline's own call (padding to 512) had
just set from the other thread."""
import sys
import threading

from diffusion_kit.families import FAMILIES


def test_counting_is_not_disturbed_by_the_pipeline_tokenizing_at_once(tiny_models):
    import diffusers

    from inference_service.pipeline_builder import _limits

    pipe = diffusers.ZImagePipeline.from_pretrained(str(tiny_models["zimage"]))
    limits = _limits(pipe, FAMILIES["zimage"])
    short = limits.count_prompt_tokens("a lighthouse at dusk")
    stop = threading.Event()

    def pipeline_encoding():  # what ZImagePipeline.encode_prompt does on the worker thread
        while not stop.is_set():
            pipe.tokenizer(["x" * 50], padding="max_length", max_length=512, truncation=True, return_tensors="pt")

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible: the race shows within a few thousand
    worker = threading.Thread(target=pipeline_encoding)
    worker.start()
    try:
        counts = {limits.count_prompt_tokens("a lighthouse at dusk") for _ in range(3000)}
    finally:
        stop.set()
        worker.join()
        sys.setswitchinterval(interval)
    assert counts == {short} and short < 100
