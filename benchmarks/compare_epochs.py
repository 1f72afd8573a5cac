"""Compare two triangle runs epoch by epoch, over the epochs both runs completed.

A variant stopped at the time limit completes a different number of epochs in each run,
and the later epochs of oregon1 are the heavy ones, so percentiles over all epochs done
compare different work. This compares the same epochs: for each variant in both files
(``benchmarks/results/triangles-epochs.json``, written by ``triangles.py``), the total,
median, 90th and 99th percentile (nearest rank) and slowest epoch of the common prefix,
after / before, and the slowest epochs of each run with their numbers.

    python benchmarks/compare_epochs.py BEFORE.json AFTER.json
"""

from __future__ import annotations

import argparse
import json

import numpy as np


def figures(times: list[float]) -> dict[str, float]:
    """Total, percentiles (nearest rank) and maximum of epoch times."""
    x = np.asarray(times, dtype=float)
    return {"total": float(x.sum()), "p50": float(np.percentile(x, 50, method="nearest")),
            "p90": float(np.percentile(x, 90, method="nearest")),
            "p99": float(np.percentile(x, 99, method="nearest")), "max": float(x.max())}


def slowest(times: list[float], n: int = 4) -> str:
    """The ``n`` slowest epochs, with their numbers."""
    return ", ".join(f"{t:.2f} s (epoch {k})" for t, k in sorted(((t, k) for k, t in enumerate(times)),
                                                                 reverse=True)[:n])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before")
    parser.add_argument("after")
    args = parser.parse_args()
    before, after = json.load(open(args.before)), json.load(open(args.after))
    for panel in before.keys() & after.keys():
        print(f"== {panel} ==")
        for variant in [v for v in before[panel] if v in after[panel]]:
            b, a = before[panel][variant], after[panel][variant]
            n = min(len(a), len(b))
            if n == 0:
                print(f"{variant}: no epochs in one of the runs")
                continue
            fb, fa = figures(b[:n]), figures(a[:n])
            print(f"{variant}: {n} common epochs (before {len(b)}, after {len(a)})")
            for key in fb:
                print(f"  {key:<5} {fb[key]:8.3f} s -> {fa[key]:8.3f} s   {fa[key] / fb[key]:.2f}x")
            print(f"  slowest before: {slowest(b[:n])}")
            print(f"  slowest after:  {slowest(a[:n])}")


if __name__ == "__main__":
    main()
