"""train.py: CoRe-Code's collaborative GRPO, one stage at a time, as a plain script.

What it is: `python train.py --stage planner` trains the Planner's LoRA adapter with GRPO while the Coder is frozen;
`--stage coder` then trains the Coder's adapter under the trained, frozen Planner. The same recipe trains MapCoder's
Retrieval agent (`--stage retriever`) and Debugging agent (`--stage debugger`, on problems whose Coder program fails
a public test), and `--stage direct` is the paper's single-agent GRPO baseline. Every agent is a named LoRA adapter
on ONE base model in memory (an agents.Team); the KL reference is that base with every adapter off
(grpo.adapters_off), so no second copy exists. With --planner-model the Planner is an adapter on a second base of its
own (e.g. a larger Planner for a smaller Coder), which is then the trained Planner's reference. Rewards come only
from running programs in the sandbox (sandbox.py) and scoring the results (rewards.py). The stages differ only by an
entry of the STAGES table.

One step, read top to bottom from `train()` (grpo_step -> rollout_and_score + learn, log_evaluate_checkpoint):
    1 sample     the stage's chain of roles (agents.run_chain): frozen roles before the trained one write once per
                 problem, the trained role samples a group of G, the frozen roles after it write M outputs for each
    2 execute    every program runs on its problem's hidden tests in the sandbox pool
    3 reward     the stage's reward function scores the trained role's G outputs (rewards.py)
    4 advantages group-normalised (grpo.group_advantages)
    5 reference  log-probs of the sampled tokens with all adapters off (skipped when beta == 0)
    6 learn      GRPO loss, backward in micro-batches, gradient clipping, optimizer + scheduler step
    7 log        a line per step, a JSON line in metrics.jsonl
    8 eval/ckpt  held-out pass@1 of the stage's method, of direct coding and of the plan controls (CG and plan
                 information are tracked), atomic checkpoints (adapter + optimizer + scheduler + RNG + step)

Each problem of a step samples from its own generator, seeded by (seed, step, problem index), so a resumed run
repeats exactly what it would have done, on any number of ranks. Under `torchrun --nproc_per_node N` each rank
takes a contiguous share of the step's problems and the adapter's gradients are summed over ranks, so the update is
the single-process one (README, "Many GPUs"); rank 0 alone writes.

What it is not: a trainer framework (no Trainer class, callbacks or config system), or a vLLM rollout engine: our
KV-cache sampler (agents.sample) is exact and shares a prefill per group, but has no paged attention. Dropped: a
printed time estimate (it missed by 6-30x across machines), hints that repeated what the logged numbers say, and
curves.png (metrics.jsonl holds every figure, one JSON line per step: plot it with what you use).

References: DeepSeekMath (GRPO, arXiv:2402.03300); CoRe-Code (the paper this repository implements); nanoGPT /
nanochat for the script style.
"""
import argparse
import dataclasses
import json
import os
import random
import shlex
import shutil
import sys
import time
from dataclasses import dataclass

import numpy as np
import torch
from tqdm import tqdm

import agents
import data
import evaluate
import grpo
import rewards
import sandbox
from evaluate import UsageError, at_least

# -----------------------------------------------------------------------------------------------------------------
# The stages. `chain`: the order in which the roles run on a problem; `train`: the role whose outputs form the GRPO
# group (its adapter is the only thing updated); `reward`: the function in REWARDS that scores them. Roles before the
# trained one run once per problem, the first role after it M (--downstream-samples) times per output, later ones
# once per context. Optional: `needs_public_failure` keeps only problems whose upstream program (ctx["program"])
# fails a PUBLIC test, with its feedback in ctx["feedback"] (hidden tests never reach a prompt); `eval_method` is
# the held-out method compared with direct coding (default planner-coder); `format_gate` penalises plans whose
# format is broken or that say nothing (agents.plan_check, rewards.format_gated). MapCoder's Retrieval agent is scored
# like a plan (by the programs the frozen Planner -> Coder write from its recollection), its Debugging agent like a
# program. "toy" rewards a character in the raw text, no sandbox: the tests prove with it that this loop learns.
STAGES = {
    "planner": dict(chain=("planner", "coder"), train="planner", reward="planner", format_gate=True),
    "coder": dict(chain=("planner", "coder"), train="coder", reward="coder"),
    # The paper's main baseline, single-agent GRPO: the Coder trained on the problem alone, with the coder reward.
    "direct": dict(chain=("coder",), train="coder", reward="coder", eval_method="direct"),
    "retriever": dict(chain=("retriever", "planner", "coder"), train="retriever", reward="planner",
                      eval_method="mapcoder"),
    "debugger": dict(chain=("coder", "debugger"), train="debugger", reward="coder", needs_public_failure=True,
                     eval_method="mapcoder"),
    "toy": dict(chain=("coder",), train="coder", reward="toy"),
}


# Each reward function scores one group: (results of its G*M programs, the G contexts right after the trained role,
# G, M, args) -> (G rewards, {efficiency term: the G rewards without it}), the second for the log of how often the
# term changed the group's ranking (rewards.rank_changed).
def reward_planner(results, outputs, G, M, args):
    """Planner stage: a plan is scored by the pass rate and CPU time of the M programs the frozen Coder wrote; with
    the stage's format gate on, agents.plan_check of the plan the Coder saw (outputs[g]["verdict"]) decides: a
    malformed or content-free plan gets -format_penalty, one cut at the token cap loses --cut-penalty."""
    pr = [[r.pass_rate for r in results[g * M:(g + 1) * M]] for g in range(G)]
    cpu = [[r.cpu_s for r in results[g * M:(g + 1) * M]] for g in range(G)]
    both = [rewards.planner_rewards(pr, cpu), rewards.planner_rewards(pr, cpu, w_time=0.0)]
    if args.blind_weight:  # what the plan alone lets the Coder write (blind_pass_rates), before the gate
        both = [[r + args.blind_weight * o["blind"] for r, o in zip(rs, outputs)] for rs in both]
    if STAGES[args.stage].get("format_gate") and args.format_gate:
        both = [rewards.format_gated(r, [o["verdict"] for o in outputs], penalty=args.format_penalty,
                                     cut_penalty=args.cut_penalty) for r in both]
    return both[0], {"time": both[1]}


def reward_coder(results, outputs, G, M, args):
    """Coder stage: a program is scored by its pass rate plus, when it passes everything, its space efficiency."""
    if M != 1:
        raise UsageError("the coder reward scores the trained role's own programs: use --downstream-samples 1")
    pr, peak = [r.pass_rate for r in results], [r.peak_bytes for r in results]
    return rewards.coder_rewards(pr, peak), {"memory": rewards.coder_rewards(pr, peak, w_mem=0.0)}


def reward_toy(results, outputs, G, M, args):
    """Toy stage: the fraction of characters of the raw completion that are `--toy-target` (a string test)."""
    return rewards.toy_rewards([o["raw"] for o in outputs], target=args.toy_target), {}


REWARDS = {"planner": reward_planner, "coder": reward_coder, "toy": reward_toy}


def get_args(argv=None):
    p = evaluate.OneLineParser(
        description="Collaborative GRPO for code generation (CoRe-Code): train the Planner (--stage planner), then "
                    "the Coder (--stage coder); or MapCoder's Retrieval agent (--stage retriever) or Debugging agent "
                    "(--stage debugger) with the other agents frozen. Each agent is a named LoRA adapter on one "
                    "shared base model.")
    p.add_argument("--stage", choices=sorted(STAGES),
                   help="which agent to train: planner, coder (after planner), direct (single-agent GRPO baseline: "
                        "the Coder alone), retriever / debugger (MapCoder's agents), toy (a sanity check)")
    evaluate.add_shared_flags(p, split="train", timing_repeats=3)
    p.add_argument("--allow-held-out-split", action="store_true",
                   help="allow a held-out split where training reads it: a --split other than train (test, "
                        "validation, all: refused by default, because configurations are chosen on validation and "
                        "claims are read on test) or --eval-split test (checkpoints would be chosen on test)")
    p.add_argument("--eval-split", default="validation", help="held-out split of the periodic evaluation")
    p.add_argument("--eval-limit", type=at_least(0), default=20, help="held-out problems evaluated (greedy, pass@1)")
    p.add_argument("--eval-batch-size", type=at_least(1), default=16,
                   help="held-out problems generated together. our choice 16: all 90 MBPP validation problems in one "
                        "batch ran a 2-core CPU box out of its 24 GB during prefill (0.5B, bf16)")
    grpo_flags(p)
    optimisation_flags(p)
    args = p.parse_args(argv)
    args.out = args.out or os.path.join("runs", args.stage or "")
    return args


def grpo_flags(p):
    """The flags of the rollout, the rewards and the GRPO objective."""
    p.add_argument("--num-steps", type=at_least(1), default=200, help="optimizer steps")
    p.add_argument("--problems-per-step", type=at_least(1), default=4,
                   help="problems (groups) per step; stage debugger keeps only those whose Coder program fails a "
                        "public test (a step with none is skipped and logged as no_group)")
    p.add_argument("--group-size", type=at_least(2), default=8,
                   help="G: samples of the trained role per problem (>= 2: a group of one has no variance)")
    p.add_argument("--downstream-samples", type=at_least(1), default=1,
                   help="M: outputs of each frozen downstream role per sample (stage planner: programs per plan)")
    p.add_argument("--temperature", type=at_least(1e-6, float), default=1.0,
                   help="sampling temperature of the trained role (> 0: GRPO needs different samples in a group)")
    p.add_argument("--upstream-temperature", type=at_least(0.0, float), default=0.0,
                   help="temperature of frozen roles before the trained one; our choice 0 (greedy): the group then "
                        "shares one context, so rewards differ only by the trained role's samples")
    p.add_argument("--downstream-temperature", type=at_least(0.0, float), default=0.0,
                   help="temperature of frozen roles after the trained one; our choice 0 (greedy) with M=1, so a "
                        "plan's reward is not blurred by the Coder's sampling noise (use >0 with M>1)")
    p.add_argument("--planner-prompt", choices=sorted(agents.PLANNER_TEMPLATES), default="skeleton",
                   help="the Planner's prompt, in training and in its held-out eval: skeleton (the four parts as a "
                        "template to fill in; evaluate.py's planner-coder) or plain (the parts by name, no template "
                        "to copy; evaluate.py's planner-coder-plain; the untrained plain prompt needs ~256 plan "
                        "tokens), or one that starts from the problem's restatement (its answer is pre-filled with it): "
                        "restate (the Planner adds the steps), conditions (only the Conditions and Loops), worked "
                        "(it works the example through); evaluate.py's planner-coder-<name>. our choice of default: skeleton, what the first runs used "
                        "(default: skeleton)")
    p.add_argument("--beta", type=at_least(0.0, float), default=0.04, help="KL coefficient (DeepSeekMath: 0.04)")
    p.add_argument("--clip-eps", type=at_least(0.0, float), default=0.2,
                   help="PPO clip range (inert: one optimisation pass per batch makes the ratio exactly 1; see learn)")
    p.add_argument("--format-gate", action=argparse.BooleanOptionalAction, default=True,
                   help="stage planner: a plan that is malformed, copies format placeholders, repeats a part, has "
                        "one-word steps, copies the statement or is content-free (agents.plan_check) gets "
                        "-(--format-penalty) whatever its code scored. our choice: on, because the reward alone pays "
                        "for empty plans that let the Coder code directly (plan collapse, seen in a pilot)")
    p.add_argument("--format-penalty", type=at_least(0.0, float), default=0.5,
                   help="the reward of a plan that fails the format gate (as -penalty); see rewards.format_gated")
    p.add_argument("--cut-penalty", type=at_least(0.0, float), default=0.1,
                   help="deducted from the reward of a plan that ran into --plan-max-new-tokens but is well formed "
                        "as far as it went: it is scored by its code, not failed as malformed (rewards.format_gated)")
    p.add_argument("--adv-std-floor", type=at_least(0.0, float), default=0.1,
                   help="groups' rewards are divided by max(std, this) (grpo.group_advantages). our choice 0.1, the "
                        "largest efficiency bonus: a group whose programs all pass and differ by a millisecond gets "
                        "small advantages, not +-1; groups whose pass rates differ (std >= ~0.3) are unaffected. "
                        "0 = plain GRPO")
    p.add_argument("--blind-weight", type=at_least(0.0, float), default=0.0,
                   help="stage planner, MBPP-like benchmarks (no starter code): add this times the pass rate of a "
                        "program the frozen Coder writes greedily from the plan with the statement hidden "
                        "(agents.blind_problem). our choice: 0 (off: a restatement of the problem beat a generic plan "
                        "under it, +14 / -2 on 90 validation problems, so it pays for copying the statement); one "
                        "more greedy Coder call per plan")
    p.add_argument("--toy-target", default="a", help="stage toy only: the character that is rewarded")


def optimisation_flags(p):
    """The flags of the optimizer, LoRA and the run directory."""
    p.add_argument("--lr", type=at_least(0.0, float), default=1e-5, help="AdamW learning rate of the LoRA parameters")
    p.add_argument("--weight-decay", type=at_least(0.0, float), default=0.0, help="AdamW weight decay")
    p.add_argument("--warmup-steps", type=at_least(0), default=10, help="linear warm-up steps, then constant")
    p.add_argument("--grad-clip", type=at_least(0.0, float), default=1.0, help="max global grad norm")
    p.add_argument("--micro-batch", type=at_least(1), default=8, help="completions per forward/backward")
    p.add_argument("--logprob-chunk", type=at_least(1), default=256,
                   help="completion tokens per output-layer chunk (memory: one chunk x vocab float32 buffer)")
    # our choice: on everywhere. Without it a Planner run of the 0.5B in fp32 on a CPU (2 x G=4, plans and programs
    # <= 256 tokens) was killed for memory at 24 GB in step 4, after three steps that learned in 109-135 s; resumed
    # with it, step 4 learned in 209 s at a 10.5 GB peak. Memory first: a run killed after hours loses more.
    p.add_argument("--grad-ckpt", action=argparse.BooleanOptionalAction, default=True,
                   help="gradient checkpointing of the decoder layers (default on; --no-grad-ckpt learns faster where "
                        "memory allows: a 0.5B Planner run at 256 + 256 tokens was killed at 24 GB without it)")
    p.add_argument("--lora-r", type=at_least(1), default=16, help="LoRA rank")
    p.add_argument("--lora-alpha", type=float, default=32, help="LoRA alpha (scaling = alpha / r)")
    p.add_argument("--lora-dropout", type=at_least(0.0, float), default=0.0,
                   help="our choice 0: dropout would make training-time log-probs differ from sampling-time ones")
    p.add_argument("--lora-targets", default=",".join(grpo.DEFAULT_TARGETS), help="comma-separated module names")
    p.add_argument("--eval-every", type=at_least(0), default=25,
                   help="held-out eval every N steps (and at 0 and the end); 0 = never")
    p.add_argument("--save-every", type=at_least(1), default=25,
                   help="keep the checkpoint of every N-th step (and of the end); every completed step writes one, and "
                        "the newest is kept until the next, so a stopped run loses at most the step in flight")
    p.add_argument("--keep-last", type=at_least(1), default=3, help="--save-every checkpoints kept")
    p.add_argument("--resume", action="store_true", help="continue from the last checkpoint in --out")


def check_args(args):
    """What argparse's types cannot say: combinations of flags, held-out splits, the adapters. One UsageError line."""
    if not args.stage:
        raise UsageError("--stage is required (planner, coder, direct, retriever, debugger or toy); see --help")
    if args.downstream_samples > 1 and args.downstream_temperature == 0:
        raise UsageError("--downstream-samples > 1 with --downstream-temperature 0 would repeat one greedy output; "
                         "set --downstream-temperature > 0")
    if args.blind_weight and args.stage != "planner":
        raise UsageError("--blind-weight scores Planner plans: it needs --stage planner")
    if args.blind_weight and agents.PLANNER_TEMPLATES[args.planner_prompt] in agents.RESTATE_PREFILLS:
        raise UsageError(f"--blind-weight with --planner-prompt {args.planner_prompt}: the plan's pre-filled "
                         "restatement would show the blind Coder the statement it hides")
    if args.planner_model and "planner" not in STAGES[args.stage]["chain"]:
        raise UsageError(f"--planner-model: stage {args.stage} has no Planner (stages with one: "
                         f"{', '.join(s for s, d in STAGES.items() if 'planner' in d['chain'])})")
    held_out = held_out_use(args)
    if held_out and not args.allow_held_out_split:
        raise UsageError(f"{held_out}; use another split, or pass --allow-held-out-split to do it anyway")
    # Adapters and benchmark options are checked before anything slow happens (bad input loses nothing).
    args.adapters = evaluate.parse_adapters(args.adapter)
    try:
        args.bench_kwargs = data.parse_bench_options(args.bench, args.bench_option)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if args.stage == "coder" and "planner" not in args.adapters:
        args.adapters["planner"] = os.path.join("runs", "planner", "final", "planner")
        if not os.path.isdir(args.adapters["planner"]):
            raise UsageError(f"stage coder needs the trained Planner: no adapter at {args.adapters['planner']}; run "
                             "--stage planner first, or pass --adapter planner=DIR (--adapter planner=none for the "
                             "base Planner)")


def held_out_use(args):
    """Why this run would train on held-out problems or choose its checkpoints with test or training problems ("" when
    it would not). Held-out data never does either unless the user says so by name, on every benchmark: only a split
    named "train" is trained on (MBPP's "all" holds test and validation; HumanEval has only "test")."""
    if args.stage == "toy":  # it reads only the prompts' characters
        return ""
    if args.split != "train":
        return f"--split {args.split} holds held-out problems (only a split named train is trained on)"
    if args.eval_every > 0 and args.eval_split in ("test", "train", "all"):
        return f"--eval-split {args.eval_split} would choose checkpoints on test or training problems"
    return ""


def eval_method(args):
    """The method the held-out eval measures the trained role with: the stage's, with the Planner's own prompt."""
    method = STAGES[args.stage].get("eval_method") or "planner-coder"
    return f"planner-coder-{args.planner_prompt}" if method == "planner-coder" and args.planner_prompt != "skeleton" \
        else method


# -----------------------------------------------------------------------------------------------------------------
# Rollout: the stage's chain of roles (agents.run_chain), expanding contexts at the trained role (x G) and after it
# (x M).


def stage_chain(args):
    """((role, k, temperature), ...) of the stage: frozen roles before the trained one once per problem at
    --upstream-temperature, the trained role G times at --temperature, the first role after it M times and later
    ones once at --downstream-temperature, so every trained output has exactly M leaves."""
    chain, roles, trained = [], STAGES[args.stage]["chain"], STAGES[args.stage]["train"]
    for j, role in enumerate(roles):
        after = j - roles.index(trained)
        chain.append((role, args.group_size, args.temperature) if after == 0 else
                     (role, 1, args.upstream_temperature) if after < 0 else
                     (role, args.downstream_samples if after == 1 else 1, args.downstream_temperature))
    return chain


def rollout(run, problems, generators, show=lambda text: None):
    """Returns (Samples of the trained role, one row per (group, g)), the leaves: a (problem, context) per
    (group, g, m), in that order, and the groups' problems. A stage with needs_public_failure keeps only the problems
    whose upstream program fails a PUBLIC test (agents.check_public: the hidden tests never reach a prompt), so
    there may be fewer groups than problems; with none left it returns (None, [], [], [])."""
    args, stage = run.args, STAGES[run.args.stage]
    chain = stage_chain(args)
    at = [role for role, _, _ in chain].index(stage["train"])
    start = {"template": args.planner_prompt, "k": args.mapcoder_k}
    probs, ctxs, _ = agents.run_chain(run.team, chain[:at], problems, [dict(start) for _ in problems],
                                      list(generators), show=show)
    if stage.get("needs_public_failure"):
        verdicts = agents.check_public(probs, [c.get("program", "") for c in ctxs], run.team.pool)
        keep = [i for i, (ok, _) in enumerate(verdicts) if not ok]
        if not keep:
            return None, [], [], []
        probs, generators = [probs[i] for i in keep], [generators[i] for i in keep]
        ctxs = [dict(ctxs[i], feedback=verdicts[i][1]) for i in keep]
    group_probs = list(probs)
    leaf_probs, leaves, samples = agents.run_chain(run.team, chain[at:], probs, ctxs, list(generators), show=show)
    return samples[stage["train"]], leaf_probs, leaves, group_probs


# -----------------------------------------------------------------------------------------------------------------
# Held-out evaluation: greedy pass@1 of the stage's method (planner-coder, or mapcoder for MapCoder's agents), of
# direct coding (CG) and of the plan controls (plan information against the strongest of them).


def eval_key(method):
    """The metrics key of a method's held-out pass@1: eval_pass1_planner_coder, eval_pass1_mapcoder, ..."""
    return "eval_pass1_" + method.replace("-", "_")


def summed(dicts):
    """Key-wise sums of a list of {name: number} dicts (one per rank): times, and loss statistics already weighted by
    each rank's share of the rows."""
    out = {}
    for d in dicts:
        for k, v in d.items():
            out[k] = out.get(k, 0.0) + v
    return out


def eval_path(out, step):
    return os.path.join(out, "eval", f"step_{step:06d}.jsonl")


def read_eval(out, step):
    """{method: {task_id: passed}} of the held-out evaluation written at `step` ({} when there is none), as rank 0
    reads it. Every rank gets rank 0's rows (a collective: all ranks call it), so a rank that cannot see rank 0's
    files (several nodes, no shared filesystem) takes rank 0's branch rather than hang in another collective."""
    path, rows = eval_path(out, step), {}
    if grpo.rank_and_world()[0] == 0 and os.path.exists(path):
        with open(path) as f:
            for r in (json.loads(line) for line in f if line.strip()):
                rows.setdefault(r["method"], {})[r["task_id"]] = r["passed"]
    return grpo.from_rank0(rows)


def eval_rows(run, method):
    """Greedy pass@1 rows of one method on the held-out problems (each rank its share, gathered in order)."""
    args, mine, local = run.args, grpo.shard(run.eval_set), []
    for a in range(0, len(mine), args.eval_batch_size):
        chunk = mine[a:a + args.eval_batch_size]
        records, _, _ = evaluate.attempt_and_judge(run.team, method, chunk, seed=args.seed,
                                                   stop_on_failure=args.stop_on_failure,
                                                   show=lambda text: show(run, f"held-out {method}: {text}"))
        local += [dict(task_id=p.id, method=method, passed=r["verdict"] == "passed", pass_rate=r["pass_rate"],
                       plan=r["plan"], plan_cut=r.get("plan_cut", False), program=r["program"])
                  for p, (r,) in zip(chunk, records)]
    return [r for part in grpo.gather(local) for r in part]


def held_out_eval(run, step):
    """The stage's method, direct coding and (for a method with its own plans) the plan controls on the held-out
    problems: CG = method - direct, plan information = method - the strongest control with its paired counts, the
    format of the method's plans, and the paired comparison with step 0 (exact McNemar on the same problems).
    Per-problem rows go to <out>/eval/step_N.jsonl. Methods only the Coder writes for cannot change while the Coder is
    frozen: they run once and are read back from step 0's file (an evaluation is a large share of a CPU run)."""
    args, ids = run.args, [p.id for p in run.eval_set]
    helper = eval_method(args)
    controls = list(agents.PLAN_CONTROLS) if helper in evaluate.OWN_PLANS else []
    at_start = read_eval(args.out, 0) if step > 0 else {}
    out, rows, passed, t0 = {}, [], {}, time.time()
    for method in dict.fromkeys((helper, "direct", *controls)):
        cached = at_start.get(method, {}) if method != helper and STAGES[args.stage]["train"] != "coder" else {}
        new = [dict(task_id=i, method=method, passed=cached[i], cached_from_step=0) for i in ids] \
            if all(i in cached for i in ids) else eval_rows(run, method)
        rows += new
        passed[method] = {r["task_id"]: r["passed"] for r in new}
        out[eval_key(method)] = sum(passed[method].values()) / max(1, len(new))
        if method == helper and helper != "direct":
            out.update(agents.plan_stats([r["plan"] for r in new], [r["plan_cut"] for r in new], prefix="eval_"))
    if at_start.get(helper):  # paired with step 0: gained = solved now only, lost = solved at step 0 only
        pair = evaluate.paired(passed[helper], at_start[helper])
        out.update(eval_gained=pair["gained"], eval_lost=pair["lost"], eval_mcnemar_p=pair["p"])
    if helper != "direct":
        out["eval_cg"] = rewards.collaboration_gain(out[eval_key(helper)], out["eval_pass1_direct"])
    control = evaluate.strongest(passed, controls)
    if control:
        pair = evaluate.paired(passed[helper], passed[control])
        out.update(eval_plan_info=out[eval_key(helper)] - out[eval_key(control)], eval_info_vs=control,
                   eval_info_gained=pair["gained"], eval_info_lost=pair["lost"], eval_info_p=pair["p"])
    out["t_eval"] = time.time() - t0
    if run.lead:  # rank 0 writes the rows
        os.makedirs(os.path.join(args.out, "eval"), exist_ok=True)
        with open(eval_path(args.out, step) + ".tmp", "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
        os.replace(eval_path(args.out, step) + ".tmp", eval_path(args.out, step))
    return out


# -----------------------------------------------------------------------------------------------------------------
# Checkpoints: written to a temp dir and renamed into place, so a kill never leaves a half-written one.


def checkpoint_dirs(out):
    root = os.path.join(out, "checkpoints")
    if not os.path.isdir(root):
        return []
    return sorted(os.path.join(root, d) for d in os.listdir(root) if d.startswith("step_"))


def save_checkpoint(run, step):
    args, root = run.args, os.path.join(run.args.out, "checkpoints")
    os.makedirs(root, exist_ok=True)
    final, tmp = os.path.join(root, f"step_{step:06d}"), os.path.join(root, f".tmp_step_{step:06d}")
    shutil.rmtree(tmp, ignore_errors=True)
    grpo.save_adapter(run.model, run.role, os.path.join(tmp, "adapter", run.role),
                      base_model_name_or_path=run.base_name)
    state = {"step": step,  # the number of completed steps
             "optimizer": run.optimizer.state_dict(), "scheduler": run.scheduler.state_dict(),
             "rng": rng_states(run.device)}
    torch.save(state, os.path.join(tmp, "state.pt"))
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    # Kept: the last --keep-last of the --save-every steps (and the end's), and the newest, whatever its step.
    dirs = checkpoint_dirs(args.out)
    saved = [d for d in dirs if int(d[-6:]) % args.save_every == 0 or int(d[-6:]) == args.num_steps]
    for old in set(dirs) - set(saved[-args.keep_last:]) - {dirs[-1]}:
        shutil.rmtree(old, ignore_errors=True)
    return final


def load_checkpoint(path, run):
    """Restore a checkpoint into the model's adapter, the optimizer, the scheduler and the RNGs; returns its step.
    (Sampling needs no saved state: each problem's generator is a function of (seed, step, problem index).)"""
    grpo.load_adapter(run.model, run.role, os.path.join(path, "adapter", run.role))
    # weights_only=False: the file holds RNG states (numpy tuples) that we wrote ourselves in save_checkpoint.
    state = torch.load(os.path.join(path, "state.pt"), map_location="cpu", weights_only=False)
    run.optimizer.load_state_dict(state["optimizer"])
    run.scheduler.load_state_dict(state["scheduler"])
    set_rng_states(state["rng"], run.device)
    return state["step"]


def rng_states(device):
    """The RNGs a resumed run continues: python, numpy, torch's CPU one and the run's CUDA device's, only that one
    (a rank owns one GPU; a CPU run on a CUDA machine has none to save)."""
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
            "cuda": [torch.cuda.get_rng_state(device)] if device.type == "cuda" else []}


def set_rng_states(state, device):
    """Restore rng_states' dict (older checkpoints hold every GPU's state: the first, cuda:0's, is used)."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state["cuda"] and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"][0], device)


def problem_generator(seed, step, index, device):
    """The sampling generator of training problem `index` at `step` (0-based): the same on any rank, in any batch."""
    return torch.Generator(device=device).manual_seed(((seed * 1_000_003 + step) * 1_000_003 + index) % 2**63)


def truncate_metrics(path, step):
    """A killed run may have logged steps after its last checkpoint: drop them, they will be redone."""
    if not os.path.exists(path):
        return
    with open(path) as f:
        kept = [line for line in f if line.strip() and json.loads(line)["step"] <= step]
    with open(path + ".tmp", "w") as f:
        f.writelines(kept)
    os.replace(path + ".tmp", path)


def batch_indices(step, n_problems, per_step, seed):
    """Problems of `step`: consecutive slices of a per-epoch permutation. A pure function of (step, seed), so a
    resumed run sees exactly the problems the uninterrupted run would have seen."""
    out = []
    for j in range(step * per_step, (step + 1) * per_step):
        epoch, i = divmod(j, n_problems)
        out.append(int(np.random.RandomState(seed + epoch).permutation(n_problems)[i]))
    return out


# -----------------------------------------------------------------------------------------------------------------


def main(argv=None):
    args = get_args(argv)
    words = list(sys.argv[1:] if argv is None else argv)

    def interrupted():
        if checkpoint_dirs(args.out):
            again = shlex.join(words + ([] if args.resume else ["--resume"]))
            return (f"every completed step is kept, the last in {checkpoint_dirs(args.out)[-1]}; resume with: "
                    f"python train.py {again}")
        # --resume would find nothing to continue: the same command starts again
        again = shlex.join([w for w in words if w != "--resume"])
        return f"before the first checkpoint (nothing to resume); start again with: python train.py {again}"

    rc = evaluate.cli(start, args, interrupted)
    if rc:
        sys.exit(rc)


def start(args):
    """The checks that cost nothing, then the sandbox pool (its fork-server workers start before the model: small,
    clean processes), then training. The `with` shuts the workers down however training ends."""
    check_args(args)
    rank, world = grpo.rank_and_world()
    if world > 1 and args.problems_per_step < world:
        raise UsageError(f"--problems-per-step {args.problems_per_step} is global: it must be >= the {world} ranks")
    if agents.resolve_dtype(args.dtype, args.device) == torch.float16:
        # A LoRA gradient through fp16 activations underflows without a loss scaler, and this script has none.
        raise UsageError(f"--dtype {args.dtype} gives float16 on {args.device}: training in fp16 needs loss scaling, "
                         "which train.py does not do; use --dtype bfloat16 or float32 (evaluate.py may use fp16)")
    evaluate.check_models(args)
    check_out_dir(args)
    reward = STAGES[args.stage]["reward"]
    try:
        with evaluate.open_pool(args, need_cpu=reward == "planner", need_memory=reward == "coder") as pool:
            train(args, pool, rank, world)
    except OSError as e:  # disk full, --out made read-only during the run, ...
        raise UsageError(f"I/O error: {e} (checkpoints of this run are in {args.out}/checkpoints; continue with "
                         "--resume)") from None


# Flags a resumed run may change: they decide how long it runs, where and how often it reports, not what it learns.
# Every other setting must equal the checkpointed run's (settings.json), or the resumed run would not continue it.
# --micro-batch and --grad-ckpt trade memory for time (the same gradient, up to summation order): a run killed for
# memory continues with a smaller micro-batch or with checkpointing on.
RESUME_MAY_CHANGE = {"resume", "num_steps", "out", "workers", "device", "save_every", "keep_last", "eval_every",
                     "eval_limit", "eval_batch_size", "adapter", "bench_kwargs", "micro_batch", "grad_ckpt",
                     "allow_unisolated", "allow_uncounted"}


def check_out_dir(args):
    """--out must be a writable directory (created if missing); --resume needs a checkpoint in it and the settings it
    was made with (adapters by content), a new run none."""
    evaluate.writable_out_dir(args.out)
    if args.resume and not checkpoint_dirs(args.out):
        raise UsageError(f"--resume: no checkpoint in {args.out} (nothing to continue); drop --resume to start a new "
                         "run there")
    if not args.resume and checkpoint_dirs(args.out):
        raise UsageError(f"{args.out} already holds checkpoints: pass --resume to continue, or a new --out")
    if args.resume:
        evaluate.check_settings(os.path.join(args.out, "settings.json"), run_settings(args), "checkpoints")


def run_settings(args):
    """What decides what a run learns: every flag but RESUME_MAY_CHANGE, adapters by content (evaluate.settings_of)."""
    return evaluate.settings_of(args, [k for k in vars(args) if k not in RESUME_MAY_CHANGE])


@dataclass
class State:
    """What a training run holds from one step to the next (state only; the functions below act on it)."""
    args: argparse.Namespace
    team: agents.Team            # the models, their adapters, the caps and the sandbox pool
    rank: int
    world: int
    train_set: list
    eval_set: list
    model: object                # the trained role's base model (with --planner-model, stage planner: the Planner's)
    params: list                 # the trained adapter's parameters
    optimizer: object
    scheduler: object
    device: object
    bar: object = None           # the progress bar (disabled off a terminal and on ranks other than 0)
    log: object = None           # off a terminal: where the step in flight is, at most once a minute (log_progress)
    t_start: float = 0.0         # when this process began its first step, and which step that was: the time left
    first_step: int = 0

    @property
    def lead(self):
        return self.rank == 0    # the one rank that prints, writes metrics and checkpoints

    @property
    def role(self):
        return STAGES[self.args.stage]["train"]

    @property
    def base_name(self):
        """The trained adapter's base model, as its adapter_config.json names it."""
        return self.args.planner_model if self.role == "planner" and self.args.planner_model else self.args.model


def say(run, *lines, **kw):
    """A line under the progress bar, from rank 0 only (the other ranks would repeat it)."""
    if run.lead:
        tqdm.write(*lines, **kw)


def show(run, text):
    """The phase inside a step: on the bar on a terminal (see the bar's disable=None), else a log line at most once a
    minute."""
    if run.log is not None:
        run.log(text)
    elif run.bar is not None:
        run.bar.set_postfix_str(text, refresh=True)


def work_line(run, start):
    """What the run is about to do, in the reader's units, before it spends anything on it."""
    args, stage = run.args, STAGES[run.args.stage]
    rows = len(stage["chain"]) - stage["chain"].index(run.role)  # the trained role and the roles after it
    evals = (args.num_steps // args.eval_every + 1 if args.eval_every else 0) if run.eval_set else 0
    return (f"work: {args.num_steps - start} steps x {args.problems_per_step} problems x G={args.group_size} "
            f"{run.role} samples" + (f" x M={args.downstream_samples} programs each" if rows > 1 else "")
            + f" (plans <= {args.plan_max_new_tokens} tokens, programs <= {args.max_new_tokens})"
            + (f"; {evals} held-out evals of {len(run.eval_set)} problems" if evals else "")
            + "; the time left follows each step" + ("; on a CPU, train.py's defaults (200 steps x 4 problems x "
                                                      "G=8) are sized for a GPU (README, Quick start)"
                                                      if run.device.type == "cpu" else ""))


def judged_in_parent(problems):
    """The problems whose every test is judged in the parent. HumanEval's 4 helper checks (data.HUMANEVAL_HELPER)
    decide inside the candidate's process, where an always-equal object can pass them (sandbox.py): they are never
    a reward. Evaluation keeps them, with that limitation stated."""
    return [p for p in problems if not any(data.HUMANEVAL_HELPER in str(t) for t in p.hidden_tests)]


def load_data(args):
    """The training problems (those judged in the parent) and the held-out ones; one UsageError line if absent."""
    try:
        train_set = judged_in_parent(data.load(args.bench, path=args.data, split=args.split, limit=args.limit,
                                               **args.bench_kwargs))
        eval_set = data.load(args.bench, path=args.data, split=args.eval_split, limit=args.eval_limit,
                             **args.bench_kwargs) if args.eval_every > 0 and args.eval_limit > 0 else []
    except (FileNotFoundError, ValueError, KeyError) as e:
        raise UsageError(str(e)) from None
    if not train_set:
        raise UsageError(f"no training problems in {args.bench} split {args.split!r}")
    if args.blind_weight and any(p.starter_code.strip() for p in train_set):
        raise UsageError(f"--blind-weight hides the statement, but {args.bench} problems carry starter code that "
                         "shows the task; use it with a benchmark without starter code (mbpp)")
    return train_set, eval_set


def set_up(args, pool, rank, world):
    """Seeds, data, the team with its adapters (only the trained one learns: a fresh one unless --adapter gives it),
    optimizer and scheduler, and the resume; returns (State, first step)."""
    role = STAGES[args.stage]["train"]
    # Seeds: python / numpy / torch for init and dropout (the same on every rank: identical LoRA init); sampling
    # draws from one generator per problem (problem_generator).
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    train_set, eval_set = load_data(args)
    team = evaluate.load_team(args, pool)
    policy = team.planner_model if role == "planner" and team.planner_model is not None else team.model
    if role not in team.adapters:
        grpo.add_lora(policy, role, r=args.lora_r, alpha=args.lora_alpha, dropout=args.lora_dropout,
                      targets=tuple(t for t in args.lora_targets.split(",") if t))
        team = dataclasses.replace(team, adapters=team.adapters | {role})
    # Only the trained adapter learns; a loaded frozen one must not (add/load_lora mark all LoRA params trainable).
    for m in {id(team.model): team.model, id(policy): policy}.values():
        m.requires_grad_(False)
    params = grpo.lora_parameters(policy, role)
    for p in params:
        p.requires_grad_(True)
    device = next(policy.parameters()).device
    if args.grad_ckpt:
        grpo.enable_checkpointing(policy, True)
    # AdamW over the trained adapter only; linear warm-up then constant (our choice: short runs).
    optimizer = torch.optim.AdamW(params, lr=args.lr, weight_decay=args.weight_decay, betas=(0.9, 0.99))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / max(1, args.warmup_steps)))
    run = State(args, team, rank, world, train_set, eval_set, policy, params, optimizer, scheduler, device)
    start = 0
    metrics = os.path.join(args.out, "metrics.jsonl")
    if args.resume:
        ckpts = checkpoint_dirs(args.out)  # check_out_dir made sure there is one; every rank loads the same
        start = load_checkpoint(ckpts[-1], run)
        if run.lead:
            truncate_metrics(metrics, start)
            print(f"resumed from {ckpts[-1]} (step {start})")
    if run.lead:
        # Inputs are valid and the model is loaded: now the run's arguments are worth recording.
        os.makedirs(args.out, exist_ok=True)
        if not args.resume and os.path.exists(metrics):
            os.remove(metrics)
        # settings.json also records the sandbox's mode (not compared on --resume: checked when the pool starts).
        settings = {**run_settings(args), "sandbox": pool.mode}
        for name, content in (("args.json", vars(args)), ("settings.json", settings)):
            with open(os.path.join(args.out, name), "w") as f:
                json.dump(content, f, indent=1)
        say(run, header(run))
    return run, start


def header(run):
    """The run's first line: what trains on what, with which sandbox mode, and what each efficiency term can do."""
    args, dtype = run.args, str(next(run.model.parameters()).dtype).replace("torch.", "")
    frozen = [f"{r}={d}" for r, d in sorted(args.adapters.items()) if r != run.role]
    reward = STAGES[args.stage]["reward"]
    return (f"train {args.stage}: model {args.model} | {run.device} {dtype} | {args.num_steps} steps x "
            f"{args.problems_per_step} problems x G={args.group_size} | lr {args.lr:g} beta {args.beta:g} | "
            f"{len(run.train_set)} {args.bench}/{args.split} problems, eval on {len(run.eval_set)} {args.eval_split} | "
            f"out {args.out} (all arguments: args.json)" + (f" | {run.world} ranks" if run.world > 1 else "")
            + (f" | Planner: {args.planner_model}" if args.planner_model else "")
            + (f" | frozen adapters: {', '.join(frozen)}" if frozen else "")
            + (f" | starting from {run.role}={args.adapters[run.role]}" if args.adapters.get(run.role) else "")
            + "\n" + sandbox.mode_line(run.team.pool.mode)
            + ("\nreward: pass rate, then CPU time against the group's median all-passing program "
               "(time_rank_frac logs how often it reorders a group)" if reward == "planner" else
               "\nreward: pass rate, then peak memory above the group's lowest; differences under the 1 MiB noise "
               "floor tie, so on MBPP (programs peak at 0.2-0.3 MB) it adds +0.1 to every passing program and "
               "reorders nothing (memory_rank_frac logs how often it does)" if reward == "coder" else ""))


def train(args, pool, rank=0, world=1):
    """The loop: per step, phases 0-8 (set_up, grpo_step, log_evaluate_checkpoint); then the final adapter."""
    run, start = set_up(args, pool, rank, world)
    # disable=None: the bar (and the phase shown in it) only on a terminal; in a log file only the step lines.
    run.bar = tqdm(range(start, args.num_steps), initial=start, total=args.num_steps, desc=f"train {args.stage}",
                   dynamic_ncols=True, disable=None if run.lead else True)
    say(run, work_line(run, start))
    run.t_start, run.first_step = time.time(), start
    for step in run.bar:
        m = {"step": step + 1}
        if run.lead and run.bar.disable:
            run.log = evaluate.log_progress(lambda: f"step {step + 1}/{args.num_steps}: ")
        # ---- 0 eval before any update: the baseline Collaboration Gain and plan information
        if step == 0 and run.eval_set:
            show(run, f"held-out eval on {len(run.eval_set)} problems")
            start_eval = held_out_eval(run, 0)
            m.update({k + "_start": v for k, v in start_eval.items()})
            say(run, "step 0:" + eval_line(start_eval, eval_method(args)))
        grpo_step(run, step, m)
        log_evaluate_checkpoint(run, m)
    if run.lead:
        # The final adapter, where `--stage coder` and evaluate.py look for it.
        final = os.path.join(args.out, "final")
        tmp = final + ".tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        grpo.save_adapter(run.model, run.role, os.path.join(tmp, run.role), base_model_name_or_path=run.base_name)
        with open(os.path.join(tmp, "args.json"), "w") as f:
            json.dump(vars(args), f, indent=1)
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        print(informative_summary(args.out))
        print(f"done: adapter in {os.path.join(final, run.role)}, metrics in {os.path.join(args.out, 'metrics.jsonl')}")


def grpo_step(run, step, m):
    """Phases 1-6 of one step, filling the metrics dict m. Each rank takes its contiguous share of the step's
    problems (a pure function of (step, seed)); the metrics are those of the whole step."""
    args = run.args
    G = args.group_size
    mine = grpo.shard(batch_indices(step, len(run.train_set), args.problems_per_step, args.seed), run.rank, run.world)
    generators = [problem_generator(args.seed, step, i, run.device) for i in mine]
    samples, rewards_mine, step_all, times = rollout_and_score(run, [run.train_set[i] for i in mine], generators)
    offset = sum(step_all["rows_per_rank"][:run.rank])  # this rank's first row in the step
    B = len(step_all["rewards"])  # rows of the trained role in the whole step
    m["groups"] = B // G
    if B == 0:
        # A needs_public_failure stage whose batch has no failing problem: nothing to train on. our choice: skip
        # the step (logged, no update) rather than draw more problems, so that the problems of a step stay a
        # pure function of (step, seed) and a resumed run repeats exactly what the uninterrupted one did.
        # The LR schedule is not advanced either: it counts updates.
        m["no_group"], m["informative_groups"] = True, 0
        m["lr"] = run.optimizer.param_groups[0]["lr"]
        m.update(summed(grpo.gather(times)))
        return
    m.update(agents.plan_stats(step_all["plans"], step_all["cut"]))
    if STAGES[args.stage]["reward"] != "toy":
        m["pass_rate"] = float(np.mean(step_all["pass_rates"]))
        m["all_pass_frac"] = float(np.mean(step_all["passed"]))
    for term in {k for d in step_all["without"] for k in d}:  # how often each efficiency term reordered a group
        m[f"{term}_rank_frac"] = rewards.rank_changed(step_all["rewards"], [d[term] for d in step_all["without"]], G)
    if step_all["blind"]:
        m["blind_pass_rate"] = float(np.mean(step_all["blind"]))
    m["completion_len"] = float(np.mean(step_all["lens"]))

    # ---- 4 advantages of the step's groups (a group never spans ranks); this rank keeps its own rows
    adv, adv_stats = grpo.group_advantages(step_all["rewards"], G, std_floor=args.adv_std_floor)  # (B,)
    m.update(adv_stats)
    m["informative_groups"] = round((1 - adv_stats["zero_var_frac"]) * (B // G))  # groups with a reward gradient
    adv = adv[offset:offset + len(rewards_mine)].to(run.device)  # (b,) this rank's rows
    learn(run, samples, adv, B, m, times)
    m.update(summed(grpo.gather(times)))  # each phase's time summed over ranks


def informative_summary(run_dir):
    """One line over a run's metrics.jsonl (resumed parts included): informative groups / all groups, and per hour
    of step time, the learning-per-hour figure (a group whose rewards all tie gives no policy gradient)."""
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        rows = [m for m in (json.loads(line) for line in f if line.strip()) if "t_step" in m]
    groups, informative = sum(m["groups"] for m in rows), sum(m["informative_groups"] for m in rows)
    hours = sum(m["t_step"] for m in rows) / 3600
    return (f"informative groups: {informative} of {groups} over {len(rows)} steps, "
            f"{informative / max(hours, 1e-9):.1f} per hour of step time")


def rollout_and_score(run, batch, generators):
    """Phases 1-3 on this rank's problems: sample, execute, reward. Returns (Samples or None, this rank's rewards,
    the step's per-sample data gathered from every rank in the step's problem order, this rank's times)."""
    args, stage = run.args, STAGES[run.args.stage]
    G, M = args.group_size, args.downstream_samples
    # ---- 1 sample
    t0 = time.time()
    samples, leaf_probs, leaves, group_probs = rollout(run, batch, generators, lambda text: show(run, text))
    times = {"t_sample": time.time() - t0}
    # ---- 2 execute (the toy stage has nothing to run)
    t0 = time.time()
    results = [None] * len(leaves)
    if stage["reward"] != "toy" and leaves:
        show(run, f"executing {len(leaves)} programs")
        jobs = [agents.problem_job(p, c.get("program", ""), p.hidden_tests, repeat=args.timing_repeats,
                                   stop_on_failure=args.stop_on_failure) for p, c in zip(leaf_probs, leaves)]
        results = run.team.pool.run(jobs)
    times["t_execute"] = time.time() - t0
    # ---- 3 reward, one group (G outputs of the trained role, each with M downstream leaves) per problem that
    # reached the trained role (all of the batch, except in needs_public_failure stages)
    outputs = leaves[::M]  # (G per group) the context right after each trained output: what the next role saw
    planner = stage["train"] == "planner" and samples
    for i, o in enumerate(outputs if planner else []):  # the gate's verdict on the plan exactly as the Coder saw it
        o["verdict"] = agents.plan_check(o["plan"], cut=o.get("plan_cut", False), problem=group_probs[i // G])
    if args.blind_weight and outputs:
        show(run, f"blind Coder: {len(outputs)} programs from the plans alone")
        t0 = time.time()
        blind = blind_pass_rates(run, [p for p in group_probs for _ in range(G)], [o["plan"] for o in outputs])
        for o, b in zip(outputs, blind):
            o["blind"] = b
        times["t_blind"] = seconds_since(t0, run.device)
    rewards_mine, without = [], []
    for i in range(len(group_probs)):
        r, w = REWARDS[stage["reward"]](results[i * G * M:(i + 1) * G * M], outputs[i * G:(i + 1) * G], G, M, args)
        rewards_mine += r
        without += [{term: v[g] for term, v in w.items()} for g in range(G)]
    mine = dict(rewards=rewards_mine, without=without, rows_per_rank=[len(rewards_mine)],
                blind=[o["blind"] for o in outputs] if args.blind_weight else [],
                plans=[o["plan"] for o in outputs] if planner else [],
                cut=[o.get("plan_cut", False) for o in outputs] if planner else [],
                lens=samples.completion_mask.sum(1).tolist() if samples else [],
                pass_rates=[r.pass_rate for r in results if r is not None],
                passed=[r.verdict == "passed" for r in results if r is not None])
    # The whole step's per-sample data (one list per rank, concatenated in rank order = problem order): the metrics
    # are those of the step, whatever the number of ranks.
    parts = grpo.gather(mine)
    return samples, rewards_mine, {k: [x for part in parts for x in part[k]] for k in mine}, times


def blind_pass_rates(run, problems, plans):
    """The blind Coder of --blind-weight: for each (problem, plan), the pass rate on the problem's hidden tests of the
    frozen Coder's greedy program written from the plan with the statement hidden (agents.blind_problem). A plan
    that says nothing leaves the Coder only the public examples, the same for every plan of the group, so the
    group's advantages come from what the plans say."""
    _, leaves, _ = agents.run_chain(run.team, (("coder", 1, 0.0),), [agents.blind_problem(p) for p in problems],
                                    [{"plan": plan} for plan in plans])
    results = run.team.pool.run([agents.problem_job(p, c["program"], p.hidden_tests,
                                                    stop_on_failure=run.args.stop_on_failure)
                                 for p, c in zip(problems, leaves)])
    return [r.pass_rate for r in results]


def micro_batches(samples, size):
    """This rank's completions as the objective wants them (prompt left-padded + completion right-padded), cut into
    micro-batches of `size` sequences, each trimmed of the columns none of its sequences uses. Returns [(slice,
    input_ids, attention_mask, completion_mask, completion_start)]."""
    if not samples:
        return []
    input_ids = torch.cat([samples.prompt_ids, samples.completion_ids], 1)  # (b, P+T)
    attn = torch.cat([samples.prompt_mask, samples.completion_mask], 1)  # (b, P+T)
    cmask = samples.completion_mask  # (b, T), includes EOS
    P, b = samples.prompt_ids.shape[1], input_ids.shape[0]
    out = []
    for a in range(0, b, size):
        sl = slice(a, min(b, a + size))
        left = int(samples.prompt_mask[sl].sum(1).max())  # longest prompt in the micro-batch
        right = max(1, int(cmask[sl].sum(1).max()))  # longest completion
        cols = slice(P - left, P + right)
        out.append((sl, input_ids[sl][:, cols], attn[sl][:, cols], cmask[sl][:, :right], left))  # (mb, left+right)
    return out


def logprobs(run, ids, am, left):
    """Token log-probs of the completions at the sampling temperature (policy, old and reference alike): the tokens
    were drawn from softmax(logits / T), so that is the distribution whose log-probs the gradient needs."""
    return grpo.token_logprobs(run.model, ids, am, left, chunk=run.args.logprob_chunk,
                               temperature=run.args.temperature)  # (mb, T)


def learn(run, samples, adv, B, m, times):
    """Phases 5-6 on this rank's rows: reference log-probs, then the GRPO loss over micro-batches, each scaled by its
    rows over the step's B, so the gradients summed over micro-batches and over ranks are those of the mean over all
    B completions; clip, one optimizer step. A rank without rows adds zero gradients; a non-finite loss or gradient
    drops the step's update (logged). One optimisation pass per batch (DeepSeekMath's mu = 1, TRL's default): the
    old log-probs are the policy's own, detached, so the ratio is exactly 1 and the clip is inert; the loss keeps
    both, and a second pass would be one loop around phase 6 with the old log-probs taken before it."""
    args = run.args
    mbs = micro_batches(samples, args.micro_batch)
    # ---- 5 reference log-probs, no grad: adapters off = the frozen base = the reference policy (none when beta = 0)
    show(run, "reference log-probs")
    t0 = time.time()
    run.model.eval()
    with torch.no_grad(), grpo.adapters_off(run.model):
        ref_lp = [logprobs(run, ids, am, left) if args.beta != 0 else None for _, ids, am, _, left in mbs]
    times["t_reference"] = seconds_since(t0, run.device)
    # ---- 6 learn, forward AND backward under the trained role's adapter
    show(run, f"learning: {len(mbs)} micro-batches")
    t0 = time.time()
    run.model.train()
    run.optimizer.zero_grad(set_to_none=True)
    stats, skipped = {}, False
    with agents.acting(run.team, run.role):
        for (sl, ids, am, cm, left), ref in zip(mbs, ref_lp):
            lp = logprobs(run, ids, am, left)  # (mb, T)
            loss, st = grpo.grpo_loss(lp, lp.detach(), ref, adv[sl], cm, beta=args.beta, clip_eps=args.clip_eps)
            if not torch.isfinite(loss):
                skipped = True
                break
            (loss * (lp.shape[0] / B)).backward()
            for k, v in st.items():
                stats[k] = stats.get(k, 0.0) + v * lp.shape[0] / B
    grad_norm = None if sum_gradients(run, skipped) else torch.nn.utils.clip_grad_norm_(run.params, args.grad_clip)
    if grad_norm is None or not torch.isfinite(grad_norm):
        run.optimizer.zero_grad(set_to_none=True)
        m["skipped"] = True
        say(run, f"warning: step {m['step']}: non-finite loss or gradient, update skipped", file=sys.stderr)
    else:
        run.optimizer.step()
        run.scheduler.step()  # the schedule counts optimizer updates: a skipped step does not advance it
        m["grad_norm"] = float(grad_norm)
    run.model.eval()
    m.update(summed(grpo.gather(stats)))
    m["lr"] = run.optimizer.param_groups[0]["lr"]
    times["t_learn"] = seconds_since(t0, run.device)


def seconds_since(t0, device):
    """Wall seconds since t0, once the device has run what was queued: CUDA kernels run asynchronously, so without
    the sync a phase's GPU work would be billed to the next phase (t_reference's to t_learn)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.time() - t0


def sum_gradients(run, skipped):
    """Under torchrun: every rank takes the same skip decision, and the adapter's gradients are summed over ranks
    (a rank without rows adds zeros), in ONE collective. Returns whether the update is skipped."""
    if run.world == 1:
        return skipped
    for p in run.params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    # The flag rides in the gradients' buffer, on the run's device: nccl has no CPU backend, so a CPU flag would
    # raise at the first update. A skipping rank's gradients may be NaN: every rank then drops the step anyway.
    flag = torch.tensor([float(skipped)], device=run.device)  # (1,)
    grpo.all_reduce_sum_([flag] + [p.grad for p in run.params])
    return bool(flag.item())


def eval_line(m, helper):
    """The held-out evaluation in words, one format for step 0 and later steps: pass@1 of the helper method and of
    direct coding, CG, plan information against the strongest control with its paired counts, and the paired
    comparison with step 0."""
    line = f" eval {helper} {m[eval_key(helper)]:.3f}"
    if "eval_cg" in m:
        line += f" direct {m['eval_pass1_direct']:.3f} CG {m['eval_cg']:+.3f}"
    if "eval_plan_info" in m:
        line += (f" plan info {m['eval_plan_info']:+.3f} vs {m['eval_info_vs']} (+{m['eval_info_gained']} "
                 f"-{m['eval_info_lost']} p={m['eval_info_p']:.3g})")
    if "eval_mcnemar_p" in m:
        line += f" vs step 0: +{m['eval_gained']} -{m['eval_lost']} p={m['eval_mcnemar_p']:.3g}"
    return line


def log_evaluate_checkpoint(run, m):
    """Phases 7-8 of a step (also of a step skipped for want of a group): held-out eval when due (every rank takes
    its share), then on rank 0 one metrics line, one progress line, and the checkpoint when due."""
    args, done = run.args, m["step"]
    last = done == args.num_steps
    if run.eval_set and (done % args.eval_every == 0 or last):
        show(run, f"held-out eval on {len(run.eval_set)} problems")
        m.update(held_out_eval(run, done))
    # What a step buys per hour of its own time (held-out eval excluded; seconds summed over ranks).
    m["t_step"] = sum(m.get(k, 0.0) for k in ("t_sample", "t_execute", "t_blind", "t_reference", "t_learn"))
    m["informative_per_hour"] = 3600 * m["informative_groups"] / max(m["t_step"], 1e-9)
    if not run.lead:
        return
    with open(os.path.join(args.out, "metrics.jsonl"), "a") as f:
        f.write(json.dumps(m) + "\n")
    helper = eval_method(args)
    evaluated = " |" + eval_line(m, helper) if eval_key(helper) in m else ""
    if m.get("no_group"):
        say(run, f"step {done}: no problem of the batch failed its public tests: nothing to train on, step skipped"
                 + evaluated)
    else:
        run.bar.set_postfix(reward=f"{m['reward_mean']:.3f}", kl=f"{m.get('kl', 0):.4f}",
                            zv=f"{m['zero_var_frac']:.2f}", len=f"{m['completion_len']:.0f}")
        say(run, f"step {done}: reward {m['reward_mean']:.3f} pass {m.get('pass_rate', float('nan')):.3f} "
                 f"zero-var {m['zero_var_frac']:.2f} kl {m.get('kl', 0):.4f} clip {m.get('clip_frac', 0):.3f} "
                 f"len {m['completion_len']:.0f} gnorm {m.get('grad_norm', float('nan')):.3f} "
                 f"| sample {m['t_sample']:.1f}s execute {m['t_execute']:.1f}s learn {m['t_learn']:.1f}s" + evaluated
                 + time_left(run, done))
    # Every completed step's checkpoint, so that a stop loses at most the step in flight (a skipped step's update was
    # dropped: its weights are clean). save_checkpoint keeps the --save-every ones and the newest.
    save_checkpoint(run, done)


def time_left(run, done):
    """` | 3m/step, ~9h50m left`: this process's pace so far (held-out evals included) over the steps still to do."""
    pace = (time.time() - run.t_start) / max(1, done - run.first_step)
    return f" | {evaluate.duration(pace)}/step, ~{evaluate.duration(pace * (run.args.num_steps - done))} left"


if __name__ == "__main__":
    main()
