"""Two ranks started as torchrun starts them (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) give
the training of one rank with the same global batch."""
import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))

SCRIPT = textwrap.dedent("""
    import json, os, sys, torch
    sys.path.insert(0, {here!r})
    import strata
    from models import TinyGpt, batches, ds_config
    mode, tmp, world = sys.argv[1], sys.argv[2], int(sys.argv[3])
    rank = int(os.environ.get("RANK", "0"))
    torch.manual_seed(0)
    model = TinyGpt()
    # The global batch is 4 sequences per step: micro-batches of 4 // world on each rank.
    micro = 4 // world
    engine, _, _, _ = strata.initialize(model=model, config=ds_config(mode, tmp, micro=micro,
                                                                      clip=1.0))
    assert engine.world_size == world and engine.global_rank == rank
    losses = []
    for ids, labels in batches(6, 4, 1):
        mine = slice(rank * micro, (rank + 1) * micro)
        loss = engine(ids[mine], labels[mine])
        losses.append(loss.item())
        engine.backward(loss)
        engine.step()
    state = {{k: v.tolist() for k, v in engine.fp32_state_dict().items()}}
    print("RESULT " + json.dumps({{"losses": losses, "state": state}}))
""")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(tmp_path, mode, world):
    script = tmp_path / "rank.py"
    script.write_text(SCRIPT.format(here=HERE))
    port = free_port()
    procs = []
    for rank in range(world):
        swap = tmp_path / f"swap-{world}-{rank}"
        swap.mkdir()
        env = dict(os.environ)
        if world > 1:
            env.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                       LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=str(port))
        procs.append(subprocess.Popen([sys.executable, str(script), mode, str(swap), str(world)],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      env=env))
    results = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        line = [x for x in out.splitlines() if x.startswith("RESULT ")][-1]
        results.append(json.loads(line[len("RESULT "):]))
    return results


@pytest.mark.parametrize("mode", ["none", "cpu", "nvme"])
def test_two_ranks_train_as_one_with_the_same_global_batch(mode, tmp_path):
    (one,) = launch(tmp_path, mode, 1)
    two = launch(tmp_path, mode, 2)
    # The ranks hold the same parameters (every rank's fp32_state_dict is the whole model).
    assert two[0]["state"] == two[1]["state"]
    # The same values up to the rounding of another summation order (one rank sums the batch's
    # gradients inside autograd, two ranks sum two halves). Adam divides gradients by their
    # magnitude, so such differences grow where a gradient is ~0 (the key biases, which softmax
    # ignores): compare the weights that matter with a bound of a few lr-sized steps' noise.
    worst = max((torch.tensor(v) - torch.tensor(two[0]["state"][k])).abs().max().item()
                for k, v in one["state"].items() if not k.endswith("qkv.bias"))
    assert worst < 1e-4, worst
    # One rank's loss is the mean over the global batch: the mean of the two ranks' losses.
    for l1, l0, lr1 in zip(one["losses"], two[0]["losses"], two[1]["losses"]):
        assert l1 == pytest.approx((l0 + lr1) / 2, rel=1e-5)
