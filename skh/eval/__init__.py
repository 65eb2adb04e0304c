"""The evaluation harness: the paper's tables (detection, localization, probing cost, skeleton
coverage, random sampling, agent cost) on the production-scale simulator, side by side with the
paper's figures. ``skh eval`` and ``bench/eval_paper.py`` run it; :mod:`skh.eval.report` renders
the JSON as Markdown and HTML."""

from skh.eval.harness import MAXIMA, PAPER, THRESHOLDS, run_eval
from skh.eval.profiles import PROFILES, Profile, profile

__all__ = ["run_eval", "PROFILES", "Profile", "profile", "THRESHOLDS", "MAXIMA", "PAPER"]
