"""The paper's evaluation (``skh eval``) as a benchmark: prints one JSON object.

    python bench/eval_paper.py [--quick] [--seed N] [--out DIR]

``--quick`` is the CI profile (scaled-down cluster); without it the full profile runs (4,096
hosts x 8 RNICs, hours of virtual time). See skh/eval/harness.py for what is measured.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from skh.eval import profile, run_eval  # noqa: E402
from skh.eval.report import to_html, to_markdown  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the CI profile (minutes)")
    ap.add_argument("--seed", type=int, action="append", help="seeds (default: drawn)")
    ap.add_argument("--noise", default="field")
    ap.add_argument("--out", help="also write eval.json, eval.md and eval.html here")
    a = ap.parse_args(argv)
    res = run_eval(profile("quick" if a.quick else "full"), seeds=a.seed, noise=a.noise)
    if a.out:
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "eval.json").write_text(json.dumps(res, indent=1) + "\n")
        (out / "eval.md").write_text(to_markdown(res))
        (out / "eval.html").write_text(to_html(res))
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
