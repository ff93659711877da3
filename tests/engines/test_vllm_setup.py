"""Choosing and configuring the vLLM engine: config keys, the checks run before
vLLM starts (each naming the fix), the engine arguments, the weight files."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import torch
import yaml

from asyncrl.config import config_from_dict, load_config
from asyncrl.engines.vllm import setup as vllm_setup
from asyncrl.engines.vllm import transport as vllm_transport
from asyncrl.errors import ConfigError, MissingDependency
from asyncrl.policy.build import build_policy
from asyncrl.policy.hf import save_policy
from asyncrl.run.backends import build_backends
from asyncrl.run.options import engine_options
from asyncrl.tasks import build_task
from tests.vllm_support import vllm_run_config

ROOT = Path(__file__).resolve().parents[2]


def test_the_local_engine_stays_the_default():
    cfg = config_from_dict({})
    assert cfg.policy.engine == "local"
    assert cfg.policy.vllm.gpu_memory_utilization == 0.1
    assert cfg.policy.vllm.dtype == "float32"


def test_engine_and_vllm_keys_load_from_overrides():
    cfg = load_config(None, ["policy.engine=vllm", "policy.vllm.gpu_memory_utilization=0.2",
                             "policy.vllm.engine_args={enable_prefix_caching: false}"])
    assert cfg.policy.engine == "vllm"
    assert cfg.policy.vllm.gpu_memory_utilization == 0.2
    assert cfg.policy.vllm.engine_args == {"enable_prefix_caching": False}
    with pytest.raises(ConfigError, match=r"policy\.engine"):
        load_config(None, ["policy.engine=sglang"])
    with pytest.raises(ConfigError, match="gpu_memory_utilization"):
        load_config(None, ["policy.engine=vllm", "policy.vllm.gpu_memory_utilization=1.5"])


def test_deterministic_mode_needs_the_local_engine():
    with pytest.raises(ConfigError, match=r"deterministic: true needs policy\.engine: local"):
        load_config(None, ["deterministic=true", "policy.engine=vllm"])


def test_engine_args_take_the_block_and_fixed_settings():
    cfg = vllm_run_config(seed=5, policy={"vllm": {"engine_args": {"block_size": 32}}})
    args = vllm_setup.engine_args(cfg.policy, "/m", seed=engine_options(cfg).seed)
    assert args["model"] == args["tokenizer"] == "/m"
    assert args["seed"] == 5 and args["block_size"] == 32
    assert args["logprobs_mode"] == "processed_logprobs"  # behavior log-probs after top-p
    assert args["generation_config"] == "vllm"  # no sampling defaults from the model dir
    assert args["max_num_seqs"] == cfg.policy.generation.max_batch_sequences
    assert vllm_setup.engine_args(cfg.policy, "/m", seed=9)["seed"] == 9  # a Ray worker's own


@pytest.mark.parametrize(("key", "fix"), [
    ("seed", "set policy.vllm.seed instead"),
    ("model", "set policy.model_name_or_path instead"),
    ("logprobs_mode", "asyncrl sets it"),
])
def test_engine_args_that_asyncrl_owns_are_refused(key, fix):
    cfg = vllm_run_config(policy={"vllm": {"engine_args": {key: 1}}})
    with pytest.raises(ConfigError, match=f"policy.vllm.engine_args.{key}: {fix}"):
        vllm_setup.engine_args(cfg.policy, "/m", seed=0)


def test_an_unknown_engine_arg_is_named_with_a_suggestion():
    with pytest.raises(ConfigError, match=r"engine_args.enable_prefix_cachin: .*"
                                          r"did you mean 'enable_prefix_caching'"):
        vllm_setup.check_engine_args({"enable_prefix_cachin": True})


def test_heads_the_cpu_kernels_reject_are_refused_with_the_fix():
    cfg = load_config(None, ["policy.engine=vllm"])  # the default model: 4 heads of 16
    assert vllm_setup.is_cpu_platform()
    with pytest.raises(ConfigError) as info:
        vllm_setup.check_config(cfg.policy)
    msg = str(info.value)
    assert "heads of size 16" in msg and "policy.model.num_heads=2" in msg
    vllm_setup.check_config(vllm_run_config().policy)  # 2 heads of 32 pass


def test_a_pretrained_model_with_small_heads_is_refused(tmp_path):
    cfg = config_from_dict({})
    model, tok = build_policy(cfg.policy, build_task(cfg.task))  # heads of 16
    save_policy(model, tok, tmp_path / "m")
    bad = load_config(None, ["policy.engine=vllm", f"policy.model_name_or_path={tmp_path / 'm'}"])
    with pytest.raises(ConfigError, match=r"head_dim of .*config.json gives attention heads "
                                          r"of size 16.*policy.engine: local"):
        vllm_setup.check_config(bad.policy)


def test_a_missing_vllm_is_one_line_with_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm now fails
    cfg = vllm_run_config()
    with pytest.raises(MissingDependency) as info:
        build_backends(cfg, build_task(cfg.task))
    msg = str(info.value)
    assert "\n" not in msg
    assert "policy.engine: vllm" in msg and "pip install 'asyncrl[vllm]'" in msg


def test_weights_are_written_as_safetensors_tied_ones_too(tmp_path):
    from safetensors.torch import load_file

    shared = torch.arange(6.0).reshape(2, 3)
    weights = {"embed.weight": shared, "lm_head.weight": shared, "norm.weight": torch.ones(3)}
    assert vllm_transport.write_safetensors(weights, tmp_path) == tmp_path
    loaded = load_file(str(tmp_path / "model.safetensors"))
    assert set(loaded) == set(weights)
    for name, tensor in weights.items():
        assert torch.equal(loaded[name], tensor)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.safetensors"]


#: Starts a long-lived child, has a Reaper watch it, then dies by SIGKILL (or
#: exits normally after releasing the reaper); prints the child's pid.
OWNER = """
import os, signal, subprocess, sys
from asyncrl.engines.vllm.setup import Reaper
child = subprocess.Popen([sys.executable, "-c", "import signal; signal.pause()"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
reaper = Reaper({child.pid})
print(child.pid, flush=True)
if sys.argv[1] == "release":
    reaper.release()
else:
    os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.e2e
@pytest.mark.parametrize("end", ["sigkill", "release"])
def test_the_reaper_kills_what_a_dead_owner_left_unless_released(end):
    owner = subprocess.run([sys.executable, "-c", OWNER, end], capture_output=True, text=True,
                           timeout=60)
    child = psutil.Process(int(owner.stdout))
    try:
        if end == "sigkill":
            psutil.wait_procs([child], timeout=15)  # returns as soon as it is gone
            assert not child.is_running()
        else:  # release() returned after the reaper exited without killing anything
            assert child.is_running()
    finally:
        if child.is_running():
            child.kill()


#: Starts a process the way vLLM starts its engine core (multiprocessing, spawn,
#: inside own_session), lets it end, and exits without joining it.
SPAWNER = """
import multiprocessing, os, time
from multiprocessing.connection import wait
from asyncrl.engines.vllm import setup

if __name__ == "__main__":
    with setup.own_session():
        child = multiprocessing.get_context("spawn").Process(target=time.sleep, args=(0,))
        child.start()
    print(os.getsid(child.pid) == child.pid, len(setup._SPAWNED), flush=True)
    wait([child.sentinel])  # it ends, unreaped: vLLM's shutdown leaves its engine core so
"""


@pytest.mark.e2e
def test_processes_started_in_their_own_session_leave_no_popen_running_at_exit():
    """Neither the spawned process nor multiprocessing's resource tracker (which
    lives until this process ends) is a Popen that the interpreter's teardown
    finds "still running" (a ResourceWarning at every xdist worker's exit that
    had started vLLM)."""
    proc = subprocess.run([sys.executable, "-W", "default::ResourceWarning", "-c", SPAWNER],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "ResourceWarning" not in proc.stderr, proc.stderr
    assert proc.stdout.split() == ["True", "1"]  # its own session; the one Popen kept


def _blocks(path: Path, lang: str) -> list[str]:
    parts = path.read_text().split(f"```{lang}\n")[1:]
    return [part.split("```")[0] for part in parts]


def test_the_docs_config_blocks_are_valid_vllm_configs():
    blocks = [b for b in _blocks(ROOT / "docs" / "engines.md", "yaml") if "engine: vllm\n" in b]
    assert len(blocks) >= 2  # choosing vLLM; its weight transport
    for block in blocks:
        cfg = config_from_dict(yaml.safe_load(block))
        assert cfg.policy.engine == "vllm"
        vllm_setup.check_config(cfg.policy)


@pytest.mark.parametrize("doc", ["docs/engines.md", "README.md"])
def test_the_documented_vllm_commands_pass_every_check_before_vllm_starts(doc):
    commands = [shlex.split(b) for b in _blocks(ROOT / doc, "bash") if "policy.engine=vllm" in b]
    assert commands
    for words in commands:
        assert Path(words[0]).name == "asyncrl" and words[1] == "train"
        overrides = [w for w in words if "=" in w]
        cfg = load_config(ROOT / words[words.index("--config") + 1], overrides)
        vllm_setup.check_config(cfg.policy)  # e2e/test_vllm_train.py runs it for real


def test_vllm_output_goes_to_the_log_file_unless_verbose(tmp_path: Path, monkeypatch) -> None:
    """Issue 18, case 5 (the line count on the real quickstart: tests/e2e/test_vllm_output.py)."""
    import logging
    import os

    from asyncrl.engines.vllm.output import VLLMOutput

    vllm_setup.require_vllm()
    monkeypatch.delenv("VLLM_LOGGING_CONFIG_PATH", raising=False)
    monkeypatch.delenv("VLLM_CONFIGURE_LOGGING", raising=False)
    vllm_logger = logging.getLogger("vllm")
    before = list(vllm_logger.handlers)
    output = VLLMOutput(tmp_path / "vllm.log")
    try:
        config = Path(os.environ["VLLM_LOGGING_CONFIG_PATH"])  # vLLM's processes read it
        assert output.stream is not None and config.is_file()
        logging.getLogger("vllm.some.module").warning("a note of vLLM's")
        assert "a note of vLLM's" in (tmp_path / "vllm.log").read_text()
        assert output.where() == f"vLLM's log ({tmp_path / 'vllm.log'})"
    finally:
        output.close()
    assert "VLLM_LOGGING_CONFIG_PATH" not in os.environ and not config.exists()
    assert vllm_logger.handlers == before  # vLLM's own handlers back
    monkeypatch.setattr(logging.getLogger("asyncrl"), "level", logging.DEBUG)  # asyncrl -v
    verbose = VLLMOutput(tmp_path / "other.log")
    assert verbose.path is None and verbose.stream is None
    assert not (tmp_path / "other.log").exists()
    assert vllm_setup.engine_args(vllm_run_config().policy, "/m", seed=0)["use_tqdm_on_load"] is True


@pytest.mark.parametrize(("setting", "cuda", "tp", "route"), [
    ("auto", False, 1, "disk"), ("auto", True, 1, "ipc"), ("auto", True, 2, "disk"),
    ("disk", True, 1, "disk"),  # the way out when IPC fails on a GPU
    ("disk", False, 1, "disk"), ("ipc", True, 1, "ipc"),
])
def test_the_weight_transport_setting_picks_a_route(setting, cuda, tp, route):
    assert vllm_transport.choose_route(setting, cuda=cuda, tensor_parallel_size=tp) == route


@pytest.mark.parametrize(("cuda", "tp", "why"), [(False, 1, "CUDA GPU"),
                                                  (True, 2, "tensor_parallel_size=2")])
def test_ipc_where_it_cannot_work_names_the_fix(cuda, tp, why):
    with pytest.raises(ConfigError, match=f"{why}.*set weight_transport: disk") as info:
        vllm_transport.choose_route("ipc", cuda=cuda, tensor_parallel_size=tp)
    assert "\n" not in str(info.value)


def test_the_weight_transport_key_is_validated():
    assert load_config(None, ["policy.vllm.weight_transport=disk"]).policy.vllm.weight_transport \
        == "disk"
    with pytest.raises(ConfigError, match="weight_transport"):
        load_config(None, ["policy.vllm.weight_transport=nccl"])
