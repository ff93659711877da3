"""benchmarks/compare.py: a base commit and the head, run alternately, side by side."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.benchscripts import load_script

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "compare.py"


def test_results_benches_and_directions_parse() -> None:
    cmp = load_script("compare")
    assert cmp.parse_bench("benchmarks/bench_simulate.py --steps 300") == cmp.Bench(
        "bench_simulate", ["--steps", "300"])
    out = "noise\nRESULT sim_steps_per_wall_s.balanced 212.5\nRESULT x nan-ish\nRESULT t_s 3\n"
    assert cmp.parse_results(out) == {"sim_steps_per_wall_s.balanced": 212.5, "t_s": 3.0}
    assert not cmp.is_cost("controller_groups_per_s") and not cmp.is_cost("sim_steps_per_wall_s")
    assert cmp.is_cost("sim_datacenter_1k_steps_s") and cmp.is_cost("admit_latency_p99_ms")
    # The part after a dot names the workload: the metric decides.
    assert cmp.is_cost("step_instructions.sim.long_tail") and cmp.is_cost("step_instructions")
    assert not cmp.is_cost("sim_steps_per_cpu_s.training_bound")
    assert cmp.gain("step_instructions.controller", base=30.0, head=20.0) == 1.5
    assert cmp.gain("t_s", base=4.0, head=2.0) == 2.0
    assert cmp.gain("groups_per_s", base=4.0, head=2.0) == 0.5
    runs = {"b": [cmp.Run("base", {"r_per_s": 10.0}, 0), cmp.Run("head", {"r_per_s": 30.0}, 0),
                  cmp.Run("base", {"r_per_s": 12.0}, 0), cmp.Run("head", {"r_per_s": 18.0}, 0)]}
    (row,) = cmp.table(runs)
    assert (row["base_median"], row["head_median"], row["ratio"]) == (11.0, 24.0, 24.0 / 11.0)
    assert "2.182" in cmp.render([row])


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True,
                          text=True).stdout


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A repository whose base commit has one benchmark and whose working tree
    makes it twice as fast and adds another."""
    root = tmp_path / "repo"
    (root / "benchmarks").mkdir(parents=True)
    (root / "src").mkdir()
    git(root, "init", "-q")
    git(root, "config", "user.email", "t@example.com")
    git(root, "config", "user.name", "t")
    bench = root / "benchmarks" / "bench_a.py"
    bench.write_text("print('RESULT a_per_s 10')\n")
    (root / "src" / "keep").write_text("")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "base")
    bench.write_text("import os, sys\n"
                     "print('RESULT a_per_s 20')\n"
                     "print('RESULT path_is_own', int(os.environ['PYTHONPATH'].split(os.pathsep)[0]"
                     " == os.path.join(os.getcwd(), 'src')))\n")
    (root / "benchmarks" / "bench_b.py").write_text("print('RESULT b_s 1')\n")
    shutil.copy(SCRIPT, root / "benchmarks" / "compare.py")
    return root


@pytest.mark.e2e  # runs git and benchmarks/compare.py as processes
def test_it_alternates_base_and_head_and_cleans_up(repo: Path) -> None:
    out = subprocess.run([sys.executable, "benchmarks/compare.py", "HEAD", "bench_a", "bench_b",
                          "--rounds", "2"], cwd=repo, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "note: bench_b does not exist in the base; skipped" in text
    sides = [line.split()[2] for line in text.splitlines() if line.startswith("round ")]
    assert sides == ["base", "head", "base", "head"]
    row = next(line for line in text.splitlines() if line.startswith("bench_a: a_per_s"))
    assert row.split()[2:6] == ["10", "20", "2.000", "2.00x"]
    own = next(line for line in text.splitlines() if line.startswith("bench_a: path_is_own"))
    # Only the head has it (base "-"); the head ran with its own src first on the path.
    assert own.split()[2:4] == ["-", "1"]
    assert git(repo, "worktree", "list").count("\n") == 1  # the temporary worktree is gone


@pytest.mark.e2e  # runs git and benchmarks/compare.py as processes
def test_a_ref_that_is_not_a_commit_is_one_clear_line(repo: Path) -> None:
    out = subprocess.run([sys.executable, "benchmarks/compare.py", "no-such-ref"], cwd=repo,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert out.stderr.strip() == ("compare.py: BASE_REF 'no-such-ref' is not a commit of this "
                                  "repository; give a commit hash, branch or tag (git log "
                                  "--oneline)")


def test_instruction_counts_parse_and_take_the_set_up_out() -> None:
    bench = load_script("bench_instructions")
    err = "==7== Events    : Ir\n==7== Collected : 3040483619\n==7==\n==7== I   refs:      3,040\n"
    assert bench.parse_count(err) == 3040483619
    with pytest.raises(RuntimeError, match="no instruction count"):
        bench.parse_count("==7== something else\n")
    # What both runs share (imports, set-up, the first LO steps) cancels out.
    assert bench.per_step(20, 120, 3_000_000_000 + 20 * 7, 3_000_000_000 + 120 * 7) == 7
    with pytest.raises(ValueError, match=r"HI .* must be larger"):
        bench.per_step(120, 20, 1, 2)
    lo = "==9== I1  misses:       44,807,065\n==9== D1  misses:       28,823,541  (21.9M rd + 6.9M wr)\n"
    hi = "==9== I1  misses:      121,492,973\n==9== D1  misses:       79,153,596  (60.6M rd + 18.5M wr)\n"
    assert bench.misses(lo, hi) == [("I1", 44_807_065, 121_492_973),
                                    ("D1", 28_823_541, 79_153_596)]


def test_the_best_rounds_are_compared_beside_the_medians() -> None:
    # Load only slows a run: the best round of each side (highest rate, lowest
    # cost) is compared too, in the direction of each result.
    cmp = load_script("compare")
    runs = [cmp.Run(side, {"x_per_s": rate, "y_s": cost}, 0)
            for side, rate, cost in [("base", 100.0, 2.0), ("head", 90.0, 2.4),
                                     ("base", 120.0, 1.6), ("head", 150.0, 1.5),
                                     ("base", 110.0, 1.8), ("head", 100.0, 2.2)]]
    rows = {row["result"]: row for row in cmp.table({"bench_a": runs})}
    assert rows["x_per_s"]["gain"] == pytest.approx(100 / 110)  # medians: head behind
    assert rows["x_per_s"]["best_gain"] == pytest.approx(150 / 120)
    assert rows["y_s"]["gain"] == pytest.approx(1.8 / 2.2)
    assert rows["y_s"]["best_gain"] == pytest.approx(1.6 / 1.5)
    header, line = cmp.render(list(rows.values())).splitlines()[:2]
    assert "best gain" in header and line.split()[5:8] == ["0.91x", "1.25x", "100-120"]
