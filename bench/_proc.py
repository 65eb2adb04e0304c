"""Process accounting shared by the probe benches: kept import-light, because the engine worker
that imports it is the process whose RSS is measured."""

import resource


def _rss_mb(field: str = "VmRSS") -> float:
    """Resident MB: ``VmRSS`` in all, or ``RssAnon`` (the process's own memory; ``RssFile``, the
    shared libraries' pages, depends on how much of their files the page cache holds: a freshly
    built venv maps ~5 MB more of numpy's libraries than a cold one)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime
