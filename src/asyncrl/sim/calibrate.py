"""``asyncrl simulate --calibrate RUN_DIR``: fit the ``simulate`` block to a real run.

What a run directory records and what is fitted from it (docs/simulate.md, section 8):

* **generation** (``ledger.jsonl``: each group's generation interval and tokens;
  ``timeline.json``: every generation attempt and sync): a ``tokens`` latency
  model, ``latency = base_s + longest * (per_token_s + per_token_per_group_s *
  (c - 1)) [+ the syncs it spans]`` with ``longest`` the group's longest
  completion and ``c`` the groups generating meanwhile (time-averaged, itself
  included: the load it decoded under), fitted by least squares with
  non-negative coefficients; a coefficient of the syncs' seconds near 1 means
  the engine pauses while it loads weights (``pause_generation_during_sync``;
  when too few generations span a sync to tell, vLLM is known to pause);
  the lengths are the observed groups' ``[longest, mean]``, resampled;
* **training** (``timeline.json``'s train chunks, ``ledger.jsonl``'s tokens per
  trained group): ``train_per_token_s`` = chunk seconds per completion token;
  ``weight_sync_s`` = the mean sync; the rest of the trainer's busy time per
  step (``metrics.jsonl``: step period minus idle, chunks and sync) is the
  optimizer step (between the last chunk and the sync) plus what follows the
  sync: on steps that aborted groups the extra is ``abort_s`` (the engine's
  abort call and its bookkeeping), the rest goes to ``train_step_s``;
* the fleet: ``rollout_slots`` = engines x ``max_batch_sequences //
  num_generations_per_prompt``; ``failure_rate`` from the failed attempts;
* ``filter_rate`` (``ledger.jsonl``): the groups the dynamic-sampling filter
  dropped among those whose rewards were known (filtered, trained or evicted);
  0 for a run without a filter.

The first step is left out (it carries the run's warm-up: first forward passes,
allocator growth), so the fit describes the steady state; a run of fewer than
:data:`MIN_STEPS` steps is refused;
:func:`steps_per_s` measures a run - real or simulated - the same way.
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import itertools
import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from asyncrl._util.jsonio import read_json, read_jsonl
from asyncrl.config import RunConfig, config_from_dict, load_config
from asyncrl.engines.specs import engine_spec
from asyncrl.errors import ConfigError
from asyncrl.sim.calibrate_checks import MIN_STALL, calibration_warnings, pause_text

#: Fewer groups with generation timings than this cannot be fitted.
MIN_GROUPS = 8
#: Fewer training steps than this are refused: the first is the warm-up and left
#: out, and the trainer's per-step costs and the steady-state generation need
#: four more (a 2-step run fitted R^2 0.00 and looked like a result).
MIN_STEPS = 5
#: Lengths are stored to this many decimals (the calibrated block stays readable).
DECIMALS = 2
#: Refits of the latency model with the load averaged over tokens (it converges fast).
LOAD_ITERATIONS = 4


def steps_per_s(records: Sequence[dict[str, Any]]) -> float:
    """Training steps per second of a run's steady state: from the end of its first
    step to the end of its last (a run of one step: over the whole step)."""
    if not records:
        return math.nan
    if len(records) == 1:
        return 1.0 / float(records[0]["wall_time_s"])
    span = float(records[-1]["wall_time_s"]) - float(records[0]["wall_time_s"])
    return (len(records) - 1) / span if span > 0 else math.inf


@dataclasses.dataclass
class Calibration:
    """The fitted ``simulate`` block, the run's config with it, and how well it fits."""

    run_dir: Path
    config: RunConfig
    #: Diagnostics: data used, fit quality, the run measured against its own simulation.
    facts: dict[str, Any]

    def summary(self) -> dict[str, Any]:
        sim = self.config.simulate
        assert sim is not None
        block = sim.model_dump(mode="json")
        block["generation_latency_s"].pop("lengths")
        return {"run_dir": str(self.run_dir), "simulate": block, **self.facts}

    def describe(self) -> str:
        f, sim = self.facts, self.config.simulate
        assert sim is not None
        lat = sim.generation_latency_s
        return "\n".join([
            f"calibrated on {self.run_dir}: {f['groups']} groups, {f['steps']} steps "
            f"({f['steps_used']} used for the trainer fit)",
            f"  generation: {lat.base_s:.4g}s + longest completion x ({lat.per_token_s:.4g}s "
            f"+ {lat.per_token_per_group_s:.4g}s per other group generating) per token; "
            f"fit error {100 * f['latency_rel_error']:.1f}% of the mean latency "
            f"(R^2 {f['latency_r2']:.2f}); lengths of {len(lat.lengths)} groups",
            f"  trainer: {sim.train_per_token_s:.4g}s per completion token, "
            f"{sim.train_step_s:.4g}s per step, weight sync {sim.weight_sync_s:.4g}s "
            f"({pause_text(self.config.policy.engine, sim.pause_generation_during_sync, f)}"
            f"), abort {sim.abort_s:.4g}s; "
            f"{sim.rollout_slots} rollout slots, failure rate {sim.failure_rate:.3g}, "
            f"filter rate {sim.filter_rate:.3g}",
            f"  the run itself, measured vs simulated: steps/s {f['measured_steps_per_s']:.4g} "
            f"vs {f['simulated_steps_per_s']:.4g}, staleness mean "
            f"{f['measured_staleness_mean']:.3g} vs {f['simulated_staleness_mean']:.3g}",
            *(f"warning: {w}" for w in f["warnings"]),
        ])


def calibrate(run_dir: str | Path, overrides: Sequence[str] = ()) -> Calibration:
    """Fit the ``simulate`` block to ``run_dir`` (see the module docstring).

    ``overrides`` (``key.path=value``) apply to the run's config afterwards, e.g.
    ``simulate.steps=1000``.
    """
    from asyncrl.sim.runner import simulate

    run = Path(run_dir)
    cfg = _run_config(run)
    records = _read_records(run, "metrics.jsonl", "one record per training step")
    intervals = _read_timeline(run)
    ledger = _read_records(run, "ledger.jsonl", "one record per prompt group")
    groups = [g for g in ledger if g.get("gen_start") is not None and g.get("tokens")]
    if len(groups) < MIN_GROUPS:
        raise ConfigError(
            f"{run / 'ledger.jsonl'}: {len(groups)} groups with generation timings and tokens, "
            f"need at least {MIN_GROUPS}. Runs record them since asyncrl 0.1 (gen_start, "
            "gen_end, tokens, tokens_longest): calibrate on a longer or newer run")
    steps = [r for r in records if "wall_time_s" in r]
    if len(steps) < MIN_STEPS:
        raise ConfigError(
            f"--calibrate {run}: metrics.jsonl has {len(steps)} training step(s), a fit needs at "
            f"least {MIN_STEPS} (the first is the warm-up and left out; the trainer's costs "
            "per step and the steady-state generation need the others). Calibrate on a run "
            f"of {MIN_STEPS} or more steps (grpo.max_num_steps), or resume this one for more")
    used = steps[1:]
    warm_end = _sync_end(intervals, int(steps[0]["step"]))
    steady = [g for g in groups if float(g["gen_start"]) >= warm_end]
    fit_groups = steady if len(steady) >= MIN_GROUPS else groups

    n_gen = cfg.grpo.num_generations_per_prompt
    latency, lat_facts = _fit_latency(fit_groups, intervals, n_gen)
    pauses = lat_facts.pop("pause_generation_during_sync")
    lat_facts["pause_source"] = "fit" if pauses is not None else "engine default"
    if pauses is None:  # no generation spanned a sync: what the engine is known to do
        pauses = engine_spec(cfg.policy).pauses_on_sync
    trainer, trainer_facts = fit_trainer(used, intervals, groups)
    gens = [i for i in intervals if i["kind"] == "gen"]
    engines = len({i["lane"] for i in gens}) or 1
    failed = sum(i["label"] == "failed" for i in gens)
    block = {
        "steps": len(steps),
        "rollout_slots": engines * max(1, cfg.policy.generation.max_batch_sequences // n_gen),
        "generation_latency_s": latency,
        "failure_rate": min(failed / len(gens), 0.99) if gens else 0.0,
        "filter_rate": filter_rate(ledger),
        "pause_generation_during_sync": bool(pauses),
        **trainer,
    }
    tree = cfg.model_dump(mode="json")
    tree["simulate"] = block
    calibrated = config_from_dict(tree, source=f"the calibration of {run}")
    if overrides:
        from asyncrl.config import apply_overrides

        tree = apply_overrides(calibrated.model_dump(mode="json"), list(overrides))
        calibrated = config_from_dict(tree, source=f"the calibration of {run} with overrides")
    own = simulate(calibrated.model_copy(update={"simulate": calibrated.simulate.model_copy(
        update={"steps": len(steps)})}), record_intervals=False)
    facts = {
        "groups": len(groups), "steps": len(steps), "steps_used": len(used),
        **lat_facts, **trainer_facts,
        "measured_steps_per_s": steps_per_s(steps),
        "simulated_steps_per_s": steps_per_s(own.records),
        "measured_staleness_mean": _mean([float(r["staleness_mean"]) for r in steps
                                          for _ in range(int(r["groups_trained"]))]),
        "simulated_staleness_mean": own.staleness_mean,
    }
    facts["warnings"] = calibration_warnings(
        calibrated, bool(pauses), facts, [int(g["tokens_longest"]) for g in fit_groups])
    return Calibration(run, calibrated, facts)


def write_calibrated(cal: Calibration, out: str | Path) -> Path:
    """The run's config with the calibrated block, as YAML a ``--config`` takes."""
    import yaml

    class _Dumper(yaml.SafeDumper):
        pass

    # The observed lengths (hundreds of pairs) as a wrapped flow list, not a page each.
    _Dumper.add_representer(_Flow, lambda d, v: d.represent_sequence(
        "tag:yaml.org,2002:seq", list(v), flow_style=True))
    tree = cal.config.model_dump(mode="json")
    latency = tree["simulate"]["generation_latency_s"]
    latency["lengths"] = _Flow(latency["lengths"])
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    header = (f"# asyncrl simulate --calibrate {cal.run_dir}: the run's config with a simulate\n"
              "# block fitted to what it recorded (docs/simulate.md, section 8).\n")
    path.write_text(header + yaml.dump(tree, Dumper=_Dumper, sort_keys=False, width=100))
    return path


class _Flow(list):  # type: ignore[type-arg]
    """A list written in YAML's flow style."""


# ------------------------------------------------------------------- reading
def filter_rate(ledger: Sequence[dict[str, Any]]) -> float:
    """The fraction of committed groups (rewards known: ``filtered``, ``trained``
    or ``evicted``) that the filter dropped; 0 when none was (a run without a
    filter, or a ledger older than the filter). Capped like ``failure_rate``: the
    block takes values below 1."""
    states = collections.Counter(g.get("state") for g in ledger)
    committed = states["filtered"] + states["trained"] + states["evicted"]
    return min(states["filtered"] / committed, 0.99) if committed else 0.0


def _run_config(run: Path) -> RunConfig:
    path = run / "config.yaml"
    if not path.is_file():
        raise ConfigError(f"--calibrate {run}: no config.yaml there; give the directory of an "
                          "asyncrl train run (it holds config.yaml, metrics.jsonl, timeline.json "
                          "and ledger.jsonl)")
    tree = load_config(path).model_dump(mode="json")
    tree.pop("simulate", None)
    return config_from_dict(tree, source=str(path))


def _read_records(run: Path, name: str, what: str) -> list[dict[str, Any]]:
    path = run / name
    records = read_jsonl(path) if path.is_file() else []
    if not records:
        raise ConfigError(f"--calibrate {run}: {name} is missing or empty (it holds {what}); "
                          "calibrate on a run that trained at least one step")
    return records


def _read_timeline(run: Path) -> list[dict[str, Any]]:
    intervals = read_json(run / "timeline.json", default=None)
    if not intervals:
        raise ConfigError(f"--calibrate {run}: timeline.json is missing or empty; it holds the "
                          "generation, training and sync intervals the fit needs")
    return list(intervals)


def _sync_end(intervals: Sequence[dict[str, Any]], step: int) -> float:
    ends = [float(i["end"]) for i in intervals if i["kind"] == "sync" and i["label"] == str(step)]
    return max(ends) if ends else -math.inf


def _mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values) if values else math.nan


# ----------------------------------------------------------------- fitting
def concurrency(spans: Sequence[tuple[float, float]], attempts: Sequence[tuple[float, float]],
                seconds_per_token: Callable[[int], float] | None = None) -> list[float]:
    """For each span, the mean number of ``attempts`` running during it (itself
    included, at least 1): the load it decoded under. Averaged over time, or -
    given the seconds a decode step takes at each load - over its tokens (a
    busy stretch yields fewer tokens per second, so it weighs less)."""
    edges = sorted({t for span in attempts for t in span})
    change: dict[float, int] = defaultdict(int)
    for a, b in attempts:
        change[a] += 1
        change[b] -= 1
    load = list(itertools.accumulate(change[t] for t in edges))  # on [edges[k], edges[k+1])
    out = []
    for s, e in spans:
        weight = weighted = 0.0
        k = max(bisect.bisect_right(edges, s) - 1, 0)
        while k < len(edges) - 1 and edges[k] < e:
            n = max(load[k], 1)
            dt = min(e, edges[k + 1]) - max(s, edges[k])
            if dt > 0:
                w = dt if seconds_per_token is None else dt / max(seconds_per_token(n), 1e-12)
                weight += w
                weighted += w * n
            k += 1
        out.append(max(weighted / weight, 1.0) if weight > 0 else 1.0)
    return out


def fit_nonnegative(rows: Sequence[Sequence[float]], y: Sequence[float]) -> list[float]:
    """Least squares ``y ~ rows @ coef`` with ``coef >= 0``: the best of the
    unconstrained fits on every subset of the columns whose coefficients are all
    non-negative (exact for the few columns used here)."""
    import numpy as np

    x, target = np.asarray(rows, dtype=float), np.asarray(y, dtype=float)
    k = x.shape[1]
    best, best_err = [0.0] * k, float(np.sum(target**2))
    for size in range(1, k + 1):
        for cols in itertools.combinations(range(k), size):
            coef, *_ = np.linalg.lstsq(x[:, cols], target, rcond=None)
            if (coef < 0).any():
                continue
            err = float(np.sum((x[:, cols] @ coef - target) ** 2))
            if err < best_err - 1e-15:
                best, best_err = [0.0] * k, err
                for c, v in zip(cols, coef):
                    best[c] = float(v)
    return best


def _fit_latency(groups: Sequence[dict[str, Any]], intervals: Sequence[dict[str, Any]],
                 n_gen: int) -> tuple[dict[str, Any], dict[str, float]]:
    spans = [(float(g["gen_start"]), float(g["gen_end"])) for g in groups]
    attempts = [(float(i["start"]), float(i["end"])) for i in intervals if i["kind"] == "gen"]
    syncs = [(float(i["start"]), float(i["end"])) for i in intervals if i["kind"] == "sync"]
    # Seconds of weight sync inside each generation: an engine that pauses while
    # it loads weights (vLLM) takes that much longer (coefficient ~1), one that
    # keeps generating does not (~0).
    stalled = [math.fsum(max(0.0, min(e, b) - max(s, a)) for a, b in syncs) for s, e in spans]
    longest = [int(g["tokens_longest"]) for g in groups]
    latency = [e - s for s, e in spans]
    # The load a group decoded under, averaged over its tokens, depends on the
    # step times being fitted: start from the time average, refit a few times.
    busy = concurrency(spans, attempts)
    for _ in range(LOAD_ITERATIONS):
        rows = [(1.0, n, n * (c - 1.0), w) for n, c, w in zip(longest, busy, stalled)]
        base, per_token, per_group, pause = fit_nonnegative(rows, latency)
        busy = concurrency(spans, attempts,
                           lambda n, a=per_token, b=per_group: a + b * (n - 1))
    # Too little sync inside the generations (e.g. every group that spans one is
    # aborted) cannot tell: None.
    in_sync = math.fsum(stalled) / math.fsum(latency) if math.fsum(latency) > 0 else 0.0
    pauses = (pause >= 0.5) if in_sync >= MIN_STALL else None
    predicted = [base + n * (per_token + per_group * (c - 1.0)) + (w if pauses else 0.0)
                 for n, c, w in zip(longest, busy, stalled)]
    mean = _mean(latency)
    sse = math.fsum((p - y) ** 2 for p, y in zip(predicted, latency))
    sst = math.fsum((y - mean) ** 2 for y in latency)
    lengths = [[int(g["tokens_longest"]),
                max(round(int(g["tokens"]) / n_gen, DECIMALS), 1.0)] for g in groups]
    for pair in lengths:  # rounding must not lift the mean above the longest
        pair[1] = min(pair[1], pair[0])
    return ({"distribution": "tokens", "lengths": lengths, "base_s": base,
             "per_token_s": per_token, "per_token_per_group_s": per_group},
            {"pause_generation_during_sync": pauses, "sync_stall_coefficient": pause,
             "sync_in_generation_frac": in_sync,
             "latency_mean_s": mean, "latency_rel_error": math.sqrt(sse / len(latency)) / mean
             if mean > 0 else 0.0, "latency_r2": 1 - sse / sst if sst > 0 else 1.0,
             "concurrency_mean": _mean(busy)})


def fit_trainer(steps: Sequence[dict[str, Any]], intervals: Sequence[dict[str, Any]],
                 groups: Sequence[dict[str, Any]]) -> tuple[dict[str, float], dict[str, float]]:
    chunk_s: dict[int, float] = defaultdict(float)
    sync_s: dict[int, float] = defaultdict(float)
    chunk_end: dict[int, float] = {}
    sync_start: dict[int, float] = {}
    for i in intervals:
        if i["kind"] in ("train", "sync") and str(i["label"]).isdigit():
            v, start, end = int(i["label"]), float(i["start"]), float(i["end"])
            if i["kind"] == "train":
                chunk_s[v] += end - start
                chunk_end[v] = max(chunk_end.get(v, end), end)
            else:
                sync_s[v] += end - start
                sync_start[v] = min(sync_start.get(v, start), start)
    tokens: dict[int, int] = defaultdict(int)
    for g in groups:
        if g.get("state") == "trained" and g.get("end_step") is not None:
            tokens[int(g["end_step"])] += int(g["tokens"])
    used = [int(r["step"]) for r in steps]
    chunk_total = math.fsum(chunk_s[v] for v in used)
    token_total = sum(tokens[v] for v in used)
    per_token = chunk_total / token_total if token_total else 0.0
    sync = _mean([sync_s[v] for v in used])
    # What else the trainer side spends per step: the step's period minus its
    # idle time, its chunks and its sync. The part between the last chunk and
    # the sync is the optimizer step; the part after the sync (aborting groups
    # in the engine, bookkeeping) is charged to the aborts where the step had any.
    period = {int(r["step"]): float(r["wall_time_s"]) for r in steps}
    finish, after, after_aborts = [], [], []
    for r in steps:
        v = int(r["step"])
        if v - 1 not in period and len(steps) > 1:
            continue
        length = period[v] - period.get(v - 1, 0.0)
        rest = length - float(r.get("trainer_idle_s", 0.0)) - chunk_s[v] - sync_s[v]
        done = (max(sync_start[v] - chunk_end[v], 0.0)
                if v in sync_start and v in chunk_end else 0.0)
        finish.append(min(done, max(rest, 0.0)))
        (after_aborts if r.get("groups_aborted") else after).append(max(rest, 0.0) - finish[-1])
    base_after = _mean(after) if after else 0.0
    abort_s = max(_mean(after_aborts) - base_after, 0.0) if after_aborts else 0.0
    step_s = (_mean(finish) if finish else 0.0) + base_after
    return ({"train_step_s": step_s, "train_per_group_s": 0.0, "train_per_token_s": per_token,
             "weight_sync_s": sync, "abort_s": abort_s},
            {"train_chunk_s_per_step": chunk_total / len(used) if used else 0.0,
             "tokens_per_step": token_total / len(used) if used else 0.0})
