"""The README's quick start runs as written, on the tiny random model: its `python ...` commands are read from the
README's "Quick start" block, and only the model, the data file, the dtype, the sandbox workers and the out dirs are
swapped in (what a user would have on another machine)."""
import os
import re
import shlex
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def quick_start_commands():
    """The `python ...` commands of the README's Quick start code block, continuation lines joined."""
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    section = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1).replace("\\\n", " ")
    return [shlex.split(line.split("#")[0]) for line in block.splitlines() if line.startswith("python ")]


def test_the_quick_start_has_an_evaluation_and_a_training_command():
    scripts = [cmd[1] for cmd in quick_start_commands()]
    assert scripts == ["evaluate.py", "train.py"]


def test_the_quick_start_runs_as_written_on_the_tiny_model(tiny_model_dir, mbpp_path, tmp_path):
    for i, cmd in enumerate(quick_start_commands()):
        out = tmp_path / f"run{i}"
        argv = cmd[1:]
        argv[argv.index("--out") + 1] = str(out)
        argv += ["--model", tiny_model_dir, "--data", mbpp_path, "--dtype", "float32", "--workers", "2"]
        r = subprocess.run([sys.executable, *argv], capture_output=True, text=True, cwd=ROOT, timeout=600)
        assert r.returncode == 0, r.stderr[-2000:]
        assert os.path.exists(out / ("summary.json" if argv[0] == "evaluate.py" else "metrics.jsonl"))
        if argv[0] == "train.py":
            assert r.stdout.count("step ") >= 3 and "sandbox:" in r.stdout
