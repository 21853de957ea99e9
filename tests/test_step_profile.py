"""The step profiler runs end to end on a tiny pipeline (its figures only mean something on a GPU)."""
import json
import os
import subprocess
import sys

from service_kit.service_process import ROOT


def test_step_profile_records_the_three_loops(tmp_path):
    out = tmp_path / "profile.jsonl"
    subprocess.run([sys.executable, "-m", "benchmarks.step_profile", "--family", "zimage", "--tiny", "--steps", "3",
                    "--workdir", str(tmp_path), "--out", str(out)], cwd=ROOT, check=True, timeout=300,
                   env={**os.environ, "HF_HUB_OFFLINE": "1"})
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    metrics = {r["metric"]: r["value"] for r in rows}
    assert set(metrics) >= {"recipe_ms_per_step", "bare_synced_ms_per_step", "bare_ms_per_step"}
    assert all(v > 0 for v in metrics.values())
    assert all(r["bench"] == "step-profile" and r["command"].startswith("python -m benchmarks.step_profile")
               for r in rows)
