"""The compile warm-up probe runs end to end on a tiny pipeline (its figures only mean something on a GPU)."""
import json
import os
import subprocess
import sys

import pytest

from demos.tiny_pipelines import save_tiny_pipeline
from service_kit.service_process import ROOT

pytestmark = pytest.mark.slow  # run first (tests/conftest.py): the workers then finish together


def test_probe_reports_both_calls_and_the_compile_phases(tmp_path):
    model = save_tiny_pipeline("zimage", tmp_path / "zimage")
    out = subprocess.run([sys.executable, "-m", "benchmarks.compile_warmup_probe", "--model-dir", str(model),
                          "--cache-dir", str(tmp_path / "cache"), "--resolution", "64", "--backend", "aot_eager"],
                         cwd=ROOT, check=True, timeout=300, capture_output=True, text=True,
                         env={**os.environ, "HF_HUB_OFFLINE": "1"})
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["model"] == "zimage" and report["first_call_s"] > 0 and report["second_call_s"] > 0
    assert report["counters"]["stats"]["unique_graphs"] >= 1  # the repeated blocks were really compiled
    assert report["phases_s"]["_compile.compile_inner"] > 0
