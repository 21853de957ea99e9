"""A committed figure names the code it ran at, and its command reruns anywhere."""
import json
import subprocess
from pathlib import Path

import pytest

from benchmarks.bench_record import Recorder, code_version, portable_command


@pytest.mark.parametrize("command, out, expected", [
    ("python -m b --modes x --out /root/out/z.jsonl", Path("/root/out/z.jsonl"), "python -m b --modes x --out z.jsonl"),
    ("python -m b --out z.jsonl", Path("z.jsonl"), "python -m b --out z.jsonl"),  # already relative
    ("python -m b --out docs/bench/z.jsonl", Path("docs/bench/z.jsonl"), "python -m b --out docs/bench/z.jsonl"),
    ("python -m b --modes x", None, "python -m b --modes x"),  # no output file
    ("python -m b --workdir /root/out --out /root/out/z.jsonl", Path("/root/out/z.jsonl"),
     "python -m b --workdir /root/out --out z.jsonl"),  # only the output file's own word
])
def test_the_output_file_is_named_without_the_folder_it_was_written_to(command, out, expected):
    assert portable_command(command, out) == expected


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


def test_the_code_is_the_commit_and_says_when_the_tree_differs(tmp_path, monkeypatch):
    monkeypatch.delenv("BENCH_CODE", raising=False)
    assert code_version(tmp_path) == "unknown"  # not a checkout
    _git(tmp_path, "init", "-q")
    (tmp_path / "a.py").write_text("x = 1\n")
    _git(tmp_path, "add", "a.py")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "a")
    head = _git(tmp_path, "rev-parse", "--short", "HEAD")
    (tmp_path / "scratch.txt").write_text("untracked: not the code")
    assert code_version(tmp_path) == head
    (tmp_path / "a.py").write_text("x = 2\n")
    assert code_version(tmp_path) == head + "+changes"


def test_a_copy_is_told_its_code(tmp_path, monkeypatch):
    """A device's copy of the work tree may carry an older git HEAD than the tree it holds."""
    monkeypatch.setenv("BENCH_CODE", "abc1234")
    assert code_version(tmp_path) == "abc1234"


def test_every_row_carries_the_code_and_the_portable_command(tmp_path, monkeypatch):
    monkeypatch.delenv("BENCH_CODE", raising=False)
    out = tmp_path / "rows.jsonl"
    record = Recorder("b", out, "zimage", f"python -m b --out {out}", "a host")
    record("m", "step_ms", 1.23456, "ms", extra=1)
    row = json.loads(out.read_text())
    assert row["command"] == "python -m b --out rows.jsonl"
    assert row["code"] == code_version() and row["code"] != "unknown"  # this repository's checkout
    assert (row["value"], row["extra"]) == (1.2346, 1)
