"""How far the asynchronous, streaming path's learning spreads under load: the
measurement behind the margins of
tests/e2e/test_workloads.py::test_dataset_example_learns_asynchronously_beyond_its_control.

Runs that test's two runs - examples/dataset.yaml as shipped (300 steps,
in_order with a lookahead of 1) and its negative control (the same at lr 1e-12,
25 steps) - ``--runs`` times each, with ``--hogs`` unrelated CPU hogs
(``python3 -c "while True: pass"``) beside them for the whole measurement. Per
run: the learner's last-10 reward and eval at step 300, the control's, and the
margins. The async run's curve depends on how generation and training
interleave, which is what load changes; the test's bars must lie under the
smallest margins here.

    python benchmarks/bench_async_learning.py --runs 20 --hogs 2

Last lines: ``RESULT async_learning_min_last10_margin <value>`` and
``RESULT async_learning_min_eval_margin <value>``.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "src"))

from tests.e2e.test_workloads import CONTROL, dataset_learning  # noqa: E402


def spread(values: list[float]) -> str:
    return (f"min {min(values):.3f}  median {statistics.median(values):.3f}  "
            f"max {max(values):.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--hogs", type=int, default=2, help="CPU hogs beside the runs")
    args = parser.parse_args()
    logging.getLogger("asyncrl").setLevel(logging.ERROR)
    os.chdir(ROOT)  # the example's data path is relative to the repository root
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(args.hogs)]
    rows = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for i in range(args.runs):
                t0 = time.perf_counter()
                learner = dataset_learning(Path(tmp) / f"run{i}")
                control = dataset_learning(Path(tmp) / f"control{i}", *CONTROL)
                rows.append((learner["last10"], learner["eval"], control["last10"],
                             control["eval"]))
                print(f"run {i + 1:2d}: learner last10 {learner['last10']:.3f} eval "
                      f"{learner['eval']:.3f} | control last10 {control['last10']:.3f} eval "
                      f"{control['eval']:.3f} | margins {rows[-1][0] - rows[-1][2]:.3f} "
                      f"{rows[-1][1] - rows[-1][3]:.3f} | {time.perf_counter() - t0:.0f} s",
                      flush=True)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    columns = list(zip(*rows))
    for name, values in zip(("learner last10", "learner eval", "control last10",
                             "control eval"), columns):
        print(f"{name:<15} {spread(list(values))}")
    last10_margins = [a - c for a, _, c, _ in rows]
    eval_margins = [b - d for _, b, _, d in rows]
    print(f"{'last10 margin':<15} {spread(last10_margins)}")
    print(f"{'eval margin':<15} {spread(eval_margins)}")
    print(f"RESULT async_learning_min_last10_margin {min(last10_margins):.3f}")
    print(f"RESULT async_learning_min_eval_margin {min(eval_margins):.3f}")


if __name__ == "__main__":
    main()
