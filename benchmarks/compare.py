"""Compare the headline figures of two runs (before/after) of the triangle, star_overhead and
recursion benchmarks.

Reads the JSON that ``common.report`` writes (``{"machine": ..., "figures": ...}``) and prints,
per headline figure, the value before and after, the ratio after/before, and a flag:

- ``SLOWER`` for a time (seconds) more than ``--threshold`` (default 10%) above before, and for a
  figure where higher is better (a speed-up over the Spark baseline, epochs done within the
  limit) more than the threshold below; ``faster`` / ``better`` the other way round;
- ``CHANGED`` for a figure that must not change (result sizes, triangle matches, whether a
  variant finished, baseline mismatches);
- nothing for context figures (Spark jobs, tuples held, ratios between strategies).

A triangle variant stopped at its time limit (in either run) has its total marked "(stopped
run)": compare its epochs done instead; that total is flagged only when the variant finished
in one run and not in the other.

Values the benchmarks write as bounds (``"> 60"``, ``"did not finish in 40 s"``) are compared as
bounds. The benchmark is recognized from the JSON's shape (``--kind`` overrides). With two
directories, every results file of these benchmarks present in both is compared
(``triangles.json``, ``star_overhead.json``, ``recursion*.json``). The trivial Spark job time and
the machine facts of both runs are shown first: when they differ, so may everything else.

    python benchmarks/compare.py before.json after.json [--threshold 0.10] [--strict]
    python benchmarks/compare.py results-before/ benchmarks/results/
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import re
import sys

# (pattern over the flattened key, direction): time = lower is better, higher = higher is
# better, same = must not change, info = context only. The first matching pattern wins.
HEADLINES = {
    "triangles": [
        (r"results\.[^.]+\.[^.]+\.(total_s|p50_s|p99_s|max_s)$", "time"),
        (r"results\.[^.]+\.[^.]+\.epochs_done$", "higher"),
        (r"results\.[^.]+\.[^.]+\.(finished|matches|expected_matches)$", "same"),
        (r"results\.[^.]+\.[^.]+\.(median_jobs|private_tuples_at_end)$", "info"),
    ],
    "star_overhead": [
        (r"(binary|delta|wco)\.(install_s|median_epoch_s|p90_epoch_s)$", "time"),
        (r"(binary|delta|wco)\.result$", "same"),
        (r"(binary|delta|wco)\.private_tuples$", "info"),
        (r"(delta|wco)_vs_binary_(epoch|install)$", "info"),
    ],
    "recursion": [
        (r"[^.]+\.load_s$", "time"),
        (r"[^.]+\.[^.]+\.(install_median_s|install_max_s|update_median_s|update_max_s|spark_bfs_median_s"
         r"|second_reader_install_s|full_evaluation)$", "time"),
        (r"[^.]+\.[^.]+\.spark_bfs_over_update$", "higher"),
        (r"[^.]+\.[^.]+\.(pairs|mismatches|arguments)$", "same"),
        (r"[^.]+\.[^.]+\.(update_jobs_median|private_tuples_median)$", "info"),
        (r"[^.]+\.retractions_from_tc\(x,\?\)\.(median_s|max_s|total_s)$", "time"),
        (r"[^.]+\.retractions_from_tc\(x,\?\)\.(closure_before|closure_after)$", "same"),
        (r"total_s$", "time"),
    ],
}
CONTEXT = ("trivial_spark_job_s", "trivial_spark_job_median_s")
FILES = {"triangles": "triangles.json", "star_overhead": "star_overhead.json", "recursion": "recursion*.json"}


def load(path: str) -> dict:
    with open(path) as handle:
        data = json.load(handle)
    if "figures" not in data:
        raise SystemExit(f"{path}: not a benchmark results file (no 'figures')")
    return data


def kind_of(figures: dict) -> str | None:
    """Which benchmark wrote ``figures``, from its shape."""
    if "full_evaluation_limit_s" in figures:
        return "recursion"
    if isinstance(figures.get("binary"), dict) and "median_epoch_s" in figures["binary"]:
        return "star_overhead"
    results = figures.get("results")
    if isinstance(results, dict) and any(isinstance(v, dict) and any(isinstance(r, dict) and "p50_s" in r
                                                                     for r in v.values()) for v in results.values()):
        return "triangles"
    return None


def flatten(value, prefix: str = "") -> dict:
    """Nested dicts as ``{"a.b.c": leaf}`` (lists kept as leaves)."""
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            out.update(flatten(item, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: value}


def measure(value) -> tuple[float | None, str]:
    """A figure as (number, how): how is "=" (exact), ">" (at least: a run past its limit),
    "n/a" (no number). Understands "> 60", "23.50 s", "did not finish in 40 s"."""
    if isinstance(value, bool) or value is None:
        return None, "n/a"
    if isinstance(value, (int, float)):
        return (float(value), "=") if math.isfinite(value) else (None, ">")
    if isinstance(value, str):
        text = value.strip()
        m = re.fullmatch(r">\s*([\d.]+)\s*s?", text) or re.fullmatch(r"did not finish in ([\d.]+) s", text)
        if m:
            return float(m.group(1)), ">"
        m = re.fullmatch(r"([\d.]+)\s*s", text)
        if m:
            return float(m.group(1)), "="
    return None, "n/a"


def shown(value) -> str:
    if isinstance(value, float):
        return f"{value:,.3f}".rstrip("0").rstrip(".") if abs(value) < 1000 else f"{value:,.0f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    if isinstance(value, list):
        return f"[{len(value)}]" if value else "[]"
    text = str(value)
    return text if len(text) <= 28 else text[:25] + "..."


def compare_value(before, after, direction: str, threshold: float) -> tuple[str, str]:
    """(ratio text, flag) of one figure."""
    if direction == "same":
        return "", "" if before == after else "CHANGED"
    (b, bhow), (a, ahow) = measure(before), measure(after)
    ratio, flag = "", ""
    if bhow == "=" and ahow == "=":
        if b == 0:
            return ("" if a == 0 else "new"), ""
        r = a / b
        ratio = f"{r:.2f}x"
        if direction == "time":
            flag = "SLOWER" if r > 1 + threshold else "faster" if r < 1 / (1 + threshold) else ""
        elif direction == "higher":
            flag = "SLOWER" if r < 1 / (1 + threshold) else "better" if r > 1 + threshold else ""
    elif bhow == "=" and ahow == ">":
        ratio = f">{a / b:.2f}x" if a is not None and b else "> before"
        if direction == "time" and (a is None or not b or a / b > 1 + threshold):
            flag = "SLOWER"
    elif bhow == ">" and ahow == "=":
        ratio = f"<{a / b:.2f}x" if b else "< before"
        if direction == "time" and b and a / b < 1 / (1 + threshold):
            flag = "faster"
    elif bhow == ">" and ahow == ">":
        ratio = "both past limit"
    elif before != after:
        ratio = "changed"
    return ratio, flag


def compare(before: dict, after: dict, kind: str, threshold: float) -> tuple[list[list[str]], int]:
    """Table rows (figure, before, after, after/before, flag) and the number of SLOWER/CHANGED flags."""
    fb, fa = flatten(before["figures"]), flatten(after["figures"])
    rows, flagged = [], 0
    for key in CONTEXT:
        if key in fb or key in fa:
            ratio, _ = compare_value(fb.get(key), fa.get(key), "info", threshold)
            b, a = measure(fb.get(key))[0], measure(fa.get(key))[0]
            rows.append([f"{key} (context: machine load)", shown(fb.get(key, "-")), shown(fa.get(key, "-")),
                         f"{a / b:.2f}x" if a and b else "", ""])
    keys = list(fb) + [k for k in fa if k not in fb]
    for key in keys:
        direction = next((d for pattern, d in HEADLINES[kind] if re.search(pattern, key)), None)
        if direction is None:
            continue
        if key not in fb or key not in fa:
            rows.append([key, shown(fb.get(key, "-")), shown(fa.get(key, "-")), "", "only in one"])
            continue
        if direction == "info":
            b, a = measure(fb[key]), measure(fa[key])
            ratio = f"{a[0] / b[0]:.2f}x" if b[1] == a[1] == "=" and b[0] else ""
            rows.append([key, shown(fb[key]), shown(fa[key]), ratio, ""])
            continue
        ratio, flag = compare_value(fb[key], fa[key], direction, threshold)
        if kind == "triangles" and key.endswith("total_s"):
            finished = key[: -len("total_s")] + "finished"
            if not (fb.get(finished) and fa.get(finished)):
                ratio += " (stopped run)"  # a total up to the limit: compare epochs_done instead
                flag = "" if flag == "SLOWER" and fb.get(finished) == fa.get(finished) else flag
        flagged += flag in ("SLOWER", "CHANGED")
        rows.append([key, shown(fb[key]), shown(fa[key]), ratio, flag])
    return rows, flagged


def print_table(rows: list[list[str]]) -> None:
    header = ["figure", "before", "after", "after/before", "flag"]
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    print("  ".join(h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(zip(header, widths))))
    for r in rows:
        print("  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(r, widths))))


def machine_differences(before: dict, after: dict) -> list[str]:
    mb, ma = before.get("machine", {}), after.get("machine", {})
    return [f"{k}: {mb.get(k)!r} -> {ma.get(k)!r}" for k in sorted(set(mb) | set(ma)) if mb.get(k) != ma.get(k)]


def pairs(before: str, after: str) -> list[tuple[str, str]]:
    """(before file, after file) pairs: the two files, or the matching results files of two directories."""
    if os.path.isdir(before) and os.path.isdir(after):
        out = []
        for pattern in FILES.values():
            for path in sorted(glob.glob(os.path.join(before, pattern))):
                other = os.path.join(after, os.path.basename(path))
                if os.path.exists(other):
                    out.append((path, other))
        if not out:
            raise SystemExit(f"no results files of {', '.join(FILES)} in both {before} and {after}")
        return out
    if os.path.isdir(before) or os.path.isdir(after):
        raise SystemExit("give two files or two directories")
    return [(before, after)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", help="results JSON (or directory of them) of the earlier run")
    parser.add_argument("after", help="results JSON (or directory of them) of the later run")
    parser.add_argument("--threshold", type=float, default=0.10, help="relative change that is flagged (0.10 = 10%%)")
    parser.add_argument("--kind", choices=sorted(HEADLINES), help="the benchmark (default: recognized from the JSON)")
    parser.add_argument("--strict", action="store_true", help="exit with status 1 when anything is flagged SLOWER or CHANGED")
    args = parser.parse_args()
    total = 0
    for before_path, after_path in pairs(args.before, args.after):
        before, after = load(before_path), load(after_path)
        kind = args.kind or kind_of(before["figures"])
        if kind is None or (not args.kind and kind_of(after["figures"]) != kind):
            raise SystemExit(f"cannot tell which benchmark wrote {before_path} and {after_path} "
                             f"(or they differ); give --kind")
        print(f"== {kind}: {before_path} -> {after_path}")
        for line in machine_differences(before, after):
            print(f"  machine differs: {line}")
        rows, flagged = compare(before, after, kind, args.threshold)
        print_table(rows)
        print(f"  {flagged} figure(s) flagged SLOWER (> {args.threshold:.0%}) or CHANGED\n")
        total += flagged
    if args.strict and total:
        sys.exit(1)


if __name__ == "__main__":
    main()
