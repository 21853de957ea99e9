"""benchmarks.code_arms: commits' trees prepared from this repository's history, and one command run from each
with its own code first on the path and its commit named in the rows."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def rev(name: str) -> str:
    done = subprocess.run(["git", "rev-parse", "--short", f"{name}^{{commit}}"], cwd=ROOT, capture_output=True,
                          text=True)
    if done.returncode != 0:
        pytest.skip(f"this clone does not hold {name}")
    return done.stdout.strip()


def arms(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "benchmarks.code_arms", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


def test_each_arm_runs_its_own_code_and_names_its_commit(tmp_path):
    head, parent = rev("HEAD"), rev("HEAD~1")
    into = tmp_path / "arms"
    done = arms("prepare", "--into", str(into), "HEAD~1", "HEAD")
    assert done.returncode == 0, done.stderr
    assert [a["code"] for a in json.loads((into / "arms.json").read_text())] == [parent, head]
    for code in (parent, head):
        assert (into / code / "benchmarks" / "bench_record.py").is_file()
        assert not (into / code / "docs").exists() and not (into / code / "tests").exists()
        assert (into / code / "demos").is_dir()  # the full-size pipelines import the tiny ones' tokenizers
    said = ("import sys, benchmarks.bench_record as b; "
            "open(sys.argv[1], 'w').write(b.code_version() + ' ' + b.__file__)")
    done = arms("run", "--into", str(into), "--", "-c", said, str(tmp_path / "{arm}.txt"))
    assert done.returncode == 0, done.stdout + done.stderr
    for code in (parent, head):
        stamped, module = (tmp_path / f"{code}.txt").read_text().split(" ", 1)
        assert stamped == code and Path(module).is_relative_to((into / code).resolve())
        assert f"{code} (" in done.stdout


def test_an_arm_past_its_timeout_fails_the_run_and_the_next_still_runs(tmp_path):
    head = rev("HEAD")
    into = tmp_path / "arms"
    assert arms("prepare", "--into", str(into), "HEAD").returncode == 0
    (into / "arms.json").write_text(json.dumps([{"rev": "slow", "code": head, "dir": head},
                                                {"rev": "quick", "code": head, "dir": head}]))
    done = arms("run", "--into", str(into), "--timeout", "2", "--", "-c",
                "import os, time; first = not os.path.exists('ran'); open('ran', 'w'); time.sleep(30 if first else 0)")
    assert done.returncode == 1
    assert f"{head} (slow): exit 124" in done.stdout and f"{head} (quick): exit 0" in done.stdout
