"""The controller's trusted-key directory is looked at file by file only when it changed: a
certificate added or removed is seen at the next check, an unchanged directory costs one stat
(10,240 certificates stat-ed every 2 s took 45 % of a loaded controller's CPU)."""

import time

from skh.orchestrator import authz
from skh.orchestrator.authz import KeyBook
from skh.orchestrator.security import generate_keypair


def _cert(secret, trusted, name):
    meta = {"role": "overlay", "host": "h", "job": "j", "container": name}
    pub, _sec = generate_keypair(secret, name, metadata=meta, durable=False)
    (trusted / f"{name}.key").write_bytes(pub.read_bytes())


def test_the_trusted_directory_is_scanned_only_when_it_changed(tmp_path, monkeypatch):
    secret, trusted = tmp_path / "secret", tmp_path / "trusted"
    secret.mkdir()
    trusted.mkdir()
    for name in ("a", "b"):
        _cert(secret, trusted, name)
    book = KeyBook(str(trusted), reload_s=0.0, full_scan_s=3600.0)
    assert book.by_name("a") and book.by_name("b")
    time.sleep(2.1)  # a stamp is trusted once the directory's last change is 2 s old
    scans = []
    real = authz._dir_signature
    monkeypatch.setattr(authz, "_dir_signature", lambda d: scans.append(d) or real(d))
    assert not book.refresh()  # the stamp is taken (one scan), nothing changed
    assert not book.refresh() and not book.refresh()
    assert len(scans) == 1
    (trusted / "a.key").unlink()  # a removal revokes at the next check
    assert book.refresh() and book.by_name("a") is None and len(scans) == 2
    _cert(secret, trusted, "c")  # an addition is seen at the next check
    assert book.refresh() and book.by_name("c")
    # every full_scan_s the files are looked at anyway (one rewritten in place)
    book.full_scan_s = 0.0
    n = len(scans)
    book.refresh()
    assert len(scans) == n + 1
