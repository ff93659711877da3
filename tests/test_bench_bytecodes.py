"""benchmarks/bench_bytecodes.py: Python bytecodes per step, by function."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

from tests.benchscripts import load_script


def test_it_counts_each_functions_bytecodes_exactly_and_names_dataclass_inits() -> None:
    bench = load_script("bench_bytecodes")

    def loop(n: int) -> None:
        for _ in range(n):
            pass

    @dataclasses.dataclass
    class Point:
        x: int

    counts = [bench.count_bytecodes(lambda n=n: (loop(n), Point(n))) for n in (10, 20, 30)]
    name = next(k for k in counts[0] if k.endswith(".loop"))
    assert name.startswith("tests/test_bench_bytecodes.py:")
    per = [c[name] for c in counts]
    assert per[1] - per[0] == per[2] - per[1] > 0  # the same bytecodes per iteration
    assert counts[0]["<dataclass Point>.__init__"] == counts[2]["<dataclass Point>.__init__"] > 0
    assert sys.gettrace() is None  # the tracer is gone


def test_a_simulated_workload_profiles_the_same_twice_and_diffs_to_zero(
        tmp_path: Path, capsys) -> None:
    bench = load_script("bench_bytecodes")
    saves = [tmp_path / "a.json", tmp_path / "b.json"]
    for save in saves:
        assert bench.main(["--workloads", "balanced", "--steps", "2,4", "--top", "5",
                           "--save", str(save)]) == 0
    first, second = (json.loads(p.read_text()) for p in saves)
    assert first == second  # exact: the same count on every run
    balanced = first["balanced"]
    assert balanced["asyncrl/controller/attempts.py:AttemptRunner._attempt"] > 0
    results = [line.split() for line in capsys.readouterr().out.splitlines()
               if line.startswith("RESULT ")]
    assert results[0][1] == "step_bytecodes.sim.balanced"
    assert float(results[0][2]) == round(sum(balanced.values()) / 1e3, 1)
    assert bench.main(["--diff", str(saves[0]), str(saves[1])]) == 0
    assert "(all, ratio 1.000)" in capsys.readouterr().out
