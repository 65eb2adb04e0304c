"""The controller's durable job/endpoint registry (SQLite in WAL mode).

The controller keeps its working state in memory (:class:`~skh.orchestrator.pinglist.JobPingLists`)
and writes every change through to this registry; it commits once per batch of requests, before it
answers or publishes anything, so an acknowledged registration survives ``kill -9``.
``synchronous=NORMAL`` in WAL mode loses nothing on a process crash (only an OS crash could lose
the last transactions), which is the failure that matters for a daemon restarted by systemd.
"""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from skh.errors import ConfigError
from skh.orchestrator.pinglist import EndpointInfo, JobPingLists
from skh.orchestrator.security import Identity
from skh.wire import pack_pairs, unpack_pairs

__all__ = ["Registry", "AgentRecord"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs(
    name TEXT PRIMARY KEY, shape TEXT NOT NULL DEFAULT '{}', version INTEGER NOT NULL DEFAULT 0,
    skeleton_version INTEGER NOT NULL DEFAULT 0, skeleton BLOB, created_ns INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS endpoints(
    ep INTEGER PRIMARY KEY, job TEXT NOT NULL, container TEXT NOT NULL, rail INTEGER NOT NULL,
    host TEXT NOT NULL, ip TEXT NOT NULL DEFAULT '', port INTEGER NOT NULL DEFAULT 0,
    gid TEXT NOT NULL DEFAULT '', qpn INTEGER NOT NULL DEFAULT 0, netdev TEXT NOT NULL DEFAULT '',
    agent TEXT NOT NULL DEFAULT '', ready INTEGER NOT NULL DEFAULT 0, updated_ns INTEGER NOT NULL,
    UNIQUE(job, container, rail));
CREATE TABLE IF NOT EXISTS agents(
    agent TEXT PRIMARY KEY, role TEXT NOT NULL, host TEXT NOT NULL, registered_ns INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS keys(
    key TEXT PRIMARY KEY, name TEXT NOT NULL, role TEXT NOT NULL, host TEXT NOT NULL,
    container TEXT NOT NULL, job TEXT NOT NULL, bound_ns INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS revoked(key TEXT PRIMARY KEY, revoked_ns INTEGER NOT NULL);
"""


@dataclass(frozen=True, slots=True)
class AgentRecord:
    agent: str
    role: str
    host: str


class Registry:
    """SQLite-backed store of jobs, endpoints (with their agent) and agents."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        try:
            self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(_SCHEMA)
        except sqlite3.Error as exc:
            raise ConfigError(f"cannot open registry database {self.path}: {exc}") from exc
        self._in_tx = False

    def close(self) -> None:
        self.commit()
        self._db.close()

    def _tx(self) -> sqlite3.Connection:
        if not self._in_tx:
            self._db.execute("BEGIN")
            self._in_tx = True
        return self._db

    def commit(self) -> None:
        if self._in_tx:
            self._db.execute("COMMIT")
            self._in_tx = False

    # one request is all or nothing: a savepoint inside the batch's transaction
    def savepoint(self) -> None:
        self._tx().execute("SAVEPOINT request")

    def release(self) -> None:
        self._db.execute("RELEASE request")

    def rollback_request(self) -> None:
        self._db.execute("ROLLBACK TO request")
        self._db.execute("RELEASE request")

    # -- writes --------------------------------------------------------------------------------
    def put_job(self, name: str, shape: dict[str, Any] | None = None) -> None:
        self._tx().execute(
            "INSERT INTO jobs(name, shape, created_ns) VALUES(?,?,?)"
            " ON CONFLICT(name) DO UPDATE SET"
            " shape=CASE WHEN excluded.shape='{}' THEN jobs.shape ELSE excluded.shape END",
            (name, json.dumps(shape or {}), time.time_ns()),
        )

    def put_version(self, job: JobPingLists) -> None:
        self._tx().execute("UPDATE jobs SET version=? WHERE name=?", (job.version, job.job))

    def put_skeleton(self, job: JobPingLists) -> None:
        blob = None if job.skeleton is None else pack_pairs(job.skeleton)
        self._tx().execute(
            "UPDATE jobs SET version=?, skeleton_version=?, skeleton=? WHERE name=?",
            (job.version, job.skeleton_version, blob, job.job),
        )

    def put_endpoint(self, info: EndpointInfo, agent: str) -> None:
        self._tx().execute(
            "INSERT INTO endpoints(ep, job, container, rail, host, ip, port, gid, qpn, netdev,"
            " agent, ready, updated_ns) VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?)"
            " ON CONFLICT(ep) DO UPDATE SET"
            " host=excluded.host, ip=excluded.ip, port=excluded.port, gid=excluded.gid,"
            " qpn=excluded.qpn, netdev=excluded.netdev, agent=excluded.agent, ready=excluded.ready,"
            " updated_ns=excluded.updated_ns",
            (
                info.ep,
                info.job,
                info.container,
                info.rail,
                info.host,
                info.ip,
                info.port,
                info.gid,
                info.qpn,
                info.netdev,
                agent,
                int(info.ready),
                time.time_ns(),
            ),
        )

    def put_ready(self, eps: list[int], ready: bool) -> None:
        now = time.time_ns()
        self._tx().executemany(
            "UPDATE endpoints SET ready=?, updated_ns=? WHERE ep=?",
            [(int(ready), now, ep) for ep in eps],
        )

    def put_agent(self, rec: AgentRecord) -> None:
        self._tx().execute(
            "INSERT INTO agents(agent, role, host, registered_ns) VALUES(?,?,?,?)"
            " ON CONFLICT(agent) DO UPDATE"
            " SET role=excluded.role, host=excluded.host, registered_ns=excluded.registered_ns",
            (rec.agent, rec.role, rec.host, time.time_ns()),
        )

    def put_key(self, ident: Identity) -> None:
        self._tx().execute(
            "INSERT OR REPLACE INTO keys(key, name, role, host, container, job, bound_ns)"
            " VALUES(?,?,?,?,?,?,?)",
            (
                ident.key,
                ident.name,
                ident.role,
                ident.host,
                ident.container,
                ident.job,
                time.time_ns(),
            ),
        )

    def delete_key(self, key: str) -> None:
        self._tx().execute("DELETE FROM keys WHERE key=?", (key,))

    def put_revoked(self, key: str) -> None:
        self._tx().execute(
            "INSERT OR IGNORE INTO revoked(key, revoked_ns) VALUES(?,?)", (key, time.time_ns())
        )

    def delete_agent(self, agent: str) -> None:
        self._tx().execute("DELETE FROM agents WHERE agent=?", (agent,))

    def delete_job(self, name: str) -> None:
        db = self._tx()
        db.execute("DELETE FROM endpoints WHERE job=?", (name,))
        db.execute("DELETE FROM jobs WHERE name=?", (name,))

    # -- reads ---------------------------------------------------------------------------------
    def load(self) -> tuple[dict[str, JobPingLists], dict[int, str], dict[str, AgentRecord]]:
        """Everything the controller holds in memory: jobs with their endpoints, the agent of
        each endpoint, and the agents."""
        self.commit()
        jobs: dict[str, JobPingLists] = {}
        for name, version, skv, blob in self._db.execute(
            "SELECT name, version, skeleton_version, skeleton FROM jobs"
        ):
            j = JobPingLists(name, version=version)
            j.skeleton_version = skv
            j.skeleton = None if blob is None else unpack_pairs(bytes(blob))
            jobs[name] = j
        owner: dict[int, str] = {}
        for row in self._db.execute(
            "SELECT ep, job, container, host, rail, ip, port, gid, qpn, netdev, ready, agent"
            " FROM endpoints"
        ):
            info = EndpointInfo(*row[:10], ready=bool(row[10]))
            jobs.setdefault(info.job, JobPingLists(info.job)).store(info)
            owner[info.ep] = row[11]
        agents = {
            a: AgentRecord(a, role, host)
            for a, role, host in self._db.execute("SELECT agent, role, host FROM agents")
        }
        return jobs, owner, agents

    def load_keys(self) -> tuple[list[Identity], list[str]]:
        """Bindings made at run time (enrolled sidecars) and the revoked keys."""
        self.commit()
        bound = [
            Identity(*row)
            for row in self._db.execute("SELECT key, name, role, host, container, job FROM keys")
        ]
        revoked = [k for (k,) in self._db.execute("SELECT key FROM revoked")]
        return bound, revoked

    def max_ep(self) -> int:
        (m,) = self._db.execute("SELECT COALESCE(MAX(ep), -1) FROM endpoints").fetchone()
        return int(m)

    def counts(self) -> dict[str, int]:
        q = self._db.execute
        return {
            "jobs": q("SELECT COUNT(*) FROM jobs").fetchone()[0],
            "endpoints": q("SELECT COUNT(*) FROM endpoints").fetchone()[0],
            "ready": q("SELECT COUNT(*) FROM endpoints WHERE ready=1").fetchone()[0],
            "agents": q("SELECT COUNT(*) FROM agents").fetchone()[0],
        }
