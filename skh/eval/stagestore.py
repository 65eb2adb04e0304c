"""Finished evaluation stages kept on disk, so that a long run resumes where it was stopped.

The full profile is hours of CPU on a small machine (six seeds at 4,096 hosts); a run that is
stopped must not lose the seeds it finished. A :class:`StageStore` is a folder holding the run's
manifest (code, profile, regime, the seeds drawn when it began and the commit it began at) and
one pickle per finished stage. A stage's result is a pure function of its arguments and of the
code, so a stored stage is reused only by a run of the same code, profile and regime, from a tree
without uncommitted changes to that code; anything else is refused with the reason, never mixed
in. The code is what the stages run: the committed trees of ``skh/`` and ``csrc/`` (the agent's
engine), so commits of tests, docs or benches in between keep a run resumable across the days it
takes, and any change to the code it measures does not.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from skh.errors import ConfigError

__all__ = ["StageStore"]

_ROOT = Path(__file__).resolve().parents[2]
#: what the stages' results depend on: the package and the engine the agent-cost stage runs
CODE = ("skh", "csrc")


def _git(root: Path, *args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def code_id(root: Path = _ROOT) -> str:
    """The committed trees of :data:`CODE` at ``HEAD`` (git tree ids), or ``"unknown"``."""
    out = _git(root, "rev-parse", *(f"HEAD:{p}" for p in CODE))
    ids = out.split() if out else []
    return "+".join(ids) if len(ids) == len(CODE) else "unknown"


def _code_is_clean(root: Path = _ROOT) -> bool:
    """No uncommitted change to :data:`CODE`."""
    out = _git(root, "status", "--porcelain", "--untracked-files=no", "--", *CODE)
    return out is not None and not out.strip()


class StageStore:
    """One evaluation's finished stages under ``root``: ``manifest.json`` and ``<stage>.pkl``."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)

    def manifest(self, key: dict[str, Any], draw: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """The run's manifest: ``key`` (what the stored results depend on: code, profile,
        regime) with what ``draw`` chose (the seeds), from disk when a stopped run of the same
        key left one, else drawn now and written. Raises :class:`ConfigError` when the stored
        run's key differs or no commit names the code."""
        if key.get("code", "unknown") == "unknown" or not _code_is_clean():
            raise ConfigError(
                "Stored stages are keyed by the committed code: commit the changes to "
                f"{' and '.join(p + '/' for p in CODE)} (or run without a stage store) first."
            )
        path = self.root / "manifest.json"
        if path.exists():
            stored = json.loads(path.read_text())
            differ = [
                f"{k}: stored {stored.get(k)!r}, now {v!r}"
                for k, v in key.items()
                if stored.get(k) != v
            ]
            if differ:
                raise ConfigError(
                    f"The stages in {self.root} come from another run ({'; '.join(differ)}): "
                    "run on that commit and profile, or give another folder."
                )
            return stored
        made = {**key, **draw()}
        self._write(path, json.dumps(made, indent=1).encode())
        return made

    def _file(self, name: str) -> Path:
        return self.root / (name.replace(" ", "_").replace("/", "_") + ".pkl")

    def has(self, name: str) -> bool:
        return self._file(name).exists()

    def load(self, name: str) -> Any | None:
        """The stored result of stage ``name``, or None when it has not finished."""
        f = self._file(name)
        if not f.exists():
            return None
        with f.open("rb") as fh:
            return pickle.load(fh)

    def save(self, name: str, value: Any) -> None:
        self._write(self._file(name), pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))

    @staticmethod
    def _write(path: Path, data: bytes) -> None:
        # whole or not at all: a run killed mid-write leaves no half a stage
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)
