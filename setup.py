"""Only the C extension lives here; metadata is in pyproject.toml.

The extension is required: a machine that cannot compile it fails the install loudly
(no pure-Python fallback of the engine exists).
"""

import glob
import os

from setuptools import Extension, setup

try:
    from Cython.Build import cythonize
except ImportError as exc:  # pragma: no cover - build-time guard
    raise RuntimeError(
        "skh needs Cython>=3.0 to build its engine: pip install 'Cython>=3.0,<4'"
    ) from exc

debug = os.environ.get("SKH_DEBUG") == "1"
cflags = ["-std=gnu11", "-Wall", "-Wextra", "-Wno-unused-parameter", "-fvisibility=hidden"]
cflags += ["-O0", "-g", "-DSKH_DEBUG=1"] if debug else ["-O2"]

ext = Extension(
    "skh._fastprobe",
    sources=["skh/_fastprobe.pyx", *sorted(glob.glob("csrc/*.c"))],
    include_dirs=["csrc"],
    extra_compile_args=cflags,
    libraries=["pthread"],
    define_macros=[("_GNU_SOURCE", "1")],
)

setup(
    ext_modules=cythonize(
        [ext],
        language_level=3,
        compiler_directives={"embedsignature": True, "boundscheck": debug, "wraparound": False},
    )
)
