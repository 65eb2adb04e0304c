"""The three layers import only downward (DESIGN §10): csrc/ knows nothing of Python,
skh/analysis/ knows neither the engine nor the orchestrator, nor the simulator; the simulator's
own pieces live in skh/sim/, not among the real collectors."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def test_analysis_imports_neither_engine_nor_orchestrator():
    files = sorted((ROOT / "skh" / "analysis").rglob("*.py"))
    assert files, "skh/analysis is empty"
    forbidden = (
        "skh.probe",
        "skh._fastprobe",
        "skh.orchestrator",
        "skh.cli",
        "skh.testbed",
        "skh.sim",
        "skh.eval",
        "skh.demo",
        "zmq",
    )
    offenders = {
        str(f.relative_to(ROOT)): sorted(n for n in _imports(f) if n.startswith(forbidden))
        for f in files
    }
    assert not {k: v for k, v in offenders.items() if v}


def test_collectors_are_real_not_the_simulator():
    for f in sorted((ROOT / "skh" / "collect").glob("*.py")):
        bad = [n for n in _imports(f) if n.startswith(("skh.sim", "skh.eval"))]
        assert not bad, (f.name, bad)


def test_the_deployed_orchestrator_needs_no_test_rig():
    """The agents and the analyzer run on real hosts: what they share with the namespace testbed
    (namespace entry, net/dev counters) lives in skh/collect, below both."""
    for f in sorted((ROOT / "skh" / "orchestrator").rglob("*.py")):
        bad = [n for n in _imports(f) if n.startswith(("skh.testbed", "skh.demo", "skh.sim"))]
        assert not bad, (str(f.relative_to(ROOT)), bad)


def test_csrc_is_plain_c():
    for f in sorted((ROOT / "csrc").glob("*.[ch]")):
        assert not re.search(r'#\s*include\s*[<"]Python\.h', f.read_text()), (
            f"{f.name} includes Python.h"
        )


def test_shared_modules_stay_neutral():
    for name in (
        "model.py",
        "records.py",
        "layout.py",
        "errors.py",
        "failures.py",
        "probeplan.py",
        "policy.py",
    ):
        bad = [
            n
            for n in _imports(ROOT / "skh" / name)
            if n.startswith(("skh.orchestrator", "skh.probe", "skh._fastprobe", "skh.sim"))
            or n.startswith(("skh.analysis", "skh.collect", "skh.eval"))
        ]
        assert not bad, (name, bad)
