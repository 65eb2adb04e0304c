"""docs/alerts.md is enough: every code block in it runs, in document order, in one scratch
directory, against a running analyzer (with a webhook receiver and a real Alertmanager for the
bridge examples). ``python`` and ``sh`` blocks must exit 0; ``json`` blocks that are records
must validate against the schema; ``toml`` blocks must pass the config's validation; ``text``
blocks are sample output. Any other block type fails the test, so nothing goes unchecked."""

from __future__ import annotations

import http.server
import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import jsonschema
import pytest

from skh.orchestrator.alerts import alert_schema
from skh.orchestrator.config import load_config

ROOT = Path(__file__).resolve().parents[2]
BUS_SPEED = 1000.0  # these need the finished log, not a live one
DOC = ROOT / "docs" / "alerts.md"

pytestmark = pytest.mark.system


def _blocks() -> list[tuple[str, str, int]]:
    text = DOC.read_text()
    out = []
    for m in re.finditer(r"^```(\w*)\n(.*?)^```\s*$", text, re.S | re.M):
        out.append((m.group(1), m.group(2), text[: m.start()].count("\n") + 1))
    return out


class _Ok(http.server.BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 - http.server's name
        self.server.got.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_every_code_block_of_the_docs_runs(bus, alertmanager, tmp_path):
    blocks = _blocks()
    kinds = {k for k, _b, _l in blocks}
    assert {"python", "sh", "json", "toml"} <= kinds, kinds
    hook = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Ok)
    hook.got = []
    threading.Thread(target=hook.serve_forever, daemon=True).start()
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        # `skh` and `python3` as a reader who installed skh has them
        "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        "SKH_ALERTS": bus.alerts,
        "SKH_REPLAY": bus.replay,
        "SKH_SERVER_KEY": str(bus.server_key),
        "SKH_CLIENT_KEY": str(bus.client_key),
        "SKH_WEBHOOK": f"http://127.0.0.1:{hook.server_address[1]}/hook",
        "SKH_ALERTMANAGER": alertmanager,
    }
    log = bus.records()
    validator = jsonschema.Draft202012Validator(alert_schema())
    try:
        for kind, body, line in blocks:
            where = f"docs/alerts.md:{line} ({kind})"
            if kind in ("python", "sh"):
                cmd = (
                    [sys.executable, "-c", body]
                    if kind == "python"
                    else ["bash", "-euo", "pipefail", "-c", body]
                )
                out = subprocess.run(
                    cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
                )
                assert out.returncode == 0, (where, out.stdout[-2000:], out.stderr[-3000:])
            elif kind == "json":
                rec = json.loads(body)
                if "alert" in rec:
                    errors = [e.message for e in validator.iter_errors(rec)]
                    assert not errors, (where, errors)
            elif kind == "toml":
                cfg = tmp_path / "block.toml"
                cfg.write_text(body)
                load_config(cfg)
            else:
                assert kind == "text", f"{where}: unchecked block type {kind!r}"
    finally:
        hook.shutdown()
        hook.server_close()
    # what the blocks did reached their targets: the whole log through the webhook bridge,
    # and the replay example saw it all
    assert [r["seq"] for r in hook.got] == [r["seq"] for r in log]
    assert int((tmp_path / "py.seq").read_text()) == len(log)
    assert int((tmp_path / "c.seq").read_text()) == len(log)
    lines = (tmp_path / "alerts.jsonl").read_text().splitlines()
    assert [json.loads(x) for x in lines] == log
    assert (tmp_path / "keys" / "my-subscriber.key_secret").stat().st_mode & 0o077 == 0
