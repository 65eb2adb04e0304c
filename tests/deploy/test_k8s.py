"""deploy/k8s without a cluster: every manifest against the Kubernetes API's own JSON schemas
(kubernetes-validate, strict: unknown fields are errors), their cross-references (Services to
pods, mounts to volumes, the daemons' settings to skh's config), and whether each container can
open the key files it is told to, as the user it runs as.

That last check applies the kubelet's rules for the volume the key comes from (a Secret's files
are root-owned with ``defaultMode``; with a pod ``fsGroup`` they are group-owned by it and
group-readable, mode | 0440; an emptyDir is a 0777 directory; a hostPath file is the host's), lays
the file out that way on disk and lets the kernel decide: the reader runs as the container's
uid, gid and supplementary groups, without capabilities when the container drops them all.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from skh.orchestrator.config import load_config, parse_override

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
EXAMPLE = ROOT / "deploy" / "skh.example.toml"
#: the oldest Kubernetes release the manifests must be valid for, and the newest schemas bundled
VERSIONS = ("1.30.0", kubernetes_validate.utils.latest_version())


def documents() -> list[tuple[str, int, dict]]:
    out = []
    for path in sorted(K8S.glob("*.yaml")):
        for i, doc in enumerate(yaml.safe_load_all(path.read_text())):
            if doc is not None:
                out.append((path.name, i, doc))
    return out


DOCS = documents()


def pod_specs() -> list[tuple[str, dict]]:
    """(name, pod spec) of every workload; a StatefulSet's claim templates join its volumes."""
    out = []
    for name, _i, doc in DOCS:
        if doc["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
            pod = dict(doc["spec"]["template"]["spec"])
            claims = doc["spec"].get("volumeClaimTemplates", [])
            pod["volumes"] = [
                *pod["volumes"],
                *({"name": t["metadata"]["name"], "persistentVolumeClaim": {}} for t in claims),
            ]
            out.append((f"{name}:{doc['metadata']['name']}", pod))
    return out


def skh_containers() -> list[tuple[str, dict, dict]]:
    return [
        (f"{where}/{c['name']}", pod, c)
        for where, pod in pod_specs()
        for c in pod["containers"]
        if "/skh/skh:" in c["image"]
    ]


def test_every_manifest_is_found():
    kinds = sorted((name, doc["kind"]) for name, _i, doc in DOCS)
    assert kinds == [
        ("analyzer.yaml", "Service"),
        ("analyzer.yaml", "StatefulSet"),
        ("controller.yaml", "Service"),
        ("controller.yaml", "StatefulSet"),
        ("namespace.yaml", "Namespace"),
        ("overlay-sidecar.yaml", "Job"),
        ("underlay-daemonset.yaml", "DaemonSet"),
    ]


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize(("name", "index", "doc"), DOCS, ids=lambda x: str(x)[:24])
def test_manifest_matches_the_kubernetes_schema(name, index, doc, version):
    kubernetes_validate.validate(doc, version, strict=True)


def test_the_schema_check_can_fail():
    (_name, _i, doc) = next(d for d in DOCS if d[2]["kind"] == "StatefulSet")
    bad = yaml.safe_load(yaml.safe_dump(doc))
    bad["spec"]["template"]["spec"]["containers"][0]["securityContext"]["runAsNonRot"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, VERSIONS[0], strict=True)


def test_services_reach_their_pods_by_named_ports():
    services = [doc for _n, _i, doc in DOCS if doc["kind"] == "Service"]
    assert services
    for svc in services:
        selector = svc["spec"]["selector"]
        (pod,) = [
            doc["spec"]["template"]
            for _n, _i, doc in DOCS
            if doc["kind"] == "StatefulSet"
            and selector.items() <= doc["spec"]["template"]["metadata"]["labels"].items()
        ]
        names = {p["name"] for c in pod["spec"]["containers"] for p in c.get("ports", [])}
        for port in svc["spec"]["ports"]:
            assert port["targetPort"] in names, (svc["metadata"]["name"], port)


def test_every_mount_names_a_volume_and_every_skh_container_is_locked_down():
    for where, pod in pod_specs():
        volumes = {v["name"] for v in pod["volumes"]}
        for c in pod["containers"]:
            for m in c.get("volumeMounts", []):
                assert m["name"] in volumes, (where, m)
    for where, pod, c in skh_containers():
        sc = c["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False, where
        assert sc["readOnlyRootFilesystem"] is True, where
        assert sc["capabilities"]["drop"] == ["ALL"], where
        uid = sc.get("runAsUser", pod.get("securityContext", {}).get("runAsUser"))
        non_root = sc.get("runAsNonRoot", pod.get("securityContext", {}).get("runAsNonRoot"))
        assert uid is not None and (uid == 0 or non_root is True), where


def _overrides(c: dict) -> dict[str, object]:
    return dict(
        parse_override(a.removeprefix("--set=")) for a in c["args"] if a.startswith("--set=")
    )


def test_the_daemons_settings_are_skh_settings():
    """Every --set a manifest passes names a real setting of a valid config (with the example
    config underneath, as the ConfigMaps are made from it); $(VAR)s stand in as plain text."""
    for where, _pod, c in skh_containers():
        load_config(str(EXAMPLE), _overrides(c))
        assert c["args"][0] == "--log-json", where


# -- who can open which key ------------------------------------------------------------------


@dataclass(frozen=True)
class Process:
    uid: int
    gid: int
    groups: tuple[int, ...]
    caps: bool  # False: every capability dropped


@dataclass(frozen=True)
class KeyFile:
    """How the kubelet (or the host) lays a key file out for a container."""

    kind: str  # "secret": read an existing file; "emptyDir": the daemon makes it there
    uid: int
    gid: int
    mode: int


def process_of(pod: dict, c: dict) -> Process:
    psc, sc = pod.get("securityContext", {}), c.get("securityContext", {})
    uid = sc.get("runAsUser", psc.get("runAsUser", 0))
    gid = sc.get("runAsGroup", psc.get("runAsGroup", 0))
    groups = tuple(
        g for g in (psc.get("fsGroup"), *psc.get("supplementalGroups", ())) if g is not None
    )
    caps = sc.get("capabilities", {}).get("drop") != ["ALL"]
    return Process(uid, gid, groups, caps)


def key_file(pod: dict, c: dict, path: str) -> KeyFile:
    """The file a container finds at ``path``, from the volume mounted over it."""
    mount = max(
        (m for m in c["volumeMounts"] if path.startswith(m["mountPath"].rstrip("/") + "/")),
        key=lambda m: len(m["mountPath"]),
    )
    (vol,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    fs_group = pod.get("securityContext", {}).get("fsGroup")
    if "secret" in vol:
        mode = vol["secret"].get("defaultMode", 0o644)
        if fs_group is not None:  # SetVolumeOwnership: read-only volume, group | 0440
            return KeyFile("secret", 0, fs_group, mode | 0o440)
        return KeyFile("secret", 0, 0, mode)
    if "emptyDir" in vol:
        return KeyFile("emptyDir", 0, fs_group or 0, 0o777 | (0o2000 if fs_group else 0))
    if "hostPath" in vol:  # provisioned on the host: root-owned 0600 (docs/trust.md)
        return KeyFile("secret", 0, 0, 0o600)
    raise AssertionError(f"{path}: a key must come from a Secret, an emptyDir or the host")


def fresh(d: Path) -> Path:
    d.mkdir()
    return d


def can_open(proc: Process, key: KeyFile, tmp: Path) -> subprocess.CompletedProcess[str]:
    """Lay ``key`` out under ``tmp`` and let ``proc`` read it (a Secret's or the host's file)
    or create, write and read back its own 0600 key (an emptyDir), the kernel deciding."""
    tmp.chmod(0o755)
    if key.kind == "emptyDir":
        d = tmp / "vol"
        d.mkdir()
        os.chown(d, key.uid, key.gid)
        d.chmod(key.mode)
        target = d / "agent.key_secret"
        script = (
            "import os, sys; p = sys.argv[1]; "
            "fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600); "
            "os.write(fd, b'secret'); os.close(fd); print(open(p).read())"
        )
        argv = ["/usr/bin/python3", "-c", script, str(target)]
    else:
        target = tmp / "agent.key_secret"
        target.write_text("secret")
        os.chown(target, key.uid, key.gid)
        target.chmod(key.mode)
        argv = ["/bin/cat", str(target)]
    if not proc.caps:
        argv = ["setpriv", "--bounding-set=-all", "--inh-caps=-all", "--", *argv]
    return subprocess.run(
        argv,
        user=proc.uid,
        group=proc.gid,
        extra_groups=list(proc.groups),
        capture_output=True,
        text=True,
        check=False,
    )


def secret_paths(c: dict) -> list[str]:
    return sorted(
        {str(v) for k, v in _overrides(c).items() if k.endswith("_secret_key")},
    )


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="sets file owners and the reader's uid")


@pytest.fixture
def open_tmp():
    """A directory any user can traverse (pytest's tmp_path sits under a 0700 root directory)."""
    d = Path(tempfile.mkdtemp(prefix="skh-k8s-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d)


@pytest.mark.root
@needs_root
@pytest.mark.parametrize(("where", "pod", "c"), skh_containers(), ids=lambda x: str(x)[:40])
def test_each_container_can_open_its_key_as_its_user(where, pod, c, open_tmp):
    paths = secret_paths(c)
    assert paths, f"{where} names no secret key"
    proc = process_of(pod, c)
    for i, path in enumerate(paths):
        key = key_file(pod, c, path.replace("$(NODE_NAME)", "node"))
        done = can_open(proc, key, fresh(open_tmp / str(i)))
        assert done.returncode == 0 and done.stdout.strip() == "secret", (where, path, done.stderr)


@pytest.mark.root
@needs_root
def test_a_non_root_user_cannot_open_a_root_only_secret(open_tmp):
    """What the old sidecar manifest did (runAsUser 65532, a Secret with defaultMode 0400, no
    fsGroup): the check refuses it, so it can fail."""
    pod = {
        "volumes": [{"name": "keys", "secret": {"secretName": "k", "defaultMode": 0o400}}],
    }
    c = {
        "securityContext": {"runAsUser": 65532, "capabilities": {"drop": ["ALL"]}},
        "volumeMounts": [{"name": "keys", "mountPath": "/etc/skh/keys"}],
    }
    key = key_file(pod, c, "/etc/skh/keys/agent.key_secret")
    assert (key.uid, key.gid, key.mode) == (0, 0, 0o400)
    done = can_open(process_of(pod, c), key, fresh(open_tmp / "u"))
    assert done.returncode != 0 and "Permission denied" in done.stderr
    # root without capabilities still reads its own 0600 file
    root = Process(0, 0, (), caps=False)
    assert can_open(root, KeyFile("secret", 0, 0, 0o600), fresh(open_tmp / "r")).returncode == 0


def test_sidecars_reach_their_hosts_enrolment_socket_and_it_can_attest_them():
    """The sidecar's --enrol-socket lies in the host directory the DaemonSet serves it from,
    and the underlay agent can see which container a caller is in: the host's PIDs (SO_PEERCRED
    gives 0 for a process outside its PID namespace) and SYS_PTRACE to read /proc/PID/ns/net of
    another user's process (docs/trust.md, enrolment step 3)."""

    def socket_dir(pod: dict, c: dict) -> str:
        (sock,) = [a.split("=", 1)[1] for a in c["args"] if a.startswith("--enrol-socket=")]
        mount = next(m for m in c["volumeMounts"] if sock.startswith(m["mountPath"] + "/"))
        (vol,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
        return vol["hostPath"]["path"] + sock.removeprefix(mount["mountPath"])

    by_role = {
        next(a for a in c["args"] if a.startswith("--role=")): (pod, c)
        for _w, pod, c in skh_containers()
        if any(a.startswith("--role=") for a in c["args"])
    }
    (upod, uc), (spod, sc) = by_role["--role=underlay"], by_role["--role=overlay"]
    assert socket_dir(upod, uc) == socket_dir(spod, sc) == "/run/skh/enrol.sock"
    assert upod["hostPID"] is True
    assert "SYS_PTRACE" in uc["securityContext"]["capabilities"]["add"]


def test_the_controller_and_the_analyzer_read_the_same_fabric_file():
    """The controller plans each skeleton link by link from the fabric (docs/probing.md), the
    analyzer localizes on it: both are told where it is and find it there, from one ConfigMap."""
    found = {}
    for where, pod, c in skh_containers():
        path = _overrides(c).get("controller.fabric") or _overrides(c).get("analyzer.fabric")
        if path is None:
            continue
        mount = next(m for m in c["volumeMounts"] if m["mountPath"] == path)
        (vol,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
        found[where.split(":")[0]] = (path, vol["configMap"]["name"], mount.get("subPath"))
    assert set(found) == {"controller.yaml", "analyzer.yaml"}, found
    assert len(set(found.values())) == 1, found
