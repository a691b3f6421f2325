"""The README's "From Python" training script runs as written (in a scratch directory)."""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_readme_training_script_runs(tmp_path):
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    section = text.split("## From Python", 1)[1].split("\n## ", 1)[0]
    scripts = re.findall(r"```python\n(.*?)```", section, re.S)
    assert scripts, "no python block in README's From Python section"
    script = tmp_path / "train.py"
    script.write_text(scripts[0])
    p = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    lines = [line.split() for line in p.stdout.splitlines() if line and line[0].isdigit()]
    assert [int(x[0]) for x in lines] == [0, 10, 20, 30]
    assert float(lines[-1][1]) < 0.5 * float(lines[0][1])  # it learns
    assert (tmp_path / "ckpt" / "latest").read_text().strip() == "global_step40"
    assert (tmp_path / "model.safetensors").stat().st_size > 4 * 2 * 256 * 1024 * 4
