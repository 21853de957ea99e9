"""The training service's request limits, checked at the edge before any preflight runs.

Preflights still check what depends on the host, the base or the dataset (ranks, resolution,
precision, images). Each limit here is also in training.proto's comments.
"""
from __future__ import annotations

from diffusion_kit.source_rules import MAX_PATH, SOURCE_RULES
from service_kit.request_limits import Limit, Rules

ADAPTER_ID = r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}"
JOB_ID = r"[A-Za-z0-9._-]{1,64}"
MAX_PROMPT_CHARS = 4096
MAX_COUNT = 1_000_000  # steps and step intervals
MAX_PAGE_SIZE = 100

_job_id = Limit(max_len=64, pattern=JOB_ID, pattern_says="1-64 letters, digits, '.', '_' or '-'")
_required_job_id = Limit(max_len=64, pattern=JOB_ID, pattern_says="1-64 letters, digits, '.', '_' or '-'",
                         required=True, reason="MISSING_JOB_ID")
_count = Limit(min=0, max=MAX_COUNT, reason="BAD_VALUE")

RULES: dict[str, Rules] = {
    **SOURCE_RULES,
    "diffusion.v1.Dataset": Rules({"image_dir": Limit(max_len=MAX_PATH),
                                   "instance_prompt": Limit(max_len=MAX_PROMPT_CHARS)}),
    "diffusion.v1.StartTrainingRequest": Rules({
        "learning_rate": Limit(reason="BAD_VALUE"),
        "alpha": Limit(reason="BAD_VALUE"),
        "warmup_steps": _count,
        "checkpoint_every": _count,
        "sample_every": _count,
        "seed": Limit(min=0, reason="BAD_SEED"),
        "optimizer": Limit(reason="BAD_OPTIMIZER"),
        "lr_schedule": Limit(reason="BAD_LR_SCHEDULE"),
        "speed_mode": Limit(reason="BAD_SPEED_MODE"),
        # A repeated string's limit bounds the list and each of its items.
        "sample_prompts": Limit(max_items=8, max_len=MAX_PROMPT_CHARS, reason="BAD_VALUE"),
        "adapter_id": Limit(max_len=128, pattern=ADAPTER_ID, reason="BAD_ADAPTER_ID",
                            pattern_says="1-128 letters, digits, '.', '_' or '-', starting with a letter or digit"),
        "trigger_words": Limit(max_items=16, max_len=64, reason="BAD_VALUE"),
        "resume_job_id": _job_id,
        "device_index": Limit(min=0, max=1023, reason="BAD_DEVICE_INDEX"),
    }),
    "diffusion.v1.WatchTrainingRequest": Rules({"job_id": _required_job_id, "from_sequence": Limit(min=0)}),
    "diffusion.v1.StopTrainingRequest": Rules({"job_id": _required_job_id}),
    "diffusion.v1.GetTrainingJobRequest": Rules({"job_id": _required_job_id}),
    "diffusion.v1.DeleteTrainingJobRequest": Rules({"job_id": _required_job_id}),
    "diffusion.v1.ListTrainingJobsRequest": Rules({"page_size": Limit(min=0, max=MAX_PAGE_SIZE),
                                                   "page_token": Limit(max_len=128)}),
    "diffusion.v1.ListAdaptersRequest": Rules({"page_size": Limit(min=0, max=MAX_PAGE_SIZE),
                                               "page_token": Limit(max_len=256)}),
    "diffusion.v1.DeleteAdapterRequest": Rules({"adapter_id": Limit(max_len=128, required=True,
                                                                    reason="BAD_ADAPTER_ID")}),
}
