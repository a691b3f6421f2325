"""Ctrl-C (SIGINT) raises KeyboardInterrupt once the engine is in a consistent state: a run
interrupted at a random moment, saved and resumed in a new process, equals the run without it."""
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))

SCRIPT = textwrap.dedent("""
    import json, sys, torch
    sys.path.insert(0, {here!r})
    import strata
    from models import TinyGpt, batches, ds_config
    mode, tmp, ck, action = sys.argv[1:5]
    torch.manual_seed(0)
    engine, _, _, _ = strata.initialize(model=TinyGpt(layers=6, d=64),
                                        config=ds_config(mode, tmp, gas=2))
    data = batches(400, 2, 2)
    losses = {{}}
    if action == "resume":
        engine.load_checkpoint(ck)
    start = engine.global_steps * 2
    try:
        for i in range(start, len(data)):
            if i == start + 4:
                print("RUNNING", flush=True)
            ids, labels = data[i]
            loss = engine(ids, labels)
            engine.backward(loss)
            losses[i] = loss.item()
            engine.step()
            if action == "resume" and engine.global_steps >= int(sys.argv[5]):
                break
    except KeyboardInterrupt:
        # Consistent: finish the accumulation window's step if its backward ran, then save.
        while engine.micro_steps % 2 != 0:
            i = engine.micro_steps
            engine.backward(engine(*data[i]))
            engine.step()
        if engine._backward_pending:
            engine.step()
        engine.save_checkpoint(ck)
        print("RESULT " + json.dumps({{"interrupted_at": engine.global_steps}}), flush=True)
        sys.exit(0)
    sums = {{k: v.double().sum().item() for k, v in engine.fp32_state_dict().items()}}
    print("RESULT " + json.dumps({{"losses": losses, "sums": sums}}), flush=True)
""")


def result(out):
    return json.loads([x for x in out.splitlines() if x.startswith("RESULT ")][-1][7:])


@pytest.mark.parametrize("mode", ["cpu", "nvme"])
def test_ctrl_c_then_resume_equals_the_uninterrupted_run(mode, tmp_path):
    script = tmp_path / "run.py"
    script.write_text(SCRIPT.format(here=HERE))
    swap = tmp_path / "swap"
    swap.mkdir()
    ck = tmp_path / "ck"
    p = subprocess.Popen([sys.executable, str(script), mode, str(swap), str(ck), "train"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "RUNNING"
    time.sleep(0.7)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, err
    at = result(out)["interrupted_at"]
    assert 2 <= at < 400, out
    resumed = subprocess.run([sys.executable, str(script), mode, str(swap), str(ck), "resume",
                              str(at + 3)], capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    # The reference: a run without interruption to the same step.
    whole = subprocess.run([sys.executable, "-c", _reference(script, mode, swap, at + 3)],
                           capture_output=True, text=True, timeout=300)
    assert whole.returncode == 0, whole.stderr
    got, want = result(resumed.stdout), result(whole.stdout)
    assert got["sums"] == want["sums"]
    for i, loss in got["losses"].items():
        assert loss == want["losses"][i]


def _reference(script, mode, swap, steps):
    return textwrap.dedent(f"""
        import sys
        sys.argv = [{str(script)!r}, {mode!r}, {str(swap)!r}, "unused", "resume", "{steps}"]
        import strata
        strata.StrataEngine.load_checkpoint = lambda self, d: (None, None)
        exec(open({str(script)!r}).read())
    """)
