"""The step's time split, token throughput and completion lengths, against a run
whose every time and token count is known: fake engine and trainer, virtual time."""

from __future__ import annotations

import math

import pytest

from asyncrl.trainers.base import TRAIN_S_IN_FINISH
from asyncrl.types import Completion, GenerationRequest, GroupResult
from tests.fakes import FakeEngine, FakeTrainer
from tests.vtime import run_virtual

from .conftest import make_controller

N, STEPS = 4, 3
GEN_S, CHUNK_S, OPT_S = 2.0, 0.5, 1.0
MAX_NEW = 6
#: What metrics.jsonl had before these metrics, docs/design.md's "What a run writes"
#: among them; every key stays.
DESIGN_KEYS = {"step", "trainer_version", "wall_time_s", "reward_mean", "staleness_mean",
               "staleness_max", "groups_trained", "groups_evicted", "groups_aborted",
               "groups_failed", "trainer_idle_s", "buffer_ready", "inflight", "step_time_s",
               "weight_sync_s", "generator_util", "groups_per_s"}


def lengths_of(prompt_id: int) -> list[int]:
    # The second completion of an odd prompt runs into the token limit.
    return [2 + prompt_id % 5, MAX_NEW if prompt_id % 2 else 3]


def lengths(request: GenerationRequest) -> list[int]:
    return lengths_of(request.prompt.prompt_id)


def nearest_rank(values: list[int], q: float) -> int:
    return sorted(values)[math.ceil(q * len(values)) - 1]


def synchronous_run():
    # in_order without lookahead: a step's N groups are generated together
    # (GEN_S), then trained in one chunk (CHUNK_S) and one optimizer step (OPT_S);
    # the engine takes new weights at once. Every step lasts GEN_S + CHUNK_S + OPT_S.
    trainer = FakeTrainer(step_time=OPT_S, chunk_time=CHUNK_S)
    ctl = make_controller({"name": "in_order", "max_lookahead_versions": 0},
                          engines=[FakeEngine(GEN_S, lengths=lengths, max_new_tokens=MAX_NEW)],
                          trainer=trainer, steps=STEPS, per_step=N, capacity=N, min_chunk=N,
                          inflight=N)
    return ctl, trainer, run_virtual(ctl.run())


def test_each_step_reports_its_time_split_throughput_and_completion_lengths() -> None:
    ctl, trainer, result = synchronous_run()
    assert result.steps == STEPS
    step_s = GEN_S + CHUNK_S + OPT_S
    for record, (step, rollouts) in zip(ctl.step_records, trainer.chunks):
        assert record["step"] == step
        assert set(record) >= DESIGN_KEYS
        assert record["step_time_s"] == pytest.approx(step_s)
        assert record["trainer_idle_s"] == pytest.approx(GEN_S)
        assert record["time/train_s"] == pytest.approx(CHUNK_S)
        assert record["time/optimizer_step_s"] == pytest.approx(OPT_S)
        assert record["weight_sync_s"] == pytest.approx(0.0)
        assert record["time/eval_s"] == 0.0
        assert record["time/other_s"] == pytest.approx(0.0, abs=1e-9)
        assert record["time/generation_s"] == pytest.approx(GEN_S)

        lens = [k for r in rollouts for k in lengths_of(r.prompt.prompt_id)]
        assert len(lens) == 2 * N
        assert record["rollout/generated_tokens"] == sum(lens)
        assert record["rollout/trained_tokens"] == sum(lens)
        assert record["throughput/generated_tokens_per_s"] == pytest.approx(sum(lens) / step_s)
        assert record["throughput/trained_tokens_per_s"] == pytest.approx(sum(lens) / step_s)
        assert record["rollout/completion_len_mean"] == pytest.approx(sum(lens) / len(lens))
        assert record["rollout/completion_len_p50"] == nearest_rank(lens, 0.5)
        assert record["rollout/completion_len_p90"] == nearest_rank(lens, 0.9)
        assert record["rollout/completion_len_max"] == max(lens)
        assert record["rollout/completion_len_min"] == min(lens)
        assert record["rollout/completion_clipped_frac"] == pytest.approx(
            lens.count(MAX_NEW) / len(lens))


class MiniBatchTrainer(FakeTrainer):
    """Runs its forward/backward passes inside finish_step, as a trainer with
    several optimizer steps per training step does, and says how long they took."""

    async def finish_step(self, *, step: int) -> dict[str, float]:
        metrics = await super().finish_step(step=step)
        return {**metrics, TRAIN_S_IN_FINISH: 0.75 * OPT_S}


def test_forward_backward_inside_finish_step_counts_as_training() -> None:
    # With mini-batches the split said "train 0%, optimizer 83%": the passes ran
    # inside finish_step and were all called the optimizer step.
    trainer = MiniBatchTrainer(step_time=OPT_S, chunk_time=CHUNK_S)
    ctl = make_controller({"name": "in_order", "max_lookahead_versions": 0},
                          engines=[FakeEngine(GEN_S, lengths=lengths, max_new_tokens=MAX_NEW)],
                          trainer=trainer, steps=STEPS, per_step=N, capacity=N, min_chunk=N,
                          inflight=N)
    result = run_virtual(ctl.run())
    for record in ctl.step_records:
        assert record["time/train_s"] == pytest.approx(CHUNK_S + 0.75 * OPT_S)
        assert record["time/optimizer_step_s"] == pytest.approx(0.25 * OPT_S)
        assert TRAIN_S_IN_FINISH not in record
    assert result.summary["time_split"]["train_s"] == pytest.approx(
        STEPS * (CHUNK_S + 0.75 * OPT_S))


def test_the_summary_sums_the_time_split_and_the_throughput() -> None:
    _, trainer, result = synchronous_run()
    summary = result.summary
    all_lens = [k for _, rollouts in trainer.chunks for r in rollouts
                for k in lengths_of(r.prompt.prompt_id)]
    step_s = GEN_S + CHUNK_S + OPT_S
    split = summary["time_split"]
    assert split["steps_s"] == pytest.approx(STEPS * step_s)
    assert split["trainer_idle_s"] == pytest.approx(STEPS * GEN_S)
    assert split["train_s"] == pytest.approx(STEPS * CHUNK_S)
    assert split["optimizer_step_s"] == pytest.approx(STEPS * OPT_S)
    assert split["generation_s"] == pytest.approx(STEPS * GEN_S)
    assert split["train_frac"] == pytest.approx(CHUNK_S / step_s)
    assert split["trainer_idle_frac"] == pytest.approx(GEN_S / step_s)
    assert (split["trainer_idle_frac"] + split["train_frac"] + split["optimizer_step_frac"]
            + split["weight_sync_frac"] + split["eval_frac"] + split["other_frac"]
            ) == pytest.approx(1.0)
    assert summary["wall_time_s"] == pytest.approx(STEPS * step_s)
    throughput = summary["throughput"]
    assert throughput["generated_tokens"] == throughput["trained_tokens"] == sum(all_lens)
    assert throughput["trained_tokens_per_s"] == pytest.approx(sum(all_lens) / (STEPS * step_s))
    lens = summary["completion_len"]
    assert lens == pytest.approx({"completions": len(all_lens),
                                  "mean": sum(all_lens) / len(all_lens), "min": min(all_lens),
                                  "max": max(all_lens),
                                  "clipped_frac": all_lens.count(MAX_NEW) / len(all_lens)})


def test_the_totals_survive_a_checkpoint() -> None:
    ctl, _, result = synchronous_run()
    copy = make_controller({"name": "in_order", "max_lookahead_versions": 0}, per_step=N,
                           capacity=N, min_chunk=N, inflight=N)
    copy.load_state_dict(ctl.state_dict())
    totals = copy.ctx.stats.totals(result.summary["wall_time_s"])
    for key in ("time_split", "throughput", "completion_len"):
        assert totals[key] == result.summary[key]


def batch_tokens(batch: int) -> int:
    return sum(sum(lengths_of(p)) for p in range(batch * N, (batch + 1) * N))


def test_generated_tokens_are_those_the_engines_returned_during_the_step() -> None:
    # A lookahead of 2 admits batches 0-2 at t=0; all return at GEN_S. Step 0
    # ends at 3.5 (version 1 admits batch 3: back at 5.5); step 1 trains batch 1
    # at once (3.5-5.0) while batch 3 generates; step 2 (5.0-6.5) gets batch 3
    # back, and version 2 started batch 4 at 5.0. So the engines return more
    # tokens than the steps train, and generate through all of steps 1 and 2.
    ahead = make_controller({"name": "in_order", "max_lookahead_versions": 2},
                            engines=[FakeEngine(GEN_S, lengths=lengths, max_new_tokens=MAX_NEW)],
                            trainer=FakeTrainer(step_time=OPT_S, chunk_time=CHUNK_S),
                            steps=STEPS, per_step=N, capacity=3 * N, min_chunk=N, inflight=3 * N)
    result = run_virtual(ahead.run())
    records = ahead.step_records
    assert [r["step_time_s"] for r in records] == pytest.approx([3.5, 1.5, 1.5])
    assert [r["time/generation_s"] for r in records] == pytest.approx([2.0, 1.5, 1.5])
    assert [r["rollout/generated_tokens"] for r in records] == [
        batch_tokens(0) + batch_tokens(1) + batch_tokens(2), 0, batch_tokens(3)]
    assert [r["rollout/trained_tokens"] for r in records] == [batch_tokens(b) for b in range(3)]
    throughput = result.summary["throughput"]
    assert throughput["generated_tokens"] == sum(batch_tokens(b) for b in range(4))
    assert throughput["trained_tokens"] == sum(batch_tokens(b) for b in range(3))
    assert result.summary["time_split"]["generation_s"] == pytest.approx(5.0)


class ContinuingEngine(FakeEngine):
    """Continues a resumed group's tokens with two more per completion."""

    async def generate(self, request: GenerationRequest) -> GroupResult:
        result = await super().generate(request)
        if request.prefix is None:
            return result
        completions = [Completion.of([*p.token_ids, 3, 3], [*p.logprobs, -0.5, -0.5],
                                     [*p.version_list(), self.weight_version,
                                      self.weight_version], "stop", c.text)
                       for p, c in zip(request.prefix.completions, result.completions)]
        return GroupResult(result.group_id, result.prompt_ids, completions,
                           request.prefix.start_weight)


def test_a_continued_group_counts_only_the_tokens_generated_after_the_resume() -> None:
    first = make_controller({"name": "in_order", "max_lookahead_versions": 0}, per_step=N,
                            capacity=N, min_chunk=N, inflight=N, steps=1)
    run_virtual(first.run())
    state = first.state_dict()
    # The run stopped with batch 1 in flight; give one of its groups 5 tokens per
    # completion so far, as a stop would have kept them.
    entry = state["dispatch"]["inflight"][0]
    kept = Completion.of([3] * 5, [-0.5] * 5, entry["start_weight"], None)
    entry["partial"] = GroupResult(entry["group_id"], [1, 2], [kept, kept],
                                   entry["start_weight"]).to_dict()
    engine = ContinuingEngine(GEN_S)
    engine.weight_version = state["trainer_version"]  # a resume loads the checkpoint's weights
    resumed = make_controller({"name": "in_order", "max_lookahead_versions": 0},
                              engines=[engine], per_step=N, capacity=N, min_chunk=N,
                              inflight=N, steps=2)
    resumed.load_state_dict(state)
    before = resumed.ctx.stats.generated_tokens
    result = run_virtual(resumed.run())
    assert result.summary["groups_continued"] == 1
    record = resumed.step_records[-1]
    # Step 1 trains batch 1: three fresh groups of two 1-token completions, and
    # the continued one, 7 tokens per completion of which 2 are new.
    assert record["rollout/trained_tokens"] == 3 * 2 + 2 * 7
    assert record["rollout/generated_tokens"] == 3 * 2 + 2 * 2
    assert result.summary["throughput"]["generated_tokens"] == before + 3 * 2 + 2 * 2
