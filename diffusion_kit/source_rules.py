"""What a model source in a request may look like, for the request limits of both services that take one."""
from __future__ import annotations

from service_kit.request_limits import Limit, Rules

MAX_PATH = 4096  # PATH_MAX on Linux
# Hugging Face's own rule: owner/name, each 1-96 of letters, digits, '-', '_', '.'
REPO_ID = r"[A-Za-z0-9](?:[A-Za-z0-9_.-]{0,94}[A-Za-z0-9])?/[A-Za-z0-9](?:[A-Za-z0-9_.-]{0,94}[A-Za-z0-9])?"
PATH = Limit(max_len=MAX_PATH)

SOURCE_RULES: dict[str, Rules] = {
    "diffusion.v1.ModelSource": Rules({"local_dir": PATH}),
    "diffusion.v1.HubRepo": Rules({
        "repo_id": Limit(max_len=193, required=True, pattern=REPO_ID, reason="BAD_REPO_ID",
                         pattern_says="owner/name: 1-96 letters, digits, '-', '_' or '.' each, not starting or "
                                      "ending with '-' or '.'"),
        "revision": Limit(max_len=255),
        "variant": Limit(max_len=32, pattern=r"[A-Za-z0-9_]{1,32}", reason="BAD_VARIANT",
                         pattern_says="letters, digits or '_'"),
    }),
    "diffusion.v1.SingleFileCheckpoint": Rules({"path": Limit(max_len=MAX_PATH, required=True)}),
    "diffusion.v1.GgufTransformer": Rules({"path": Limit(max_len=MAX_PATH, required=True)}),
}
