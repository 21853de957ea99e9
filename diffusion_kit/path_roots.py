"""Which paths a caller may name: only those that resolve, symlinks followed, inside the configured roots.

A path outside every root is refused with PERMISSION_DENIED *before* anything looks whether it
exists, so the answer says nothing about the rest of the file system. Files found inside a
confined folder (a dataset's images and captions, a pipeline's components) are confined again
one by one, since a symlink inside a root may point anywhere.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from service_kit.errors import InvalidArgument, PermissionDenied, clip


def default_data_dir() -> Path:
    return Path(os.environ.get("XDG_DATA_HOME", Path.home() / ".local" / "share")) / "diffusion-services"


def hub_cache_dir() -> Path:
    """Where huggingface_hub keeps downloads (HF_HUB_CACHE, HF_HOME): a model root by default."""
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


@dataclass(frozen=True)
class Roots:
    """The folders a kind of path must stay in, e.g. the model roots; `flag` names how to widen them."""

    dirs: tuple[Path, ...]
    flag: str

    @classmethod
    def of(cls, dirs, flag: str) -> "Roots":
        return cls(tuple(Path(os.path.realpath(Path(d).expanduser())) for d in dirs), flag)

    def confine(self, raw: str, field: str) -> Path:
        """The resolved path of a caller's `raw` path; PERMISSION_DENIED when it leaves every root."""
        if not raw:
            raise InvalidArgument(f"{field} is required", reason="MISSING_PATH", field=field)
        if raw.startswith("~"):
            if not (raw == "~" or raw.startswith("~/")):
                raise InvalidArgument(f"{field} may start with '~/' (this service's home) but not name another "
                                      f"user's home: {clip(raw)}", reason="BAD_PATH", field=field)
            raw = str(Path.home()) + raw[1:]
        if not os.path.isabs(raw):
            raise InvalidArgument(f"{field} must be an absolute path, got {clip(raw)}", reason="BAD_PATH", field=field)
        resolved = Path(os.path.realpath(raw))
        self.check(resolved, field)
        return resolved

    def check(self, resolved: Path, what: str) -> None:
        if not any(resolved == root or resolved.is_relative_to(root) for root in self.dirs):
            raise PermissionDenied(
                f"{what} is outside the directories this service may read ({self.flag}: "
                f"{', '.join(str(d) for d in self.dirs) or 'none'}); the operator widens them with {self.flag}",
                reason="PATH_NOT_ALLOWED", metadata={"field": what})

    def confine_found(self, path: Path, what: str) -> Path:
        """A file found inside a confined folder, resolved and confined itself (symlinks may point anywhere)."""
        resolved = Path(os.path.realpath(path))
        self.check(resolved, what)
        return resolved

    def confine_tree(self, folder: Path, what: str) -> None:
        """Every file under a confined folder stays inside the roots (a pipeline directory's components)."""
        for dirpath, dirnames, filenames in os.walk(folder, followlinks=False):
            for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
                full = Path(dirpath) / name
                self.confine_found(full, f"{what}: {full.relative_to(folder)}")
