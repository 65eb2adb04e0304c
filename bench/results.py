"""The full evaluation profile, and the pages generated from it: prints one JSON object.

    python bench/results.py [--from DIR/eval.json] [--out DIR] [--seed N ...] [--workers N]
    python bench/results.py --quick   # the generation path on the tiny profile, into --out only

Runs ``skh eval --full`` (4,096 hosts x 8 RNICs, five seeds of the field regime and one held-out
seed of field-heavy; the stages run in ``--workers`` processes) into ``--out``
(default ``build/results``; each finished stage is kept in ``--out``/stages, so a run that is
stopped resumes with the same seeds on the same code, ``skh/`` and ``csrc/`` as committed, across
commits of anything else: six seeds at 4,096 hosts were 20-38 min of CPU each), then regenerates
``docs/results.md`` and the README's results section from its ``eval.json``
(:func:`skh.eval.report.results_page`, :func:`skh.eval.report.readme_section`): no figure on
either page is typed by hand. ``--from`` regenerates the pages from an earlier run's
``eval.json`` without running anything.
``make results`` runs it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from skh.eval import profile, run_eval  # noqa: E402
from skh.eval.report import (  # noqa: E402
    readme_section,
    replace_readme_section,
    results_page,
    to_html,
    to_markdown,
)
from skh.eval.stagestore import StageStore  # noqa: E402


def write_pages(res: dict, root: Path = ROOT, docs: Path | None = None) -> list[str]:
    """``docs/results.md`` and the README's results section from one full-profile result
    (``docs``: write both pages there instead, from any profile)."""
    if docs is None and res["meta"]["profile"] != "full":
        raise SystemExit(f"the pages come from the full profile, not {res['meta']['profile']!r}")
    page = (docs or root / "docs") / "results.md"
    readme_in = root / "README.md"
    readme_out = (docs / "README.md") if docs else readme_in
    page.write_text(results_page(res))
    readme_out.write_text(replace_readme_section(readme_in.read_text(), readme_section(res)))
    return [str(page), str(readme_out)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--from", dest="src", help="an earlier full run's eval.json: pages only")
    ap.add_argument("--out", default=str(ROOT / "build" / "results"), help="run output folder")
    ap.add_argument("--seed", type=int, action="append", help="seeds (default: drawn)")
    ap.add_argument("--workers", type=int, help="stage worker processes (default: one per CPU)")
    ap.add_argument(
        "--quick", action="store_true", help="tiny profile, pages into --out (a smoke test)"
    )
    a = ap.parse_args(argv)
    out = Path(a.out)
    if a.src:
        res = json.loads(Path(a.src).read_text())
    else:
        name = "tiny" if a.quick else "full"
        store = None if a.quick else StageStore(out / "stages")
        res = run_eval(
            profile(name), seeds=a.seed, workers=a.workers, agent=not a.quick, store=store
        )
        out.mkdir(parents=True, exist_ok=True)
        (out / "eval.json").write_text(json.dumps(res, indent=1) + "\n")
        (out / "eval.md").write_text(to_markdown(res))
        (out / "eval.html").write_text(to_html(res))
    written = write_pages(res, docs=out if a.quick else None)
    print(json.dumps({"written": written, "timings": res.get("timings", {})}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
