"""Verbs tests: ``verbs``-marked ones need real RDMA devices and run inside the soft-RoCE VM
(``make test-verbs``: tools/rxe-vm/run-in-rxe-vm.sh). Outside the VM they are skipped with the
reason; inside it (RXEVM=1) they must run, so a missing rxe0 is an error, never a skip.
Unmarked tests here are pure-logic tests that run everywhere."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import pytest

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


@pytest.fixture(scope="session")
def verbs_util(tmp_path_factory, c_builder) -> ctypes.CDLL:
    return ctypes.CDLL(str(c_builder(tmp_path_factory.mktemp("vu"), "vu", ["csrc/verbs_util.c"])))
