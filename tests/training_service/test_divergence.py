"""A run whose loss stops being finite: the trainer ends it as FAILED, naming the step, and says what to change
(resuming would repeat the same steps), not "resume from the checkpoint"."""
import json
import os
import subprocess
import sys

import pytest
from PIL import Image

from service_kit.service_process import ROOT
from training_service.recipe_config import RecipeConfig
from training_service.trainer_child import divergence_advice


def cfg(**kw):
    return RecipeConfig(**{"family": "zimage", "base_dir": "/b", "examples": [], "precision": "bf16", "steps": 1000,
                           "learning_rate": 1e-4, "warmup_steps": 100, **kw})


@pytest.mark.parametrize("config, expected, absent", [
    (cfg(), ["learning_rate (this run: 0.0001)"], ["warmup_steps", "bf16 precision"]),
    (cfg(warmup_steps=0), ["learning_rate", "more warmup_steps (this run: 0)"], ["bf16 precision"]),
    (cfg(precision="fp16"), ["learning_rate", "bf16 precision"], ["warmup_steps"]),
])
def test_advice_names_what_would_change_the_trajectory(config, expected, absent):
    message = divergence_advice(config, 7, float("nan"))
    assert message.startswith("training diverged: the loss became nan at step 7")
    assert "would diverge again" in message
    assert all(e in message for e in expected), message
    assert not any(a in message for a in absent), message


def test_a_diverging_trainer_ends_its_job_failed_with_the_advice(tiny_models, tmp_path):
    images = []
    for i in range(2):
        path = tmp_path / f"{i}.png"
        Image.new("RGB", (64, 64), (60 * i, 120, 30)).save(path)
        images.append((str(path), f"card {i}"))
    job = tmp_path / "job"
    job.mkdir()
    # far past what StartTraining accepts (at most 1): the child alone, so the tiny model diverges in a step or two
    (job / "run.json").write_text(RecipeConfig(family="zimage", base_dir=str(tiny_models["zimage"]), examples=images,
                                               rank=4, alpha=4.0, learning_rate=1e12, steps=6, resolution=64,
                                               seed=7).to_json())
    done = subprocess.run([sys.executable, "-m", "training_service.trainer_child", str(job)], cwd=ROOT,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert done.returncode == 1, done.stderr[-2000:]
    finished = events[-1]
    assert finished["kind"] == "finished" and finished["data"]["state"] == "FAILED", events[-3:]
    steps = [e["data"]["step"] for e in events if e["kind"] == "step"]
    assert finished["data"]["steps_completed"] == len(steps) < 6
    assert f"at step {len(steps) + 1}. A resumed run repeats the same steps" in finished["data"]["message"]
    assert "a lower learning_rate (this run: 1e+12)" in finished["data"]["message"]
    assert "Traceback" not in done.stderr  # an outcome the job states, not a crash
