"""Verbs tests: ``verbs``-marked ones need real RDMA devices and run inside the soft-RoCE VM
(``make test-verbs``: tools/rxe-vm/run-in-rxe-vm.sh). Outside the VM they are skipped with the
reason; inside it (RXEVM=1) they must run, so a missing rxe0 is an error, never a skip.
Unmarked tests here are pure-logic tests that run everywhere."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
IN_VM = os.environ.get("RXEVM") == "1"


def rxe_devices() -> list[str]:
    base = Path("/sys/class/infiniband")
    return sorted(p.name for p in base.iterdir()) if base.is_dir() else []


@pytest.fixture(autouse=True)
def _verbs_gate(request):
    if request.node.get_closest_marker("verbs") is None:
        return
    if not IN_VM:
        pytest.skip("needs the soft-RoCE VM (RXEVM=1): run `make test-verbs`")
    devs = rxe_devices()
    if "rxe0" not in devs or "rxe1" not in devs:
        pytest.fail(f"RXEVM=1 but rxe0/rxe1 are missing (found {devs}): the VM set-up is broken")


def build_c(tmp_dir: Path, name: str, sources: list[str], *flags: str) -> Path:
    """Compiles csrc sources into a shared library for ctypes (the code that ships, unmodified)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.fail("no C compiler: the project cannot build without one")
    out = tmp_dir / f"lib{name}.so"
    cmd = [
        cc,
        "-std=gnu11",
        "-O2",
        "-fPIC",
        "-shared",
        "-D_GNU_SOURCE",
        f"-I{ROOT / 'csrc'}",
        "-Wall",
        "-Wextra",
        "-Wno-unused-parameter",
        "-Wno-comment",
        "-Werror",
        *flags,
        "-o",
        str(out),
        *[str(ROOT / s) if s.startswith("csrc/") else s for s in sources],
    ]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return out


@pytest.fixture(scope="session")
def c_builder():
    """``build_c`` as a fixture (test modules cannot import conftest under importlib mode)."""
    return build_c


@pytest.fixture(scope="session")
def verbs_util(tmp_path_factory) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(build_c(tmp_path_factory.mktemp("vu"), "vu", ["csrc/verbs_util.c"])))
    return lib
