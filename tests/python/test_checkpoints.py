"""save_checkpoint / load_checkpoint: a run saved, loaded in a new process and continued equals
the run without the interruption; client_state comes back; exports hold the fp32 values."""
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import strata
from models import TinyGpt, batches, ds_config, strata_losses

HERE = os.path.dirname(os.path.abspath(__file__))

SCRIPT = textwrap.dedent("""
    import json, sys, torch
    sys.path.insert(0, {here!r})
    import strata
    from models import TinyGpt, batches, ds_config, strata_losses
    mode, tmp, ck, first, total, gas, action = sys.argv[1:8]
    first, total, gas = int(first), int(total), int(gas)
    torch.manual_seed(0)
    model = TinyGpt()
    engine, _, _, _ = strata.initialize(model=model, config=ds_config(mode, tmp, gas=gas, clip=0.5))
    data = batches(total, 2, gas)
    out = {{}}
    if action == "save":
        out["losses"] = strata_losses(engine, data[:first * gas])
        engine.save_checkpoint(ck, client_state={{"epoch": 3, "note": "hi"}})
    elif action == "load":
        path, client = engine.load_checkpoint(ck)
        out["path"] = path
        out["client"] = client
        out["step"] = engine.global_steps
        out["losses"] = strata_losses(engine, data[first * gas:])
    else:
        out["losses"] = strata_losses(engine, data)
    state = engine.fp32_state_dict()
    out["sum"] = {{k: v.double().sum().item() for k, v in state.items()}}
    print("RESULT " + json.dumps(out))
""")


def run(tmp_path, *args):
    script = tmp_path / "run.py"
    script.write_text(SCRIPT.format(here=HERE))
    p = subprocess.run([sys.executable, str(script), *map(str, args)], capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


@pytest.mark.parametrize("mode", ["none", "cpu", "nvme"])
def test_resume_in_a_new_process_equals_the_uninterrupted_run(mode, tmp_path):
    swap = tmp_path / "swap"
    swap.mkdir()
    ck = tmp_path / "ck"
    whole = run(tmp_path, mode, swap, ck, 0, 8, 2, "whole")
    first = run(tmp_path, mode, swap, ck, 3, 8, 2, "save")
    assert (ck / "latest").read_text().strip() == "global_step3"
    second = run(tmp_path, mode, swap, ck, 3, 8, 2, "load")
    assert second["path"] == str(ck / "global_step3")
    assert second["client"] == {"epoch": 3, "note": "hi"}
    assert second["step"] == 3
    assert first["losses"] + second["losses"] == whole["losses"]
    assert second["sum"] == whole["sum"]


def test_tags_latest_and_missing_checkpoints(tmp_path):
    torch.manual_seed(0)
    engine, _, _, _ = strata.initialize(model=TinyGpt(), config=ds_config("cpu", tmp_path))
    with pytest.warns(UserWarning, match="no checkpoint"):
        assert engine.load_checkpoint(tmp_path / "none") == (None, None)
    data = batches(3, 2, 1)
    strata_losses(engine, data[:1])
    engine.save_checkpoint(tmp_path / "ck", tag="first")
    before = engine.fp32_state_dict()
    strata_losses(engine, data[1:])
    engine.save_checkpoint(tmp_path / "ck", tag="second")
    assert (tmp_path / "ck" / "latest").read_text().strip() == "second"
    path, client = engine.load_checkpoint(tmp_path / "ck", tag="first")
    assert path.endswith("first") and client == {}  # DeepSpeed's: no client state saved
    assert engine.global_steps == 1
    after = engine.fp32_state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    with pytest.raises(strata.errors.NotFoundError):
        engine.load_checkpoint(tmp_path / "ck", tag="third")
    engine.close()


def test_checkpoint_of_another_model_is_refused(tmp_path):
    torch.manual_seed(0)
    engine, _, _, _ = strata.initialize(model=TinyGpt(), config=ds_config("cpu", tmp_path))
    strata_losses(engine, batches(1, 2, 1))
    engine.save_checkpoint(tmp_path / "ck")
    engine.close()
    other, _, _, _ = strata.initialize(model=TinyGpt(layers=2),
                                       config=ds_config("cpu", tmp_path))
    with pytest.raises(strata.StrataError) as e:
        other.load_checkpoint(tmp_path / "ck")
    assert e.value.code in ("data_loss", "invalid_argument")
    other.close()


def test_exports_hold_the_master_weights(tmp_path):
    torch.manual_seed(0)
    engine, _, _, _ = strata.initialize(model=TinyGpt(), config=ds_config("nvme", tmp_path))
    strata_losses(engine, batches(2, 2, 1))
    state = engine.fp32_state_dict()
    path = tmp_path / "model.safetensors"
    engine.save_fp32_safetensors(path)
    raw = path.read_bytes()
    header_len = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + header_len])
    body = raw[8 + header_len:]
    trainable = {n for n, p in engine.module.named_parameters() if p.requires_grad}
    assert set(header) - {"__metadata__"} == trainable
    for name in trainable:
        t = state[name]
        meta = header[name]
        assert meta["dtype"] == "F32" and meta["shape"] == list(t.shape)
        begin, end = meta["data_offsets"]
        values = torch.frombuffer(bytearray(body[begin:end]), dtype=torch.float32)
        assert torch.equal(values.reshape(t.shape), t)
    engine.close()


class _RunsCode:
    """An object whose unpickling runs code: what a hostile client_state holds."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))  # unpickling creates the marker file


def test_a_client_state_that_runs_code_is_refused_unless_trusted(tmp_path):
    """load_checkpoint unpickles client_state with weights_only=True: a checkpoint from anyone
    cannot run code on load; tensors, numbers and containers still come back, and the caller can
    opt in (with a warning) for a checkpoint it trusts."""
    import argparse

    torch.manual_seed(0)
    engine, _, _, _ = strata.initialize(model=TinyGpt(), config=ds_config("cpu", tmp_path))
    strata_losses(engine, batches(1, 2, 1))
    marker = tmp_path / "ran"
    engine.save_checkpoint(tmp_path / "hostile", client_state={"x": _RunsCode(str(marker))})
    assert not marker.exists()
    refused = strata.errors.InvalidArgumentError
    with pytest.raises(refused, match="client_state of checkpoint") as e:
        engine.load_checkpoint(tmp_path / "hostile")
    assert "trust_client_state=True" in str(e.value)
    assert not marker.exists(), "loading a checkpoint ran its code"

    # A common client_state beyond plain containers (argparse's Namespace, as scripts save
    # their args): refused by name, loaded when allowed or trusted.
    engine.save_checkpoint(tmp_path / "args", client_state={"args": argparse.Namespace(lr=1)})
    with pytest.raises(refused, match="Namespace"):
        engine.load_checkpoint(tmp_path / "args")
    with pytest.warns(UserWarning, match="runs code"):
        _, client = engine.load_checkpoint(tmp_path / "args", trust_client_state=True)
    assert client["args"].lr == 1

    safe = {"epoch": 3, "rng": torch.arange(4), "hist": [1.5, "a", (2, None)]}
    engine.save_checkpoint(tmp_path / "plain", client_state=safe)
    _, client = engine.load_checkpoint(tmp_path / "plain")
    assert client["epoch"] == 3 and client["hist"] == [1.5, "a", (2, None)]
    assert torch.equal(client["rng"], torch.arange(4))
    engine.close()


def test_a_save_does_not_replace_a_directory_that_is_not_a_checkpoint(tmp_path):
    """A directory (or file) that merely has the tag's name, a user's `global_step1` holding other
    files, is refused naming it, and left as it was; a checkpoint under that tag is replaced."""
    torch.manual_seed(0)
    engine, _, _, _ = strata.initialize(model=TinyGpt(), config=ds_config("cpu", tmp_path))
    strata_losses(engine, batches(1, 2, 1))
    ck = tmp_path / "ck"
    (ck / "global_step1").mkdir(parents=True)
    (ck / "global_step1" / "notes.txt").write_text("mine")
    (ck / "best").write_text("a file")
    for tag in (None, "best"):
        with pytest.raises(strata.errors.FailedPreconditionError, match="not a strata checkpoint"):
            engine.save_checkpoint(ck, tag=tag)
    assert (ck / "global_step1" / "notes.txt").read_text() == "mine"
    assert (ck / "best").read_text() == "a file"
    assert not (ck / "latest").exists()
    engine.save_checkpoint(ck, tag="ours")
    engine.save_checkpoint(ck, tag="ours")  # a checkpoint of that tag: replaced
    assert (ck / "latest").read_text().strip() == "ours"
    engine.close()
