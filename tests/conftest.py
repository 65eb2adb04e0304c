import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def pytest_collection_modifyitems(config, items):
    """Tests marked ``root`` skip only when not root and not in CI; CI runs as root and must
    run them."""
    if os.geteuid() == 0:
        return
    if os.environ.get("CI") == "true":
        raise pytest.UsageError("CI must run as root: root-marked tests would be skipped")
    skip = pytest.mark.skip(reason="needs root (network namespaces)")
    for item in items:
        if "root" in item.keywords:
            item.add_marker(skip)


def build_c(tmp_dir: Path, name: str, sources: list[str], *flags: str) -> Path:
    """Compiles C sources (``csrc/...`` paths are the code that ships, unmodified) into a shared
    library for ctypes or LD_PRELOAD."""
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
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        pytest.fail(f"{' '.join(cmd)} failed:\n{done.stderr}")
    return out


@pytest.fixture(scope="session")
def c_builder():
    """``build_c`` as a fixture (test modules cannot import conftest under importlib mode)."""
    return build_c
