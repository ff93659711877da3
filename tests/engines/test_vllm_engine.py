"""VLLMEngine on real vLLM (CPU): behavior log-probs equal the trainer's, weight
updates change the weights and the version together, abort frees vLLM's
requests, groups run concurrently, and close leaves no process behind.

One engine serves the whole module (starting vLLM takes tens of seconds), so
the tests share one event loop and keep the engine holding the trainer's weights.
"""

from __future__ import annotations

import asyncio
import copy
import os
from types import SimpleNamespace

import psutil
import pytest
import pytest_asyncio
import torch

from asyncrl.config import GenerationConfig
from asyncrl.engines import RolloutEngine, sampling_logprobs
from asyncrl.engines.local.engine import LocalEngine
from asyncrl.engines.vllm.inprocess import VLLMEngine
from asyncrl.engines.vllm.setup import descendants
from asyncrl.errors import BackendLost, PromptTooLong
from asyncrl.policy.build import build_policy
from asyncrl.run.options import engine_options, sharded_options, trainer_options
from asyncrl.tasks import build_task
from asyncrl.trainers.grpo import GRPOTrainer
from asyncrl.types import Completion, GenerationRequest, GroupAborted, GroupResult, Prompt
from tests.vllm_support import as_rollout, vllm_run_config

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

TEMPERATURE = 0.8
CFG = vllm_run_config(policy={"generation": {"max_new_tokens": 8, "temperature": TEMPERATURE}})
#: The trainer's recomputed log-prob of a sampled token vs vLLM's behavior log-prob.
TOLERANCE = 1e-4
ALL_CORES = os.sched_getaffinity(0)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def rig():
    task = build_task(CFG.task)
    model, tokenizer = build_policy(CFG.policy, task, seed=CFG.seed)
    trainer = GRPOTrainer.from_options(trainer_options(CFG), model=model, tokenizer=tokenizer)
    # Scores groups with the trainer's code on the trainer's model, without
    # touching the trainer's step (its own token count and optimizer).
    probe = GRPOTrainer(model, tokenizer, temperature=TEMPERATURE, num_threads=1)
    engine = VLLMEngine.for_policy(CFG.policy, engine_options(CFG), model, tokenizer)
    source = task.prompt_source(0)
    prompts = [source.next_prompt() for _ in range(8)]
    try:
        yield SimpleNamespace(engine=engine, trainer=trainer, probe=probe,
                              tokenizer=tokenizer, prompts=prompts)
    finally:
        await engine.close()
        await trainer.close()
        await probe.close()


async def generate_all(engine: VLLMEngine, prompts: list[Prompt], n: int = 8,
                       tag: str = "g") -> list[GroupResult]:
    return list(await asyncio.gather(*(
        engine.generate(GenerationRequest(f"{tag}{i}", p, n)) for i, p in enumerate(prompts)
    )))


def trainer_mismatch(probe: GRPOTrainer, results: list[GroupResult],
                     prompts: list[Prompt]) -> float:
    """Largest |trainer log-prob - behavior log-prob| over every sampled token, as
    the trainer computes it while training (the gradients are dropped again)."""
    metrics = probe.train_chunk_sync([as_rollout(r, p) for r, p in zip(results, prompts)])
    probe.optimizer.zero_grad(set_to_none=True)
    return metrics["logprob_mismatch_max"]


async def sync_engine(rig: SimpleNamespace) -> int:
    """Push the trainer's weights to the engine as the next version."""
    version = rig.engine.weight_version + 1
    await rig.engine.update_weights(rig.trainer.get_weights_sync(), version)
    return version


async def test_it_is_a_rollout_engine(rig):
    assert isinstance(rig.engine, RolloutEngine)
    assert rig.engine.healthy


async def test_behavior_logprobs_match_the_trainer_before_and_after_a_weight_update(rig):
    engine, trainer, probe, tok = rig.engine, rig.trainer, rig.probe, rig.tokenizer
    version = engine.weight_version
    before = await generate_all(engine, rig.prompts)
    assert trainer_mismatch(probe, before, rig.prompts) <= TOLERANCE

    ends_at_eos = 0
    for result in before:
        assert (result.start_weight, result.end_weight) == (version, version)
        assert len(result.completion_ids) == 8
        for ids, logprobs in zip(result.completion_ids, result.behavior_logprobs):
            assert 1 <= len(ids) <= 8 and len(logprobs) == len(ids)
            assert tok.eos_id not in ids[:-1]  # generation stops at EOS ...
            ends_at_eos += ids[-1] == tok.eos_id  # ... which stays in the completion
            assert all(lp <= 0 for lp in logprobs)
        assert result.completion_texts == [tok.decode(c) for c in result.completion_ids]
    assert ends_at_eos > 0

    # A real training step on those groups, then the sync.
    trainer.train_chunk_sync([as_rollout(r, p) for r, p in zip(before, rig.prompts)])
    trainer.finish_step_sync()
    # The step moved the weights enough that a missed sync would show.
    assert trainer_mismatch(probe, before, rig.prompts) > 100 * TOLERANCE
    version = await sync_engine(rig)
    assert engine.weight_version == version

    after = await generate_all(engine, rig.prompts)
    assert {(r.start_weight, r.end_weight) for r in after} == {(version, version)}
    assert trainer_mismatch(probe, after, rig.prompts) <= TOLERANCE


async def test_behavior_logprobs_are_those_of_the_top_p_nucleus(rig):
    """With top-p, the behavior log-prob is that of the renormalised nucleus - the
    distribution LocalEngine samples from and reports (sampling_logprobs)."""
    engine, model = rig.engine, rig.trainer.model
    top_p = 0.7
    engine.generation = GenerationConfig(temperature=TEMPERATURE, top_p=top_p, max_new_tokens=8)
    try:
        results = await generate_all(engine, rig.prompts[:4], tag="topp")
    finally:
        engine.generation = CFG.policy.generation
    worst = 0.0
    with torch.no_grad():
        for result in results:
            for ids, behavior in zip(result.completion_ids, result.behavior_logprobs):
                seq = torch.tensor([result.prompt_ids + ids])
                logits = model(input_ids=seq).logits[0, len(result.prompt_ids) - 1 : -1]
                logp = sampling_logprobs(logits, TEMPERATURE, top_p)
                mine = logp.gather(1, torch.tensor(ids)[:, None])[:, 0]
                worst = max(worst, float((mine - torch.tensor(behavior)).abs().max()))
    assert worst <= TOLERANCE


async def test_a_weight_update_changes_what_is_generated_and_the_version(rig):
    engine, trainer = rig.engine, rig.trainer
    prompt = rig.prompts[0]

    async def seeded() -> GroupResult:
        return await engine.generate(GenerationRequest("seeded", prompt, 16, seed=1234))

    first, again = await seeded(), await seeded()
    assert again.completion_ids == first.completion_ids  # a seed makes it reproducible

    weights = trainer.get_weights_sync()
    rng = torch.Generator().manual_seed(0)
    changed = {k: v + 0.2 * torch.randn(v.shape, generator=rng) for k, v in weights.items()}
    version = engine.weight_version
    await engine.update_weights(changed, version + 1)
    assert engine.weight_version == version + 1
    other = await seeded()
    assert (other.start_weight, other.end_weight) == (version + 1, version + 1)
    assert other.completion_ids != first.completion_ids

    await engine.update_weights(weights, version + 2)  # back to the trainer's weights
    back = await seeded()
    assert (back.start_weight, back.end_weight) == (version + 2, version + 2)
    assert back.completion_ids == first.completion_ids
    flat = [x for row in first.behavior_logprobs for x in row]
    assert [x for row in back.behavior_logprobs for x in row] == pytest.approx(flat, abs=TOLERANCE)
    assert len(engine.sync_seconds) >= 2 and all(s > 0 for s in engine.sync_seconds)


async def test_vllm_and_this_process_keep_to_separate_cores(rig):
    """vLLM binds its worker to all cores but one (of a NUMA node); the engine
    keeps vLLM's engine core there too and this process - the trainer - on the
    rest, so that generation and training do not take each other's cores."""
    mine = os.sched_getaffinity(0)
    vllm_cores = set().union(*(os.sched_getaffinity(pid) for pid in rig.engine.process_ids))
    assert mine and vllm_cores and not (mine & vllm_cores)
    assert mine | vllm_cores <= ALL_CORES


async def test_groups_run_concurrently_abort_frees_them_and_a_sync_lands_mid_group(rig):
    engine = rig.engine
    prompt = rig.prompts[1]
    version = engine.weight_version
    long_cfg = GenerationConfig(temperature=1.0, max_new_tokens=48)
    engine.generation = long_cfg
    long = [asyncio.ensure_future(engine.generate(GenerationRequest(f"long{i}", prompt, 32)))
            for i in range(4)]
    await asyncio.sleep(0)  # the four calls take their sampling settings now
    engine.generation = long_cfg.model_copy(update={"max_new_tokens": 1})
    try:
        short = await engine.generate(GenerationRequest("short", prompt, 1))
    finally:
        engine.generation = CFG.policy.generation
    assert len(short.completion_ids[0]) == 1
    # The long groups went into vLLM together, not one after another.
    assert engine.num_unfinished_requests > 32
    # vLLM reports its load (the aimd autopilot's signal) from its latest step.
    load = await engine.pressure()
    assert (load is not None and load.running + load.waiting > 0
            and 0.0 < load.kv_cache_usage <= 1.0 and load.preemptions >= 0), load

    # Hold vLLM's scheduler (its own pause; the sync below resumes it) so that
    # long3 is still generating when its weights change, whatever the machine's
    # load (under two CPU hogs it once finished first).
    await engine._llm.pause_generation(mode="keep", clear_cache=False)
    await engine.abort(["long0", "long1", "long2"])
    for task in long[:3]:
        with pytest.raises(GroupAborted):
            await task
    # vLLM dropped the aborted sequences: only long3's rows remain.
    assert 8 <= engine.num_unfinished_requests <= 32

    await sync_engine(rig)  # lands while long3 still generates
    await engine.invalidate_cache()  # its KV is recomputed with the new weights
    result = await long[3]
    assert (result.start_weight, result.end_weight) == (version, version + 1)
    assert len(result.completion_ids) == 32
    assert engine.num_unfinished_requests == 0


async def test_a_sharded_trainer_keeps_vllm_on_policy(rig):
    """trainer.strategy=fsdp at world size 2 (gloo): the full weights gathered from
    the ranks reach vLLM exactly - over synchronous steps, the log-prob the sharded
    trainer computes for every sampled token is vLLM's (issue 22, acceptance 3)."""
    from asyncrl.config import TrainerConfig
    from asyncrl.trainers.distributed import build_local_trainer

    cfg = CFG.model_copy(update={"trainer": TrainerConfig(strategy="fsdp", world_size=2)})
    sharded = build_local_trainer(sharded_options(cfg), build_task(cfg.task))
    try:
        sharded.load_state_dict(rig.trainer.state_dict())  # what the engine holds now
        for step in range(3):
            v = sharded.version
            results = await generate_all(rig.engine, rig.prompts[:4], n=4, tag=f"fsdp{step}-")
            metrics = await sharded.train_chunk(
                [as_rollout(r, p) for r, p in zip(results, rig.prompts)], step=v)
            assert metrics["logprob_mismatch_max"] <= 1e-3, (step, metrics)
            await sharded.finish_step(step=v)
            await rig.engine.update_weights(await sharded.get_weights(),
                                            rig.engine.weight_version + 1)
        rig.trainer.load_state_dict(sharded.state_dict())  # the rig's trainer holds them too
    finally:
        await sharded.close()


async def test_cancelling_a_generate_call_aborts_its_request(rig):
    engine = rig.engine
    engine.generation = GenerationConfig(temperature=1.0, max_new_tokens=48)
    try:
        task = asyncio.ensure_future(engine.generate(GenerationRequest("c", rig.prompts[2], 32)))
        await asyncio.sleep(0)
    finally:
        engine.generation = CFG.policy.generation
    await engine.generate(GenerationRequest("s", rig.prompts[2], 1))
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert engine.num_unfinished_requests == 0


async def test_both_engines_refuse_a_prompt_over_the_context_and_stop_at_the_same_limit(rig):
    """Issue 18, case 1: vLLM used to cut completions at max_model_len while the
    local engine went past the model's context; now a prompt that does not fit
    raises PromptTooLong on both, and both stop at max_new_tokens."""
    model, _ = build_policy(CFG.policy, build_task(CFG.task), seed=CFG.seed)
    local = LocalEngine(model, rig.tokenizer, CFG.policy.generation, num_threads=1)

    def request(gid: str, ones: int, **kw) -> GenerationRequest:
        # "1" * ones + "+1=" and bos: ones + 4 tokens.
        return GenerationRequest(gid, Prompt(0, "1" * ones + "+1="), 32, seed=3, **kw)

    try:
        assert rig.engine.context_length == local.context_length == 64
        for engine in (rig.engine, local):
            with pytest.raises(PromptTooLong, match="is 57 tokens: with max_new_tokens=8 it "
                                                    "needs 65 positions"):
                await engine.generate(request("long", 53))
            exact = await engine.generate(request("exact", 52))  # 56 + 8 = 64 positions
            assert max(map(len, exact.completion_ids)) == 8, type(engine).__name__
            # An eval-style request with a limit of its own (vLLM used to ignore it).
            longer = await engine.generate(request("eval", 36, max_new_tokens=24))
            assert 8 < max(map(len, longer.completion_ids)) <= 24, type(engine).__name__
    finally:
        await local.close()
    assert rig.engine.num_unfinished_requests == 0


async def test_a_lora_trainer_stays_on_policy_through_merged_weight_syncs(rig):
    """policy.lora on vLLM: each step's merged weights reach vLLM, and the tokens
    it samples with them score the same under the trainer's adapted model."""
    pytest.importorskip("peft")
    from asyncrl.config import LoraConfig, OptimizerConfig

    model, tok = build_policy(CFG.policy, build_task(CFG.task), seed=CFG.seed)
    base_weights = {k: v.clone() for k, v in model.state_dict().items()}  # before adapters
    lora = GRPOTrainer(model, tok, temperature=TEMPERATURE, lora=LoraConfig(r=8),
                       optimizer=OptimizerConfig(lr=1e-2), num_threads=1)
    prompts = rig.prompts[:4]
    try:
        for step in range(2):
            await rig.engine.update_weights(lora.get_weights_sync(), rig.engine.weight_version + 1)
            results = await generate_all(rig.engine, prompts, n=4, tag=f"lora{step}-")
            metrics = lora.train_chunk_sync([as_rollout(r, p) for r, p in zip(results, prompts)])
            assert metrics["logprob_mismatch_max"] <= 1e-3, (step, metrics)
            assert lora.finish_step_sync()["grad_norm"] > 0
        # The syncs mattered: the base model scores those tokens differently.
        plain, _ = build_policy(CFG.policy, build_task(CFG.task), seed=CFG.seed)
        plain.load_state_dict(base_weights)
        probe = GRPOTrainer(plain, tok, temperature=TEMPERATURE, num_threads=1)
        assert trainer_mismatch(probe, results, prompts) > 1e-3
        await probe.close()
    finally:
        await sync_engine(rig)  # back to the module trainer's weights
        await lora.close()
def forced_logprobs(model: torch.nn.Module, result: GroupResult, c: Completion,
                    temperature: float) -> torch.Tensor:
    """The completion's log-probs under ``model`` with all KV recomputed."""
    with torch.no_grad():
        seq = torch.tensor([result.prompt_ids + c.token_ids])
        logits = model(input_ids=seq).logits[0, len(result.prompt_ids) - 1 : -1]
        logp = sampling_logprobs(logits, temperature, 1.0)
        return logp.gather(1, torch.tensor(c.token_ids)[:, None])[:, 0]


async def long_groups_running(rig, n: int, tag: str) -> asyncio.Future:
    """A long group inside vLLM, with tokens generated already (a short request
    batched with it has finished)."""
    engine = rig.engine
    engine.generation = GenerationConfig(temperature=1.0, max_new_tokens=48)
    task = asyncio.ensure_future(engine.generate(GenerationRequest(tag, rig.prompts[4], n)))
    await asyncio.sleep(0)  # the call takes its sampling settings now
    engine.generation = GenerationConfig(temperature=1.0, max_new_tokens=1)
    try:
        await engine.generate(GenerationRequest(f"{tag}-short", rig.prompts[4], 1))
    finally:
        engine.generation = CFG.policy.generation
    return task


async def test_per_token_versions_and_exact_continuation_after_a_sync(rig):
    """A sync lands mid-group with recompute_kv_on_update: every token reports the
    version vLLM labelled it with, and its behaviour log-prob equals the one the
    labelled weights give with all KV recomputed (<= 1e-3 for every token after
    the sync) - so the label switch sits at the right token."""
    engine, trainer = rig.engine, rig.trainer
    version = engine.weight_version
    old = copy.deepcopy(trainer.model)
    weights = trainer.get_weights_sync()
    rng = torch.Generator().manual_seed(1)
    changed = {k: v + 0.05 * torch.randn(v.shape, generator=rng) for k, v in weights.items()}
    new = copy.deepcopy(trainer.model)
    new.load_state_dict(changed)
    engine.recompute_kv_on_update = True
    try:
        task = await long_groups_running(rig, 16, "span")
        await engine.update_weights(changed, version + 1)
        result = await task
    finally:
        engine.recompute_kv_on_update = False
    spanning = 0
    for c in result.completions:
        assert c.finish_reason in ("stop", "length")
        assert (c.finish_reason == "stop") == (c.token_ids[-1] == rig.tokenizer.eos_id)
        behavior = torch.tensor(c.logprobs)
        versions = torch.tensor(c.version_list())
        assert set(versions.tolist()) <= {version, version + 1}
        for v, model in ((version, old), (version + 1, new)):
            at = versions == v
            if at.any():
                gap = (forced_logprobs(model, result, c, 1.0)[at] - behavior[at]).abs().max()
                assert float(gap) <= 1e-3, (v, float(gap))
        spanning += len(c.versions) == 2
    assert spanning, "the sync landed after every completion had ended"
    assert result.end_weight == version + 1 and result.start_weight == version
    await engine.update_weights(weights, version + 2)  # back to the trainer's weights


async def test_an_abort_hands_back_the_tokens_and_a_prefix_continues_them(rig):
    engine = rig.engine
    task = await long_groups_running(rig, 4, "cut")
    snap = (await engine.snapshot(["cut"]))["cut"]
    assert all(c.version_list() == [engine.weight_version] * len(c) for c in snap.completions)
    await engine.abort(["cut"])
    with pytest.raises(GroupAborted) as stopped:
        await task
    partial = stopped.value.partial
    assert isinstance(partial, GroupResult) and partial.num_tokens >= 4
    assert engine.num_unfinished_requests == 0
    for early, late in zip(snap.completions, partial.completions):
        assert late.token_ids[: len(early)] == early.token_ids
    engine.generation = GenerationConfig(temperature=1.0, max_new_tokens=48)
    try:
        done = await engine.generate(GenerationRequest("cut", rig.prompts[4], 4, prefix=partial))
    finally:
        engine.generation = CFG.policy.generation
    assert done.finished
    for kept, whole in zip(partial.completions, done.completions):
        n = len(kept)
        assert whole.token_ids[:n] == kept.token_ids and whole.logprobs[:n] == kept.logprobs
        assert len(whole) <= 48  # max_new_tokens counts the tokens it continued from
        if kept.finished:
            assert (whole.token_ids, whole.finish_reason) == (kept.token_ids, kept.finish_reason)
        else:  # prompt + prefix prefilled: the new tokens' log-probs are the trainer's
            forced = forced_logprobs(rig.trainer.model, done, whole, 1.0)
            assert torch.allclose(forced[n:], torch.tensor(whole.logprobs[n:]), atol=TOLERANCE)


async def test_a_rollout_function_continues_after_environment_tokens_exactly(rig):
    """A two-turn rollout function (task.rollout) over vLLM: the turn ends at "=",
    the environment appends "3+" (loss_mask 0), the policy goes on. Every policy
    token - those conditioned on the environment's too - has the trainer's
    log-prob and the engine's version; environment tokens are left out."""
    from asyncrl.rollouts import RolloutFunctionEngine, RolloutOutput

    async def two_turns(prompt, session):
        transcripts = await session.generate(session.start(), stop="=")
        transcripts = [t if t.finished else session.append(t, "3+") for t in transcripts]
        transcripts = [session.finish(t) for t in await session.generate(transcripts)]
        return RolloutOutput(transcripts, [0.0] * len(transcripts))

    engine = RolloutFunctionEngine(rig.engine, two_turns, rig.tokenizer, name="test:two_turns")
    prompts = rig.prompts[:4]
    results = list(await asyncio.gather(*(
        engine.generate(GenerationRequest(f"turns{i}", p, 8)) for i, p in enumerate(prompts))))
    assert trainer_mismatch(rig.probe, results, prompts) <= TOLERANCE
    version, continued = rig.engine.weight_version, 0
    for c in (c for r in results for c in r.completions):
        assert c.version_list() == [version] * len(c)
        env = [k for k, m in enumerate(c.mask_list()) if not m]
        assert all(c.logprobs[k] == 0.0 for k in env)
        continued += bool(env) and env[-1] + 1 < len(c)  # policy tokens after the tool's
    assert continued > 0


async def test_a_dead_vllm_fails_calls_instead_of_hanging_and_close_cleans_up(rig):
    engine = rig.engine
    pids = engine.process_ids
    assert len(pids) >= 2, "vLLM runs its engine core and worker in processes of their own"
    assert pids <= descendants()
    # In a session of their own: a terminal's Ctrl-C reaches asyncrl, not vLLM.
    assert all(os.getsid(pid) != os.getsid(0) for pid in pids)
    engine.generation = GenerationConfig(temperature=1.0, max_new_tokens=48)
    running = asyncio.ensure_future(engine.generate(GenerationRequest("x", rig.prompts[3], 32)))
    await asyncio.sleep(0)  # the call takes its sampling settings now
    engine.generation = GenerationConfig(temperature=1.0, max_new_tokens=1)
    await engine.generate(GenerationRequest("y", rig.prompts[3], 1))
    assert engine.num_unfinished_requests > 0  # x is inside vLLM

    core = next(p for p in map(psutil.Process, pids) if "EngineCore" in p.name())
    core.kill()  # what the OOM killer would do
    with pytest.raises(BackendLost, match="vLLM engine died"):
        await asyncio.wait_for(running, 60)  # vLLM notices within seconds
    # vLLM never answers a control call once its engine core is gone: no hang.
    with pytest.raises(BackendLost, match="vLLM engine"):
        await asyncio.wait_for(
            engine.update_weights(rig.trainer.get_weights_sync(), engine.weight_version + 1), 60
        )
    assert not engine.healthy
    await engine.close()
    assert not (pids & descendants())
    assert os.sched_getaffinity(0) == ALL_CORES  # this process got its cores back
    with pytest.raises(RuntimeError, match="after close"):
        await engine.generate(GenerationRequest("late", rig.prompts[0], 1))
