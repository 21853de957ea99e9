"""The life of ahead-of-time graphs outside a service: which folders a load deletes (aot_blocks.stale,
aot_blocks.prune: those of other software, once unused for a week, and staging folders a dying process left;
before, the folder only grew with every torch, triton, diffusers or Python upgrade), and what a failed install
leaves on the blocks (nothing)."""
import json
import os

import pytest

from diffusion_kit import aot_blocks

NOW = 1_800_000_000.0
WEEK = aot_blocks.UNUSED_BEFORE_PRUNE_S
ENV = {"torch": "2.11.0", "torch_git": "abc", "triton": "3.5", "diffusers": "0.42.1", "python": "3.12.3",
       "device": "NVIDIA H200 sm_90 cuda:0", "backend": "inductor", "dtype": "torch.bfloat16"}


@pytest.mark.parametrize("changes, idle_s, deletable", [
    ({}, 10 * WEEK, False),                              # this software's: kept however old
    ({"torch": "2.10.0"}, WEEK + 1, True),               # another torch, unused for a week
    ({"torch": "2.10.0"}, WEEK - 60, False),             # another torch, used this week (a rolling upgrade)
    ({"triton": "3.4"}, 2 * WEEK, True),
    ({"torch_git": "def"}, 2 * WEEK, True),
    ({"diffusers": "0.41.0"}, 2 * WEEK, True),
    ({"python": "3.11.9"}, 2 * WEEK, True),
    ({"device": "NVIDIA H100 sm_90 cuda:0"}, 2 * WEEK, False),  # another device: a host may have both
    ({"dtype": "torch.float16"}, 2 * WEEK, False),             # another load's settings
])
def test_only_graphs_of_other_software_unused_for_a_week_are_deletable(changes, idle_s, deletable):
    assert aot_blocks.stale({**ENV, **changes}, ENV, idle_s) == deletable


def test_a_folder_whose_software_is_unknown_stays():
    assert not aot_blocks.stale(None, ENV, 10 * WEEK) and not aot_blocks.stale({}, ENV, 10 * WEEK)


def _folder(root, name, marker, env, idle_s):
    folder = root / name
    folder.mkdir()
    path = folder / marker
    path.write_text(json.dumps({"graphs": 0, "error": "x", **({"env": env} if env is not None else {})}))
    os.utime(path, (NOW - idle_s, NOW - idle_s))
    return folder


def test_prune_deletes_old_graphs_failures_and_abandoned_staging_and_nothing_else(tmp_path):
    old = {**ENV, "torch": "2.10.0"}
    _folder(tmp_path, "old-graphs", aot_blocks.META, old, 2 * WEEK)
    _folder(tmp_path, "old-failure", aot_blocks.FAILED, old, 2 * WEEK)
    _folder(tmp_path, "old-but-in-use", aot_blocks.META, old, 60)
    current = _folder(tmp_path, "current", aot_blocks.META, ENV, 10 * WEEK)
    left = current / f"{aot_blocks.EXTRA}k4{aot_blocks.STAGING}4444"  # a process died saving graphs beside them
    left.mkdir()
    os.utime(left, (NOW - 2 * WEEK, NOW - 2 * WEEK))
    (current / f"{aot_blocks.EXTRA}k5").mkdir()  # saved whole: stays with its folder
    _folder(tmp_path, "no-env", aot_blocks.FAILED, None, 10 * WEEK)
    abandoned = tmp_path / f"k1{aot_blocks.STAGING}4242"
    abandoned.mkdir()
    os.utime(abandoned, (NOW - 2 * WEEK, NOW - 2 * WEEK))
    (tmp_path / f"k2{aot_blocks.STAGING}4343").mkdir()  # another process is writing it now
    (tmp_path / "not-a-folder").write_text("kept")
    os.utime(tmp_path / f"k2{aot_blocks.STAGING}4343", (NOW - 60, NOW - 60))

    removed = aot_blocks.prune(tmp_path, ENV, now=NOW)

    assert sorted(removed) == sorted(["old-graphs", "old-failure", abandoned.name, f"current/{left.name}"])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["old-but-in-use", "current", "no-env", f"k2{aot_blocks.STAGING}4343", "not-a-folder"])
    assert sorted(p.name for p in current.iterdir()) == [aot_blocks.EXTRA + "k5", aot_blocks.META]


def test_prune_of_a_folder_not_yet_made_does_nothing(tmp_path):
    assert aot_blocks.prune(tmp_path / "absent", ENV, now=NOW) == []


def test_a_graph_that_fails_its_verification_call_leaves_no_block_installed(tmp_path, monkeypatch):
    """A fresh graph runs the warm-up again before it is saved; when that call raises (not a compile failure:
    the graph itself), the blocks must not keep a dispatch to graphs nobody will save or check."""
    import torch

    class Blk(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x):
            return self.lin(x)

    class Denoiser(torch.nn.Module):
        _repeated_blocks = ["Blk"]

        def __init__(self):
            super().__init__()
            self.blocks = torch.nn.ModuleList([Blk(), Blk()])

        def forward(self, x):
            for b in self.blocks:
                x = b(x)
            return x

    class Breaks:
        def guard_check(self, *args, **kwargs):
            return True

        def __call__(self, *args, **kwargs):
            raise RuntimeError("the graph failed on its first real call")

    model = Denoiser()
    monkeypatch.setattr(aot_blocks, "_cover", lambda graphs, *a: graphs.append(Breaks()) if not graphs else None)
    with pytest.raises(RuntimeError, match="first real call"):
        aot_blocks.install(model, tmp_path, ENV, lambda: model(torch.randn(1, 4)), "inductor", {}, lambda: None)
    assert not [b for b in model.blocks if "forward" in b.__dict__]
    assert not list(tmp_path.glob(f"*/{aot_blocks.META}"))  # nothing saved
