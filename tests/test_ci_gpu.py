"""`.ci/gpu OUTDIR` rehearsed on the CPU, and the sampler benchmark's memory child.

On a machine without CUDA, .ci/gpu runs its whole sequence with the tiny model (Planner step, Coder step under the
trained Planner, a toy step, evaluate.py with both adapters, bench_sampler.py, the checks): this test runs it, so the
script a GPU machine runs once in a while cannot rot in between. What only a GPU shows is in README ("What holds on
CUDA").
"""
import json
import os
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.skipif(torch.cuda.is_available(), reason="with CUDA .ci/gpu runs the real check, not the rehearsal")
def test_ci_gpu_rehearses_every_stage_on_the_cpu(tmp_path):
    out = tmp_path / "out"
    r = subprocess.run(["bash", ".ci/gpu", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    last = r.stdout.strip().splitlines()[-1]
    assert last.startswith("RESULT device=cpu ") and " ok=true " in last, last
    summary = json.loads((out / "summary.json").read_text())
    assert float(summary["toy_gnorm"]) > 0 and float(summary["toy_B_absmax"]) > 0  # a real update on the toy step
    for path in ("planner/metrics.jsonl", "coder/metrics.jsonl", "eval/summary.json", "bench_sampler.log",
                 "planner.log", "coder.log", "eval.log", "ci-gpu.log"):
        assert (out / path).is_file(), path


def test_sampler_bench_memory_child_runs_the_shape_it_is_given(tiny_model_dir):
    # The child was never passed --mem-batch / --mem-seq: it measured 2 x 256 while the parent printed 8 x 512.
    r = subprocess.run([sys.executable, "tests/bench/bench_sampler.py", "--device", "cpu", "--parts", "mem",
                        "--mem-model", tiny_model_dir, "--mem-batch", "3", "--mem-seq", "40", "--real-model", ""],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    children = [json.loads(x.split(":", 1)[1]) for x in r.stdout.splitlines() if x.startswith("memory child:")]
    assert len(children) == 2 and all((c["batch"], c["seq"]) == (3, 40) for c in children)
