"""One benchmark command run from the trees of several commits in turn: a speedup measured side by side, on one
machine start, with each row stamped with the commit that produced it.

On this machine, where git has the history, `prepare` writes each commit's tree (without what no benchmark
imports: docs, tests, clients, deploy) into a folder of its own beside a list of them:

    python -m benchmarks.code_arms prepare --into scratch/arms a7c9864 HEAD

On the machine that measures (its copy of the work tree carries the folders; its own git folder may be older
than the files it holds), `run` runs the same command from each folder in the order prepared, with that folder
first on PYTHONPATH and BENCH_CODE naming its commit, so the rows say which code they measured. `{arm}` in the
command becomes the arm's commit (an output file per arm):

    python -m benchmarks.code_arms run --into scratch/arms --timeout 200 -- \\
        -m benchmarks.training_bench --family zimage --modes bf16-max --out $OUT/{arm}.jsonl

Each arm's output goes to `{into}/{arm}.log`; the exit status of each arm is printed, and `run` exits non-zero
when any arm failed or ran past its timeout.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

LEFT_OUT = ("docs", "tests", "clients", "deploy")  # what no benchmark imports: smaller folders to carry
ARMS = "arms.json"


def prepare(into: Path, revs: list[str], repo: Path) -> list[dict]:
    """Each of `revs` (anything git names a commit by) as a folder of `into`; returns and writes the arms."""
    into.mkdir(parents=True, exist_ok=True)
    arms = []
    for rev in revs:
        short = _git(repo, "rev-parse", "--short", f"{rev}^{{commit}}")
        tree = into / short
        if not tree.is_dir():
            archive = subprocess.run(["git", "archive", "--format=tar", short], cwd=repo, capture_output=True,
                                     check=True).stdout
            with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
                members = [m for m in tar.getmembers() if m.name.split("/", 1)[0] not in LEFT_OUT]
                tar.extractall(tree, members=members, filter="data")
        arms.append({"rev": rev, "code": short, "dir": short})
    (into / ARMS).write_text(json.dumps(arms, indent=1))
    return arms


def run(into: Path, python_args: list[str], timeout_s: float) -> list[tuple[str, int]]:
    """The command (arguments to python) from each arm's folder in turn; returns (arm, exit status), 124 for an
    arm stopped at `timeout_s`."""
    arms = json.loads((into / ARMS).read_text())
    results = []
    for arm in arms:
        tree = (into / arm["dir"]).resolve()
        env = {**os.environ, "BENCH_CODE": arm["code"],
               "PYTHONPATH": os.pathsep.join([str(tree), *filter(None, [os.environ.get("PYTHONPATH")])])}
        args = [a.replace("{arm}", arm["code"]) for a in python_args]
        started = time.perf_counter()
        with open(into / f"{arm['code']}.log", "w") as log:
            try:
                code = subprocess.run([sys.executable, *args], cwd=tree, env=env, stdout=log,
                                      stderr=subprocess.STDOUT, timeout=timeout_s).returncode
            except subprocess.TimeoutExpired:
                code = 124
        print(f"{arm['code']} ({arm['rev']}): exit {code} after {time.perf_counter() - started:.0f} s", flush=True)
        results.append((arm["code"], code))
    return results


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True).stdout.strip()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="what", required=True)
    prep = sub.add_parser("prepare", help="each commit's tree into a folder of its own")
    prep.add_argument("--into", type=Path, required=True)
    prep.add_argument("--repo", type=Path, default=Path(__file__).resolve().parent.parent)
    prep.add_argument("revs", nargs="+")
    go = sub.add_parser("run", help="one command from each prepared tree")
    go.add_argument("--into", type=Path, required=True)
    go.add_argument("--timeout", type=float, default=600, help="seconds each arm may run")
    go.add_argument("python_args", nargs=argparse.REMAINDER, help="after --: the arguments to python")
    args = p.parse_args(argv)
    if args.what == "prepare":
        for arm in prepare(args.into, args.revs, args.repo):
            print(f"{arm['rev']} -> {args.into / arm['dir']}")
        return 0
    python_args = args.python_args[1:] if args.python_args[:1] == ["--"] else args.python_args
    if not python_args:
        p.error("run needs the command after --, e.g. -- -m benchmarks.training_bench ...")
    return 0 if all(code == 0 for _, code in run(args.into, python_args, args.timeout)) else 1


if __name__ == "__main__":
    sys.exit(main())
