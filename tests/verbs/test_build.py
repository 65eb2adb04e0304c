"""How the verbs transport is built and degrades (host tests): libibverbs is never linked into the
extension, and each way of lacking RDMA is reported as unavailable with its reason, while the UDP
transport stays."""

from __future__ import annotations

import ctypes
import errno
import shutil
import subprocess
from pathlib import Path

import pytest

from skh import _fastprobe
from skh.errors import CapabilityError
from skh.probe import Engine, capabilities

SO = Path(_fastprobe.__file__)
ROOT = Path(__file__).resolve().parents[2]


class Ops(ctypes.Structure):  # the head of struct skh_transport_ops
    _fields_ = [("name", ctypes.c_char_p), ("available", ctypes.CFUNCTYPE(ctypes.c_int))]


def test_extension_does_not_link_libibverbs():
    readelf = shutil.which("readelf")
    assert readelf, "binutils (readelf) is part of build-essential"
    dyn = subprocess.run(
        [readelf, "-d", str(SO)], check=True, capture_output=True, text=True
    ).stdout
    needed = [line for line in dyn.splitlines() if "(NEEDED)" in line]
    assert needed and not [n for n in needed if "ibverbs" in n or "rdmacm" in n or "mlx" in n], (
        needed
    )
    syms = subprocess.run(
        ["nm", "-D", "--undefined-only", str(SO)], check=True, capture_output=True, text=True
    ).stdout.split()
    assert not [s for s in syms if s.startswith(("ibv_", "_ibv_"))], (
        "an inline of verbs.h leaked a symbol"
    )


def _transport(c_builder, tmp_path, *flags) -> ctypes.CDLL:
    lib = ctypes.CDLL(
        str(
            c_builder(
                tmp_path,
                "verbs",
                [str(p.relative_to(ROOT)) for p in sorted((ROOT / "csrc").glob("verbs*.c"))]
                + ["csrc/proto.c"],
                "-lpthread",
                *flags,
            )
        )
    )
    lib.skh_verbs_strerror.restype = ctypes.c_char_p
    return lib


def test_built_without_headers_reports_why(c_builder, tmp_path):
    lib = _transport(c_builder, tmp_path, "-DSKH_NO_VERBS")
    ops = Ops.in_dll(lib, "skh_transport_verbs")
    assert ops.name == b"verbs"
    assert ops.available() == -errno.EOPNOTSUPP
    assert lib.skh_verbs_strerror().startswith(b"unavailable: built without libibverbs headers")


def test_missing_libibverbs_reports_the_dlerror(c_builder, tmp_path):
    lib = _transport(c_builder, tmp_path, '-DSKH_IBVERBS_SONAME="libibverbs-skhv-absent.so.1"')
    ops = Ops.in_dll(lib, "skh_transport_verbs")
    assert ops.available() == -errno.EOPNOTSUPP
    msg = lib.skh_verbs_strerror().decode()
    assert msg.startswith(
        "libibverbs unavailable: libibverbs-skhv-absent.so.1: cannot open shared object file"
    )


@pytest.mark.skipif(
    Path("/sys/class/infiniband_verbs").exists(), reason="this kernel has RDMA support"
)
def test_kernel_without_rdma_leaves_udp():
    caps = capabilities()
    assert "udp" in caps and "verbs" not in caps
    with pytest.raises(
        CapabilityError, match=r"no RDMA devices \(kernel has no RDMA support\)"
    ) as exc:
        Engine(transport="verbs")
    assert exc.value.errno == errno.ENODEV
    with Engine() as e:  # UDP still works
        assert e.local_port > 0
