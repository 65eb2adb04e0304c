"""Another git revision of this repository as a folder, for the benches' ``--against REV``."""

import contextlib
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def revision_tree(rev: str) -> Iterator[Path]:
    """Revision ``rev`` exported (``git archive``) to a temporary folder with its own C extension
    built in place (its engine may differ from this tree's); removed on exit."""
    with tempfile.TemporaryDirectory(prefix="skh-rev-") as tmp:
        tree = Path(tmp) / "tree"
        tree.mkdir()
        archive = subprocess.run(
            ["git", "archive", rev], cwd=ROOT, capture_output=True, check=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
        build = subprocess.run(
            [sys.executable, "setup.py", "build_ext", "--inplace"],
            cwd=tree,
            capture_output=True,
            text=True,
        )
        if build.returncode:
            raise SystemExit(f"{rev}: the extension did not build\n{build.stderr[-3000:]}")
        shutil.rmtree(tree / "build", ignore_errors=True)
        yield tree
