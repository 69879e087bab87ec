"""Time to draw and save the report's figures: one tight-box measurement per
figure (figures.py `_save`) against savefig(bbox_inches="tight") for each of
the PNG and the SVG (the baseline: how `_save` was), and `tulving report`
with and without `--no-figures`.

One real offline run (builtin:reader in-context on the short book, judged by
builtin:judge) is made with the CLI. Then, in this process, the report's
figures of that run (report_folder's `_figures`: F1 by bin, cue heatmaps,
accuracy vs cost, item positions, entity track) are drawn and saved ROUNDS
times with each `_save`, interleaved (baseline, current, baseline, ...), the
first round of each left out (imports, font cache); then `tulving report
--out` as a subprocess (cold interpreter), with and without `--no-figures`,
interleaved, ROUNDS times. Medians and ranges are printed, each beside its
baseline from the same run.

    python benchmarks/figure_bench.py [--rounds 5]
"""
from __future__ import annotations

import argparse
import io
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from engine.benchmark.evaluation import figures as F  # noqa: E402
from engine.benchmark.evaluation import report_folder  # noqa: E402
from engine.benchmark.evaluation.runset import load_runs  # noqa: E402


def tulving(cwd: Path, *args: str) -> None:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, "-m", "engine.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True)
    if done.returncode != 0:
        raise SystemExit(done.stderr)


def tight_twice(fig, folder: Path, name: str, title: str, caption: str = "") -> F.Figure:  # type: ignore[no-untyped-def]
    """The baseline: `_save` as it was, savefig measuring the tight box for each file."""
    plt = F._plt()
    folder.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    (folder / f"{name}.png").write_bytes(buf.getvalue())
    fig.savefig(folder / f"{name}.svg", format="svg", bbox_inches="tight", metadata={"Date": None})
    plt.close(fig)
    return F.Figure(name=name, title=title, png=buf.getvalue(), caption=caption)


def figures_seconds(run: Path, out: Path, save: Callable[..., F.Figure]) -> tuple[float, int]:
    """Seconds to draw and save the report's figures of `run` with `save` as `_save`; how many."""
    runset = load_runs([run])
    summaries = runset.summaries()
    current, F._save = F._save, save
    try:
        start = time.perf_counter()
        drawn = report_folder._figures(runset, summaries, out, [])
        return time.perf_counter() - start, sum(len(v) for v in drawn.values())
    finally:
        F._save = current


def spread(times: list[float]) -> str:
    return f"median {statistics.median(times):.2f} s ({min(times):.2f}-{max(times):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        tulving(root, "--quiet", "--cache", "c.sqlite", "run", "--book", "synaptic-echoes-short", "--models",
                "builtin:reader", "--modes", "in-context", "--judge", "builtin:judge", "--out", "run")
        saves = {"tight box per file (baseline)": tight_twice, "one tight box (current)": F._save}
        times: dict[str, list[float]] = {k: [] for k in saves}
        n = 0
        for i in range(args.rounds + 1):
            for label, save in saves.items():
                seconds, n = figures_seconds(root / "run", root / f"fig-{i}-{len(times[label])}", save)
                if i:  # the first round pays the imports and the font cache
                    times[label].append(seconds)
        base, now = (statistics.median(t) for t in times.values())
        print(f"the report's {n} figures of one run (short book), drawn and saved as PNG and SVG, "
              f"{args.rounds} rounds:")
        for label, t in times.items():
            print(f"  {label}: {spread(t)}")
        print(f"  current / baseline: {now / base:.2f}")
        report: dict[str, list[float]] = {"with figures": [], "--no-figures": []}
        for i in range(args.rounds):
            for label in report:
                start = time.perf_counter()
                tulving(root, "report", "run", "--out", f"rep-{i}-{len(label)}",
                        *(["--no-figures"] if label == "--no-figures" else []))
                report[label].append(time.perf_counter() - start)
        print(f"tulving report run --out DIR (subprocess, cold interpreter), {args.rounds} rounds:")
        for label, t in report.items():
            print(f"  {label}: {spread(t)}")
        print(f"  --no-figures / with figures: "
              f"{statistics.median(report['--no-figures']) / statistics.median(report['with figures']):.2f}")


if __name__ == "__main__":
    main()
