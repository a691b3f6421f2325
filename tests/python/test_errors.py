"""Bad input raises a Python exception carrying strata's code; the interpreter lives on."""
import os
import subprocess
import sys

import pytest
import torch
import torch.nn as nn

import strata
from models import (TinyGpt, assert_losses_like_torch, assert_param_like_torch, batches,
                    ds_config, strata_losses)


def test_config_error_names_the_key(tmp_path):
    config = ds_config("cpu", tmp_path)
    config["zero_optimization"]["offload_param"]["device"] = "floppy"
    with pytest.raises(strata.errors.InvalidArgumentError) as e:
        strata.initialize(model=TinyGpt(), config=config)
    assert e.value.code == "invalid_argument"
    assert "offload_param" in str(e.value)
    assert isinstance(e.value, ValueError)


def test_missing_config_file():
    with pytest.raises(strata.errors.NotFoundError) as e:
        strata.initialize(model=TinyGpt(), config="/nonexistent/ds_config.json")
    assert e.value.code == "not_found" and isinstance(e.value, FileNotFoundError)


def test_a_config_path_that_is_no_file_is_refused_not_read(tmp_path):
    """strata.initialize(config=PATH) reads the file as `strata train --config` does: a FIFO (which
    blocked for ever waiting for a writer), /dev/zero (read until memory ran out), a directory or a
    file that is not UTF-8 are refused naming the path. In a child process, so a hang fails the
    test instead of blocking the suite."""
    fifo = tmp_path / "ds.fifo"
    os.mkfifo(fifo)
    latin = tmp_path / "latin1.json"
    latin.write_bytes(b'{"train_batch_size": 1, "x": "caf\xe9"}')
    script = (
        "import sys, strata\n"
        "sys.path.insert(0, %r)\n"
        "from models import TinyGpt\n"
        "for path in sys.argv[1:]:\n"
        "    try:\n"
        "        strata.initialize(model=TinyGpt(), config=path)\n"
        "        print('accepted', path)\n"
        "    except strata.errors.InvalidArgumentError as e:\n"
        "        print('refused', path, '|', e)\n" % os.path.dirname(os.path.abspath(__file__)))
    paths = [str(fifo), "/dev/zero", str(tmp_path), str(latin)]
    p = subprocess.run([sys.executable, "-c", script, *paths], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith(("refused", "accepted"))]
    assert len(lines) == len(paths), p.stdout + p.stderr
    for path, line in zip(paths, lines):
        assert line.startswith("refused " + path + " |"), line
    assert "FIFO" in lines[0] and "character device" in lines[1] and "directory" in lines[2]
    assert "UTF-8" in lines[3]


@pytest.mark.parametrize("key,value", [("host_memory", 1e30), ("device_memory", -5),
                                       ("pinned_memory", float("nan")), ("host_memory", "2X"),
                                       ("device_memory", 1 << 60), ("host_memory", [1])])
def test_memory_sizes_are_range_checked_as_the_commands_flags(key, value, tmp_path):
    """host_memory=1e30 or device_memory=-5 were taken as given (-5 wrapped to 2^64 - 5); the
    keywords now go through the same check as --host-memory and friends, naming the keyword."""
    with pytest.raises(strata.errors.InvalidArgumentError) as e:
        strata.initialize(model=TinyGpt(), config=ds_config("cpu", tmp_path), **{key: value})
    assert key in str(e.value)


def test_from_pretrained_seq_len_is_checked(tmp_path):
    for bad in (0, -1, 1.5, True, 1 << 21):
        with pytest.raises(strata.errors.InvalidArgumentError, match="seq_len"):
            strata.from_pretrained("tiny", config=ds_config("cpu", tmp_path), seq_len=bad)


def test_model_without_parameters(tmp_path):
    with pytest.raises(strata.errors.InvalidArgumentError, match="no parameters"):
        strata.initialize(model=nn.ReLU(), config=ds_config("cpu", tmp_path))


def test_step_before_backward(tmp_path):
    engine, _, _, _ = strata.initialize(model=TinyGpt(), config=ds_config("cpu", tmp_path))
    with pytest.raises(strata.errors.FailedPreconditionError) as e:
        engine.step()
    assert e.value.code == "failed_precondition"
    # The engine still works after the mistake.
    strata_losses(engine, batches(1, 2, 1))
    assert engine.global_steps == 1
    engine.close()


def test_loss_without_grad(tmp_path):
    engine, _, _, _ = strata.initialize(model=TinyGpt(), config=ds_config("cpu", tmp_path))
    ids, labels = batches(1, 2, 1)[0]
    with torch.no_grad():
        loss = engine(ids, labels)
    with pytest.raises(strata.errors.InvalidArgumentError, match="does not require grad"):
        engine.backward(loss)
    engine.close()


def test_closed_engine(tmp_path):
    engine, _, _, _ = strata.initialize(model=TinyGpt(), config=ds_config("cpu", tmp_path))
    engine.close()
    with pytest.raises(strata.errors.FailedPreconditionError, match="closed"):
        engine.backward(torch.ones((), requires_grad=True))


INJECT = """
import sys, torch
sys.path.insert(0, {here!r})
import strata
from models import TinyGpt, batches, ds_config, strata_losses
torch.manual_seed(0)
try:
    engine, _, _, _ = strata.initialize(model=TinyGpt(), config=ds_config("nvme", {tmp!r}))
    strata_losses(engine, batches(3, 2, 1))
except strata.StrataError as e:
    print("CAUGHT", e.code, type(e).__name__)
    print("MESSAGE", e)
    print("ALIVE", 1 + 1)
    sys.exit(0)
print("NO ERROR")
"""


@pytest.mark.parametrize("fault,code,cls", [("eio:write:8", "io_error", "IoError"),
                                            ("flip:write@optimizer:1", "data_loss", "DataLossError")])
def test_nvme_error_injected_is_an_exception(fault, code, cls, tmp_path):
    """An NVMe write failing with EIO (while initialize writes the first state), or a swap block's
    bit flipped on its way to the disk (a step's read checks its checksum): the error reaches
    Python with its code, the interpreter alive. (A failed read is retried once, and absorbed.)"""
    here = os.path.dirname(os.path.abspath(__file__))
    script = tmp_path / "inject.py"
    script.write_text(INJECT.format(here=here, tmp=str(tmp_path)))
    env = dict(os.environ, STRATA_IO_FAULTS=fault)
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env,
                       timeout=300)
    assert p.returncode == 0, p.stderr
    assert f"CAUGHT {code} {cls}" in p.stdout, p.stdout + p.stderr
    assert "ALIVE 2" in p.stdout


def test_non_finite_gradients_stop_before_the_update(tmp_path):
    engine, _, _, _ = strata.initialize(model=TinyGpt(), config=ds_config("nvme", tmp_path))
    data = batches(2, 2, 1)
    strata_losses(engine, data[:1])
    before = engine.fp32_state_dict()
    loss = engine(*data[1]) * float("nan")
    engine.backward(loss)
    with pytest.raises(strata.errors.FailedPreconditionError) as e:
        engine.step()
    assert "step 2" in str(e.value)
    after = engine.fp32_state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    engine.close()


KILLED = """
import os, signal, sys, torch
sys.path.insert(0, {here!r})
import strata
from models import TinyGpt, batches, ds_config, strata_losses
engine, _, _, _ = strata.initialize(model=TinyGpt(), config=ds_config("nvme", {tmp!r}))
strata_losses(engine, batches(1, 2, 1))
print(sorted(os.listdir({tmp!r})), flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_swap_of_a_killed_process_is_reclaimed_by_the_next_engine(tmp_path):
    here = os.path.dirname(os.path.abspath(__file__))
    swap = tmp_path / "swap"
    swap.mkdir()
    script = tmp_path / "killed.py"
    script.write_text(KILLED.format(here=here, tmp=str(swap)))
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert p.returncode == -9
    left = [d for d in os.listdir(swap) if d.startswith("strata-swap-")]
    assert left, p.stdout + p.stderr
    engine, _, _, _ = strata.initialize(model=TinyGpt(), config=ds_config("nvme", swap))
    now = [d for d in os.listdir(swap) if d.startswith("strata-swap-")]
    assert not set(left) & set(now)
    engine.close()
    assert not [d for d in os.listdir(swap) if d.startswith("strata-swap-")]


FAIL = {"on": False}


class FailsInBackward(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(32, 16)
        self.block = nn.Sequential(nn.Linear(16, 16), nn.Tanh())
        self.head = nn.Linear(16, 32)

    def forward(self, ids, labels):
        x = self.emb(ids)
        x = self.block(x)
        logits = self.head(x)
        return torch.nn.functional.cross_entropy(logits.reshape(-1, 32), labels.reshape(-1))


def _failing_forward(module):
    original = module.forward

    def forward(x):
        if FAIL["on"] and torch.is_grad_enabled():  # the recomputation in backward
            raise RuntimeError("injected failure in a unit's backward")
        return original(x)
    return forward


@pytest.mark.parametrize("mode", ["cpu", "nvme"])
def test_a_failed_backward_restarts_the_accumulation_window(mode, tmp_path):
    """Backward fails part-way in the last micro-batch of a window: the window's gradients are
    dropped, and feeding the window again gives the run without the failure."""
    import copy
    from models import torch_reference
    torch.manual_seed(0)
    model = FailsInBackward()
    reference = copy.deepcopy(model)
    model.block[0].forward = _failing_forward(model.block[0])
    data = batches(3, 2, 2, vocab=32)
    expected = torch_reference(reference, data, 2)
    config = ds_config(mode, tmp_path, gas=2, strata={"offload_unit_classes": ["Linear"]})
    engine, _, _, _ = strata.initialize(model=model, config=config)
    strata_losses(engine, data[:2])  # window 1
    engine.backward(engine(*data[2]))
    engine.step()
    FAIL["on"] = True
    try:
        loss = engine(*data[3])
        with pytest.raises(RuntimeError, match="injected failure"):
            engine.backward(loss)
        assert engine.micro_steps == 2  # back to the window's first micro-batch
    finally:
        FAIL["on"] = False
    got = strata_losses(engine, data[2:])  # window 2 again
    assert_losses_like_torch(got, expected[2:])
    final = engine.fp32_state_dict()
    for name, p in reference.named_parameters():
        assert_param_like_torch(final[name], p, name)
    engine.close()
