"""Does the blind Coder (train.py --blind-weight) tell informative plans from content-free ones? Measured before
training with it.

For every problem of an evaluate.py results dir that holds a Planner row (greedy plans and their verdicts), the frozen
Coder writes one greedy program from the plan with the statement hidden (agents.blind_problem: the plan and the
problem's public examples only), run on the hidden tests, for:
  - the Planner's own plan (from the results file),
  - generic plans that say nothing (the content-free list of tests/test_agents.py),
  - another problem's plan (the next problem's own plan),
and prints the blind pass@1 of each, and of own plans whose sighted program (the results file's) passed vs failed.
Ends with one line `RESULT key=value ...`.

    python tests/bench/bench_blind_plans.py --results runs/eval/val-base --model DIR [--limit 90] [--generic 2]
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

import agents  # noqa: E402
import data  # noqa: E402
import sandbox  # noqa: E402
import train  # noqa: E402
from test_agents import CONTENT_FREE  # noqa: E402


def blind_pass(run, problems, plans):
    """Pass (bool) on the hidden tests of the blind Coder's greedy program from each (problem, plan): training's own
    train.blind_pass_rates, so the bench measures exactly what --blind-weight adds."""
    return np.array([r == 1.0 for r in train.blind_pass_rates(run, problems, plans)])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--results", required=True, help="an evaluate.py results dir with the --row file")
    p.add_argument("--row", default="planner-coder-plain", help="the Planner row whose plans are scored")
    p.add_argument("--model", default=os.environ.get("CORECODE_MODEL"), help="the base model dir (the frozen Coder)")
    p.add_argument("--split", default="validation")
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--generic", type=int, default=2, help="generic plans scored per problem")
    p.add_argument("--workers", type=int, default=2)
    args = p.parse_args()
    with open(os.path.join(args.results, args.row + ".jsonl")) as f:
        rows = {r["id"]: r["samples"][0] for r in map(json.loads, f)}
    problems = [q for q in data.load("mbpp", split=args.split) if q.id in rows][:args.limit]
    model, tok = agents.load_model(args.model, dtype=args.dtype)
    own = [rows[q.id]["plan"] for q in problems]
    other = own[1:] + own[:1]
    with sandbox.SandboxPool(args.workers) as pool:
        run = SimpleNamespace(args=SimpleNamespace(max_new_tokens=args.max_new_tokens, stop_on_failure=False),
                              tokenizer=tok, model=model, pool=pool, agent=lambda role: contextlib.nullcontext(model))
        b_own = blind_pass(run, problems, own)
        b_other = blind_pass(run, problems, other)
        b_gen = np.array([blind_pass(run, problems, [plan] * len(problems))
                          for plan in CONTENT_FREE[:args.generic]])  # (K, N)
    sighted = np.array([rows[q.id]["verdict"] == "passed" for q in problems])
    when = {k: b_own[m].mean() if m.any() else float("nan") for k, m in (("passed", sighted), ("failed", ~sighted))}
    print(f"{len(problems)} problems; blind pass@1 with own plans {b_own.mean():.3f} (sighted program passed "
          f"{when['passed']:.3f}, failed {when['failed']:.3f}); generic plans {b_gen.mean():.3f}; another problem's "
          f"plan {b_other.mean():.3f}")
    print(f"RESULT problems={len(problems)} blind_own={b_own.mean():.3f} blind_own_passed={when['passed']:.3f} "
          f"blind_own_failed={when['failed']:.3f} blind_generic={b_gen.mean():.3f} blind_other={b_other.mean():.3f} "
          f"sighted_own={sighted.mean():.3f}")


if __name__ == "__main__":
    main()
