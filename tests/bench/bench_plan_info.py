"""Does the reference-likelihood signal (train.py --info-weight) tell informative plans from content-free ones, and
does it agree with execution? Measured before adopting it as a reward.

For every problem of an evaluate.py results dir that holds planner-coder.jsonl (greedy plans and their verdicts), it
computes train.reference_information (the frozen Coder's mean log-likelihood per token of MBPP's reference solution
given the plan, minus given agents.CONTENT_FREE_PLAN) for:
  - the Planner's own plan (from the results file),
  - generic plans that pass no format gate of ours but say nothing (the content-free list of tests/test_agents.py),
  - another problem's plan (the next problem's own plan),
and prints their means, the mean gain of own plans whose program passed vs failed, and how often an own plan beats
the other problem's plan on its problem. Ends with one line `RESULT key=value ...`.

    python tests/bench/bench_plan_info.py --results runs/eval/val-base --model DIR [--limit 90] [--dtype float32]
"""
import argparse
import contextlib
import json
import os
import sys
from types import SimpleNamespace

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]

import numpy as np  # noqa: E402
import torch  # noqa: E402

import agents  # noqa: E402
import data  # noqa: E402
import train  # noqa: E402
from test_agents import CONTENT_FREE  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--results", required=True, help="an evaluate.py results dir with planner-coder.jsonl")
    p.add_argument("--model", default=os.environ.get("CORECODE_MODEL"), help="the base model dir (the frozen Coder)")
    p.add_argument("--split", default="validation")
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--generic", type=int, default=3, help="generic plans scored per problem")
    args = p.parse_args()
    with open(os.path.join(args.results, "planner-coder.jsonl")) as f:
        rows = {r["id"]: r["samples"][0] for r in map(json.loads, f)}
    problems = [q for q in data.load("mbpp", split=args.split) if q.id in rows][:args.limit]
    model, tok = agents.load_model(args.model, dtype=args.dtype)
    run = SimpleNamespace(args=SimpleNamespace(micro_batch=8, logprob_chunk=256), tokenizer=tok, model=model,
                          device=next(model.parameters()).device, agent=lambda role: contextlib.nullcontext())
    own = [rows[q.id]["plan"] for q in problems]
    other = own[1:] + own[:1]
    generic = CONTENT_FREE[1:1 + args.generic]
    with torch.no_grad():
        g_own = train.reference_information(run, problems, own)
        g_other = train.reference_information(run, problems, other)
        g_gen = [train.reference_information(run, problems, [plan] * len(problems)) for plan in generic]
    passed = np.array([rows[q.id]["verdict"] == "passed" for q in problems])
    g_own, g_other, g_gen = np.array(g_own), np.array(g_other), np.array(g_gen)  # (N,), (N,), (K, N)
    print(f"{len(problems)} problems; own plans: mean gain {g_own.mean():+.4f} nats/token "
          f"(passed {g_own[passed].mean() if passed.any() else float('nan'):+.4f}, "
          f"failed {g_own[~passed].mean() if (~passed).any() else float('nan'):+.4f})")
    print(f"generic plans: mean gain {g_gen.mean():+.4f}; another problem's plan: {g_other.mean():+.4f}")
    print(f"own plan above the other problem's plan on {np.mean(g_own > g_other):.2f} of problems; above every "
          f"generic plan on {np.mean((g_own[None] > g_gen).all(0)):.2f}")
    print(f"RESULT problems={len(problems)} info_own={g_own.mean():.4f} info_own_passed="
          f"{g_own[passed].mean() if passed.any() else float('nan'):.4f} info_own_failed="
          f"{g_own[~passed].mean() if (~passed).any() else float('nan'):.4f} info_generic={g_gen.mean():.4f} "
          f"info_other={g_other.mean():.4f} own_above_other={np.mean(g_own > g_other):.2f}")


if __name__ == "__main__":
    main()
