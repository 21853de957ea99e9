"""The inference service's request limits, checked at the edge before the engine sees a request.

The engine still checks what depends on the loaded model (sizes against its positional range,
steps, guidance, adapters against the store). Each limit here is also in inference.proto's comments.
"""
from __future__ import annotations

from diffusion_kit.source_rules import SOURCE_RULES
from inference_service.image_room import MAX_PIXELS
from inference_service.keep_alive import MAX_KEEP_ALIVE_S
from service_kit.request_limits import Limit, Rules

MODEL_ID = r"[A-Za-z0-9._-]{1,128}"
GENERATION_ID = r"[A-Za-z0-9._-]{1,64}"
ADAPTER_ID = r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}"
MAX_PROMPT_CHARS = 4096
MAX_ADAPTERS = 8
MAX_SEEDS = 16

_model_id = Limit(max_len=128, pattern=MODEL_ID, reason="BAD_MODEL_ID",
                  pattern_says="1-128 letters, digits, '.', '_' or '-'")

RULES: dict[str, Rules] = {
    **SOURCE_RULES,
    "diffusion.v1.LoadRequest": Rules({"model_id": _model_id,
                                       "device_index": Limit(min=0, max=1023, reason="BAD_DEVICE_INDEX"),
                                       "keep_alive": Limit(max=MAX_KEEP_ALIVE_S, reason="BAD_KEEP_ALIVE"),
                                       "max_pixels_per_call": Limit(min=0, max=MAX_PIXELS,
                                                                    reason="BAD_MAX_PIXELS_PER_CALL")}),
    "diffusion.v1.GenerateRequest": Rules({
        "model_id": Limit(max_len=128, required=True, pattern=MODEL_ID, reason="BAD_MODEL_ID",
                          pattern_says="1-128 letters, digits, '.', '_' or '-'"),
        "prompt": Limit(max_len=MAX_PROMPT_CHARS),  # required: the engine says so (MISSING_PROMPT)
        "negative_prompt": Limit(max_len=MAX_PROMPT_CHARS),
        "seeds": Limit(max_items=MAX_SEEDS),
        "adapters": Limit(max_items=MAX_ADAPTERS),
        "generation_id": Limit(max_len=64, pattern=GENERATION_ID, pattern_says="1-64 letters, digits, '.', '_' or '-'"),
    }),
    "diffusion.v1.AdapterRef": Rules({"adapter_id": Limit(max_len=128, pattern=ADAPTER_ID, reason="BAD_ADAPTER_ID",
                                                          pattern_says="1-128 letters, digits, '.', '_' or '-', "
                                                                       "starting with a letter or digit")}),
    "diffusion.v1.CancelGenerationRequest": Rules({"generation_id": Limit(max_len=64, required=True)}),
    "diffusion.v1.UnloadRequest": Rules({"model_id": Limit(max_len=128, required=True)}),
}
