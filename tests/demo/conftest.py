"""Headless Chromium for the report tests (Debian's ``chromium``; tools/setup-debian.sh
installs it)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest


@pytest.fixture
def chromium():
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.skip("chromium is not installed (apt-get install chromium)")

    def render(page: Path, png: Path) -> str:
        """Screenshot ``page`` into ``png`` and return the DOM Chromium built from it."""
        base = [
            exe,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--window-size=1200,2000",
        ]
        subprocess.run(
            [*base, f"--screenshot={png}", page.resolve().as_uri()],
            capture_output=True,
            timeout=120,
            check=True,
        )
        data = png.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n"
        dom = subprocess.run(
            [*base, "--dump-dom", page.resolve().as_uri()],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        ).stdout
        return dom

    return render
