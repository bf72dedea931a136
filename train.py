"""train.py: CoRe-Code's collaborative GRPO, one stage at a time, as a plain script.

What it is: `python train.py --stage planner` trains the Planner's LoRA adapter with GRPO while the Coder is frozen;
`--stage coder` then trains the Coder's adapter under the trained, frozen Planner. The same recipe trains MapCoder's
Retrieval agent (`--stage retriever`) and Debugging agent (`--stage debugger`, on problems whose Coder program fails
a public test). Every agent is a named LoRA adapter on ONE base model in memory; the KL reference is that base with
every adapter off (grpo.adapters_off), so no second copy exists. With --planner-model the Planner is an adapter on a
second base of its own (e.g. a larger Planner for a smaller Coder), which is then the trained Planner's reference.
Rewards come only from running programs in the sandbox (sandbox.py) and scoring the results (rewards.py). The
stages differ only by an entry of the STAGES table.

One step, read top to bottom from `train()` (grpo_step -> rollout_and_score + learn, log_evaluate_checkpoint):
    1 sample     frozen roles before the trained one write once per problem, the trained role samples a group of G,
                 the frozen roles after it write M outputs for each (rollout)
    2 execute    every program runs on its problem's hidden tests in the sandbox pool
    3 reward     the stage's reward function scores the trained role's G outputs (rewards.py)
    4 advantages group-normalised (grpo.group_advantages)
    5 reference  log-probs of the sampled tokens with all adapters off (skipped when beta == 0)
    6 learn      GRPO loss, backward in micro-batches, gradient clipping, optimizer + scheduler step
    7 log        a line per step on the progress bar, a JSON line in metrics.jsonl
    8 eval/ckpt  held-out pass@1 of planner-coder and direct coding (so Collaboration Gain is tracked), atomic
                 checkpoints (adapter + optimizer + scheduler + RNG + step), the last K kept

Each problem of a step samples from its own generator, seeded by (seed, step, problem index), so a resumed run
repeats exactly what it would have done, on any number of ranks. Under `torchrun --nproc_per_node N` each rank
takes a contiguous share of the step's problems and the adapter's gradients are summed over ranks, so the update is
the single-process one (README, "Many GPUs"); rank 0 alone writes.

What it is not: a trainer framework (no Trainer class, callbacks or config system), or a vLLM rollout engine: our
KV-cache sampler (agents.sample) is exact and shares a prefill per group, but has no paged attention.

References: DeepSeekMath (GRPO, arXiv:2402.03300); CoRe-Code as summarised in ../shared/DESIGN.md; nanoGPT /
nanochat for the script style.
"""
import argparse
import copy
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

# -----------------------------------------------------------------------------------------------------------------
# The stages. `chain`: the order in which the roles run on a problem; `train`: the role whose outputs form the GRPO
# group (its adapter is the only thing updated); `reward`: the function in REWARDS that scores them. Roles before the
# trained one run once per problem, the first role after it M (--downstream-samples) times per output, later ones
# once per context. Optional: `needs_public_failure` keeps only problems whose upstream program (ctx["program"])
# fails a PUBLIC test, with its feedback in ctx["feedback"] (hidden tests never reach a prompt); `eval_method` is
# the held-out method compared with direct coding (default planner-coder); `format_gate` penalises thoughts whose
# format is broken or that say nothing (agents.plan_check, rewards.format_gated). MapCoder's Retrieval agent is scored
# like a thought (by the programs the frozen Planner -> Coder write from its recollection), its Debugging agent like a
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


def reward_planner(results, outputs, G, M, args):
    """Planner stage: a thought is scored by the pass rate and CPU time of the M programs the frozen Coder wrote;
    with the stage's format gate on, agents.plan_check of the plan the Coder saw (outputs[g]["verdict"], set by
    rollout_and_score) decides: a malformed or content-free thought gets -format_penalty, one cut at the token budget
    loses --cut-penalty."""
    pr = [[r.pass_rate for r in results[g * M:(g + 1) * M]] for g in range(G)]
    cpu = [[r.cpu_s for r in results[g * M:(g + 1) * M]] for g in range(G)]
    out = rewards.planner_rewards(pr, cpu)
    if args.blind_weight:  # what the plan alone lets the Coder write (blind_pass_rates), before the gate
        out = [r + args.blind_weight * o["blind"] for r, o in zip(out, outputs)]
    if STAGES[args.stage].get("format_gate") and args.format_gate:
        out = rewards.format_gated(out, [o["verdict"] for o in outputs], penalty=args.format_penalty,
                                   cut_penalty=args.cut_penalty)
    return out


def reward_coder(results, outputs, G, M, args):
    """Coder stage: a program is scored by its pass rate plus, when it passes everything, its space efficiency."""
    if M != 1:
        raise ValueError("the coder reward scores the trained role's own programs: use --downstream-samples 1")
    return rewards.coder_rewards([r.pass_rate for r in results], [r.peak_bytes for r in results])


def reward_toy(results, outputs, G, M, args):
    """Toy stage: the fraction of characters of the raw completion that are `--toy-target` (a string test)."""
    return rewards.toy_rewards([o["raw"] for o in outputs], target=args.toy_target)


REWARDS = {"planner": reward_planner, "coder": reward_coder, "toy": reward_toy}


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """--help shows each default once: argparse's "(default: X)" only where the help text does not explain it."""

    def _get_help_string(self, action):
        return action.help if "default" in (action.help or "") else super()._get_help_string(action)


def get_args(argv=None):
    p = evaluate.OneLineParser(
        description="Collaborative GRPO for code generation (CoRe-Code): train the Planner (--stage planner), then "
                    "the Coder (--stage coder); or MapCoder's Retrieval agent (--stage retriever) or Debugging agent "
                    "(--stage debugger) with the other agents frozen. Each agent is a named LoRA adapter on one "
                    "shared base model.",
        formatter_class=HelpFormatter)
    # model
    p.add_argument("--stage", choices=sorted(STAGES),
                   help="which agent to train: planner, coder (after planner), direct (single-agent GRPO baseline: "
                        "the Coder alone), retriever / debugger (MapCoder's agents), toy (a sanity check)")
    p.add_argument("--plot", metavar="RUN_DIR", default=None,
                   help="only redraw RUN_DIR/curves.png from RUN_DIR/metrics.jsonl (needs matplotlib) and exit")
    p.add_argument("--model", default=os.environ.get("CORECODE_MODEL") or agents.DEFAULT_MODEL,
                   help=f"local HF model dir or hub id (default: $CORECODE_MODEL, else {agents.DEFAULT_MODEL}, "
                        "downloaded by transformers on first use)")
    p.add_argument("--planner-model", default=None, metavar="DIR",
                   help="a second base model that plays the Planner (HF dir or hub id, sharing --model's tokenizer), "
                        "e.g. Qwen2.5-Coder-1.5B-Instruct for a 0.5B Coder: its LoRA adapter is the one trained in "
                        "stage planner (KL to this base) and frozen in stage coder. Default: --model plays every role")
    p.add_argument("--device", default=None, help="cuda / cpu / cuda:1 ... (default: cuda when available)")
    p.add_argument("--dtype", default="auto", choices=["auto", *agents.DTYPES],
                   help="weights dtype (default: auto = bf16 on CUDA and on CPUs with native bf16, else fp32)")
    p.add_argument("--adapter", action="append", default=[], metavar="ROLE=DIR",
                   help="a PEFT-format adapter dir for one role (planner, coder, retriever, debugger), repeatable. "
                        "The trained role starts from it (default: a fresh adapter); a frozen role uses it (default: "
                        "the bare base model; stage coder's Planner defaults to runs/planner/final/planner, "
                        "planner=none for the base)")
    # data
    p.add_argument("--bench", default="mbpp", help="training benchmark (a loader in data.py)")
    p.add_argument("--data", default=None, help="dataset path (default: $CORECODE_<BENCH>, else data.py's default "
                                                 "location; see README, Data)")
    p.add_argument("--bench-option", action="append", default=[], metavar="KEY=VALUE",
                   help="a benchmark loader option for both splits, repeatable, as in evaluate.py: time_factor=2, "
                        "time_limit_s=S, release=YYYY-MM-DD (livebench), ... (an unknown key lists them)")
    p.add_argument("--split", default="train", help="training split")
    p.add_argument("--allow-held-out-split", action="store_true",
                   help="allow training on a held-out split (test, validation or the --eval-split): refused by "
                        "default, because configurations are chosen on validation and claims are read on test")
    p.add_argument("--limit", type=int, default=None, help="use only the first N training problems")
    p.add_argument("--eval-split", default="validation", help="held-out split for periodic evaluation")
    p.add_argument("--eval-limit", type=int, default=20, help="held-out problems evaluated (greedy, pass@1)")
    p.add_argument("--eval-batch-size", type=int, default=16,
                   help="held-out problems generated together. our choice 16: all 90 MBPP validation problems in one "
                        "batch ran a 2-core CPU box out of its 24 GB during prefill (0.5B, bf16)")
    grpo_flags(p)
    optimisation_flags(p)
    args = p.parse_args(argv)
    args.out = args.out or os.path.join("runs", args.stage or "")
    return args


def grpo_flags(p):
    """The flags of the rollout, the rewards and the GRPO objective."""
    p.add_argument("--num-steps", "--max-steps", dest="num_steps", type=int, default=200, help="optimizer steps")
    p.add_argument("--problems-per-step", type=int, default=4,
                   help="problems (groups) per step; stage debugger keeps only those whose Coder program fails a "
                        "public test (a step with none is skipped and logged as no_group)")
    p.add_argument("--group-size", type=int, default=8, help="G: samples of the trained role per problem")
    p.add_argument("--downstream-samples", type=int, default=1,
                   help="M: outputs of each frozen downstream role per sample (stage planner: programs per thought)")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature of the trained role")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling of the trained role (1 = off)")
    p.add_argument("--upstream-temperature", type=float, default=0.0,
                   help="temperature of frozen roles before the trained one; our choice 0 (greedy): the group then "
                        "shares one context, so rewards differ only by the trained role's samples")
    p.add_argument("--downstream-temperature", type=float, default=0.0,
                   help="temperature of frozen roles after the trained one; our choice 0 (greedy) with M=1, so a "
                        "thought's reward is not blurred by the Coder's sampling noise (use >0 with M>1)")
    p.add_argument("--max-new-tokens", type=int, default=512, help="token budget of code-writing roles")
    p.add_argument("--plan-max-new-tokens", type=int, default=256, help="token budget of the Planner")
    p.add_argument("--planner-prompt", choices=sorted(agents.PLANNER_TEMPLATES), default="skeleton",
                   help="the Planner's prompt, in training and in its held-out eval: skeleton (the four parts as a "
                        "template to fill in; evaluate.py's planner-coder) or plain (the parts by name, no template "
                        "to copy; evaluate.py's planner-coder-plain). our choice of default: skeleton, what the runs "
                        "in README used; the untrained plain prompt needs ~256 plan tokens (default: skeleton)")
    p.add_argument("--beta", type=float, default=0.04, help="KL coefficient (DeepSeekMath: 0.04)")
    p.add_argument("--clip-eps", type=float, default=0.2, help="PPO clip range")
    p.add_argument("--ppo-epochs", type=int, default=1,
                   help="optimisation passes over each batch; with 1 the ratio is exactly 1 and clipping is inert")
    p.add_argument("--format-gate", action=argparse.BooleanOptionalAction, default=True,
                   help="stage planner: a thought that is malformed, copies format placeholders or is content-free "
                        "(agents.plan_check) gets -(--format-penalty) whatever its code scored. our choice: on, "
                        "because the reward alone pays for empty plans that let the Coder code directly (plan "
                        "collapse, seen in a pilot)")
    p.add_argument("--format-penalty", type=float, default=0.5,
                   help="the reward of a thought that fails the format gate (as -penalty): malformed, copied "
                        "placeholders or content-free (agents.plan_check); see rewards.format_gated")
    p.add_argument("--cut-penalty", type=float, default=0.1,
                   help="deducted from the reward of a thought that ran into --plan-max-new-tokens but is well formed "
                        "as far as it went: it is scored by its code, not failed as malformed (rewards.format_gated)")
    p.add_argument("--blind-weight", type=float, default=0.0,
                   help="stage planner, MBPP-like benchmarks (no starter code): add this times the pass rate of a "
                        "program the frozen Coder writes greedily from the plan with the statement hidden "
                        "(agents.blind_problem: the plan and the public examples only). A plan that says nothing "
                        "earns only what the examples give, its group's baseline. our choice: 0 (off: on 24 "
                        "validation problems it told untrained plans from a generic one by one problem, README); one "
                        "more greedy Coder call per plan")
    p.add_argument("--adv-std-floor", type=float, default=0.1,
                   help="groups' rewards are divided by max(std, this) (grpo.group_advantages). our choice 0.1, the "
                        "largest efficiency bonus: a group whose programs all pass and differ by a millisecond gets "
                        "small advantages, not +-1; groups whose pass rates differ (std >= ~0.3) are unaffected. "
                        "0 = plain GRPO")
    p.add_argument("--measure-repeats", type=int, default=3,
                   help="runs of each all-passing program (CPU time = min, peak memory = median): the efficiency "
                        "bonuses compare programs, so one noisy run must not decide; rewards.py adds a noise floor")
    p.add_argument("--stop-on-failure", action="store_true",
                   help="functional / stdio tests: stop each program at its first failing test (much less CPU on "
                        "contest problems); the rewards' pass rate then counts the tests passed before it. Default: "
                        "all tests run")
    p.add_argument("--toy-target", default="a", help="stage toy only: the character that is rewarded")
    p.add_argument("--mapcoder-k", type=int, default=agents.MAPCODER_K,
                   help="stages retriever / debugger: exemplars recalled in the held-out mapcoder evaluation (the "
                        "training rollout's Retriever is asked for agents.MAPCODER_K)")
    p.add_argument("--mapcoder-t", type=int, default=agents.MAPCODER_T,
                   help="stages retriever / debugger: debugging rounds per plan in the held-out mapcoder evaluation")


def optimisation_flags(p):
    """The flags of the optimizer, LoRA and the run directory."""
    p.add_argument("--lr", type=float, default=1e-5, help="AdamW learning rate of the LoRA parameters")
    p.add_argument("--weight-decay", type=float, default=0.0, help="AdamW weight decay")
    p.add_argument("--warmup-steps", type=int, default=10, help="linear warm-up steps, then constant")
    p.add_argument("--grad-clip", type=float, default=1.0, help="max global grad norm")
    p.add_argument("--micro-batch", type=int, default=8, help="completions per forward/backward")
    p.add_argument("--logprob-chunk", type=int, default=256,
                   help="completion tokens per output-layer chunk (memory: one chunk x vocab float32 buffer)")
    p.add_argument("--grad-ckpt", action=argparse.BooleanOptionalAction, default=None,
                   help="gradient checkpointing of the decoder layers (default: on for CUDA, and on a CPU for a "
                        "trained base of >= 1B parameters, else off; see grad_ckpt_on)")
    # LoRA
    p.add_argument("--lora-r", type=int, default=16, help="LoRA rank")
    p.add_argument("--lora-alpha", type=float, default=32, help="LoRA alpha (scaling = alpha / r)")
    p.add_argument("--lora-dropout", type=float, default=0.0,
                   help="our choice 0: dropout would make training-time log-probs differ from sampling-time ones")
    p.add_argument("--lora-targets", default=",".join(grpo.DEFAULT_TARGETS), help="comma-separated module names")
    # run
    p.add_argument("--out", default=None, help="run directory (default: runs/<stage>)")
    p.add_argument("--seed", type=int, default=0, help="seed of data order, sampling and init")
    p.add_argument("--eval-every", type=int, default=25, help="held-out eval every N steps (and at 0 and the end); "
                                                               "0 = never")
    p.add_argument("--save-every", type=int, default=25, help="checkpoint every N steps (and at the end)")
    p.add_argument("--keep-last", type=int, default=3, help="checkpoints kept")
    p.add_argument("--resume", action="store_true", help="continue from the last checkpoint in --out")
    p.add_argument("--workers", type=int, default=None, help="sandbox worker processes (default: CPU count)")


def fail(msg):
    """Bad input: one clear line on stderr and exit 2, never a traceback (under torchrun it names the rank)."""
    rank = f"rank {os.environ['RANK']}: " if int(os.environ.get("WORLD_SIZE", "1")) > 1 else ""
    print(f"error: {rank}{msg}", file=sys.stderr)
    sys.exit(2)


# The smallest plan budget that lets the format gate judge plans by their code: the untrained 0.5B's plans on 48
# validation problems reach Input/Output and a first step within 32 tokens in 34 of 48 (the gate's "cut" case), at 128
# tokens 27 end on their own (median length ~110 tokens).
MIN_PLAN_TOKENS = 32


def no_signal_hint(m, args):
    """One line for a step in which no group had reward variance (no gradient), naming the likely cause."""
    why = "every group's rewards were equal"
    if m.get("plan_ok_frac") == 0:
        why = "every thought failed the format gate"
        if m.get("plan_cut_frac", 0) >= 0.9:
            why += (f" and ran into --plan-max-new-tokens {args.plan_max_new_tokens} (raise it: the untrained 0.5B's "
                    "plans run ~110 tokens)")
    elif "pass_rate" in m:
        why += (f" (pass rate {m['pass_rate']:.2f} for every program: problems too hard or too easy at "
                f"--max-new-tokens {args.max_new_tokens}; more --problems-per-step or --group-size give more chances)")
    return f"warning: step {m['step']}: no reward variance in any group, so no gradient: {why}"


def check_args(args):
    if not args.stage:
        fail("--stage is required (planner, coder, direct, retriever, debugger or toy); see --help")
    for name in ("num_steps", "problems_per_step", "group_size", "downstream_samples", "micro_batch", "ppo_epochs",
                 "max_new_tokens", "plan_max_new_tokens", "lora_r", "keep_last", "mapcoder_k", "logprob_chunk",
                 "measure_repeats", "eval_batch_size"):
        if getattr(args, name) < 1:
            fail(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.group_size < 2:
        print("warning: --group-size 1 gives every sample zero advantage (nothing to learn from)", file=sys.stderr)
    gated = STAGES.get(args.stage, {}).get("format_gate") and args.format_gate
    if gated and args.plan_max_new_tokens < MIN_PLAN_TOKENS:
        print(f"warning: --plan-max-new-tokens {args.plan_max_new_tokens}: a plan this short stops before its Steps, "
              f"fails the format gate (-{args.format_penalty:g}) whatever its code does, so groups get no reward "
              f"variance and nothing is learned; use >= {MIN_PLAN_TOKENS} (README's runs use 128)", file=sys.stderr)
    if args.downstream_samples > 1 and args.downstream_temperature == 0:
        fail("--downstream-samples > 1 with --downstream-temperature 0 would repeat one greedy output; "
             "set --downstream-temperature > 0")
    if args.format_penalty < 0:
        fail(f"--format-penalty must be >= 0, got {args.format_penalty}")
    if args.mapcoder_t < 0:
        fail(f"--mapcoder-t must be >= 0, got {args.mapcoder_t}")
    if args.temperature <= 0:
        fail("--temperature must be > 0: GRPO needs different samples within a group")
    if args.top_p < 1:
        fail("--top-p < 1 is not supported in training: the loss's log-probs are those of the full "
             "softmax(logits / T), not of the truncated distribution the tokens would be drawn from")
    if min(args.adv_std_floor, args.cut_penalty, args.blind_weight) < 0:
        fail("--adv-std-floor, --cut-penalty and --blind-weight must be >= 0")
    if args.blind_weight and args.stage != "planner":
        fail("--blind-weight scores Planner thoughts: it needs --stage planner")
    if args.planner_model and "planner" not in STAGES[args.stage]["chain"]:
        fail(f"--planner-model: stage {args.stage} has no Planner (stages with one: "
             f"{', '.join(s for s, d in STAGES.items() if 'planner' in d['chain'])})")
    if args.split in ("test", "validation", args.eval_split) and args.stage != "toy" and not args.allow_held_out_split:
        why = ("is also the --eval-split, so the held-out evaluation would measure training problems"
               if args.split == args.eval_split else
               "is held out (configurations are chosen on validation, claims read on test)")
        fail(f"--split {args.split} {why}: train on another split, or pass --allow-held-out-split to train on it "
             "anyway")
    # Adapters and benchmark options are checked before anything slow happens (bad input loses nothing).
    try:
        args.adapters = evaluate.parse_adapters(args.adapter)
        args.bench_kwargs = data.parse_bench_options(args.bench, args.bench_option)
    except (evaluate.UsageError, ValueError) as e:
        fail(str(e))
    if args.stage == "coder" and "planner" not in args.adapters:
        args.adapters["planner"] = os.path.join("runs", "planner", "final", "planner")
        if not os.path.isdir(args.adapters["planner"]):
            fail(f"stage coder needs the trained Planner: no adapter at {args.adapters['planner']}; run --stage "
                 "planner first, or pass --adapter planner=DIR (or --adapter planner=none for the base Planner)")


# Rough wall time of a run, printed before it starts. Measured on a 2-core CPU with native bf16 (avx512_bf16), the
# 0.5B model in bf16 (README "What training does"): Planner steps of 2 problems x G=8 took 72 s and of 4 x 8 133 s
# with plans <= 128 and programs <= 256 tokens: ~11 s a step plus ~3.8 s per sampled row at 384 tokens of budget
# (sampling and learning both grow with rows x tokens). Held-out problems: evaluate.CPU_SECONDS_PER_PROBLEM.
STEP_FIXED_S, ROW_S, ROW_BUDGET = 11.0, 3.8, 384


def eval_method(args):
    """The method the held-out eval measures the trained role with: the stage's, with the Planner's own prompt."""
    method = STAGES[args.stage].get("eval_method") or "planner-coder"
    return "planner-coder-plain" if method == "planner-coder" and args.planner_prompt == "plain" else method


def time_estimate(args, n_eval, on_cpu, fp32):
    """One line: roughly how long this run takes on a 2-core CPU. On a GPU, sampling is bound by kernel launches, not
    by the chip: one H200 check's decode rate (README, "What holds on CUDA") suggests ~45-60 s a recipe step, ~1/3 of
    the CPU's."""
    chain = STAGES[args.stage]["chain"]
    budget = sum(args.plan_max_new_tokens if agents.ROLES[r]["budget"] == "plan" else args.max_new_tokens
                 for r in chain)
    budget += args.max_new_tokens if args.blind_weight else 0  # the blind Coder writes one more program a row
    step_s = STEP_FIXED_S + ROW_S * args.problems_per_step * args.group_size * budget / ROW_BUDGET
    helper = eval_method(args)
    per = evaluate.CPU_SECONDS_PER_PROBLEM  # at evaluate.py's default budgets, 256 + 512 tokens
    control = helper in evaluate.PLAN_INFO_BASELINE
    first = per.get(helper, 5.0) + per["direct"] + (per["content-free-plan"] if control else 0)
    later = per.get(helper, 5.0) + (per["direct"] if STAGES[args.stage]["train"] == "coder" else 0)
    evals = 0 if args.eval_every <= 0 else 1 + -(-args.num_steps // args.eval_every)
    # Held-out outputs mostly end before the budget: halving both budgets cut an evaluation by ~30%, not 50%.
    scale = ((args.plan_max_new_tokens + args.max_new_tokens) / 768) ** 0.5
    eval_s = n_eval * scale * (first + later * max(0, evals - 1))
    factor = evaluate.FP32_CPU_FACTOR if fp32 else 1.0
    s = (step_s * args.num_steps + eval_s) * factor
    where = "fp32 without native bf16" if fp32 else "bf16"
    text = (f"estimate: ~{evaluate.duration(s)} (the 0.5B model on a 2-core CPU, {where}): {args.num_steps} steps of "
            f"~{step_s * factor:.0f} s + {evals} held-out evaluations of {n_eval} problems")
    text += " (a larger --planner-model takes longer: not in this figure)" if args.planner_model else ""
    return text + ("" if on_cpu else " (the CPU figure: an H200's decode rate suggests about a third of it, "
                                      "decoding being bound by kernel launches; README, What holds on CUDA)")


# -----------------------------------------------------------------------------------------------------------------
# Rollout: run the stage's chain of roles, expanding rows at the trained role (x G) and after it (x M).


def public_failures(probs, ctxs, pool):
    """Keep the problems whose upstream program (ctx["program"]) fails a PUBLIC test; put the failing case's
    description into ctx["feedback"]. Returns (problems, contexts) of the kept ones, in order.

    agents.check_public builds the job from problem.public_tests only, so the Debugger can never see a hidden test;
    a problem without public tests counts as passing (nothing to repair from) and is dropped."""
    verdicts = agents.check_public(probs, [c.get("program", "") for c in ctxs], pool)
    kept = [(p, dict(c, feedback=fb)) for p, c, (ok, fb) in zip(probs, ctxs, verdicts) if not ok]
    return [p for p, _ in kept], [c for _, c in kept]


def rollout(stage, tokenizer, problems, args, generators, agent, pool=None, show=lambda text: None):
    """Returns (Samples of the trained role, one row per (group, g)), the leaves: a (problem, context) per
    (group, g, m), in that order, and the groups' problems. A context dict holds each role's parsed output ("plan",
    "program", ...). A stage with needs_public_failure keeps only the problems whose upstream program fails a public
    test (`pool` runs them), so there may be fewer groups than problems; with none left it returns (None, [], [], []).
    generators: one torch.Generator per problem; every row descending from a problem draws from it. agent(role): the
    context in which a role acts, yielding its model (evaluate.make_agent).
    show(text) reports progress (role, rows, tokens so far) to the caller's progress bar."""
    stage_def = STAGES[stage]
    # A context carries its problem's generator ("_gen") and the Planner prompt's name; a group's rows share them.
    probs, ctxs = list(problems), [{"_gen": g, "_planner_template": args.planner_prompt} for g in generators]
    trained = None
    downstream = 0  # roles run so far after the trained one
    for role in stage_def["chain"]:
        role_def = agents.ROLES[role]
        if role == stage_def["train"] and stage_def.get("needs_public_failure"):
            probs, ctxs = public_failures(probs, ctxs, pool)
            if not probs:
                return None, [], [], []
        if role == stage_def["train"]:
            group_probs = list(probs)  # one GRPO group per problem that reaches the trained role
            k, temperature = args.group_size, args.temperature
        elif trained is None:
            k, temperature = 1, args.upstream_temperature
        else:
            # The M samples are drawn at the first role after the trained one; later roles write one output per
            # context, so every trained output has exactly M leaves (retriever -> planner (M) -> coder (1)).
            k, temperature = (args.downstream_samples if downstream == 0 else 1), args.downstream_temperature
            downstream += 1
        prompts = [role_def["prompt"](tokenizer, p, c) for p, c in zip(probs, ctxs)]
        budget = args.plan_max_new_tokens if role_def["budget"] == "plan" else args.max_new_tokens
        what = f"sampling {role}: {len(prompts) * k} x <= {budget} tokens"
        show(what)
        with agent(role) as m:
            s = agents.sample(m, tokenizer, prompts, group_size=k, max_new_tokens=budget, temperature=temperature,
                              top_p=args.top_p if role == stage_def["train"] else 1.0, stop=role_def["stop"],
                              generator=[c["_gen"] for c in ctxs], progress=lambda t, n: show(f"{what} ({t}/{n})"))
        probs = [p for p in probs for _ in range(k)]
        ctxs = [dict(c) for c in ctxs for _ in range(k)]
        for c, p, text, cut in zip(ctxs, probs, s.texts, s.cut):
            c.update(role_def["parse"](text, p))
            c["raw"], c[role + "_cut"] = text, cut
        if role == stage_def["train"]:
            trained = s
    return trained, probs, ctxs, group_probs


# -----------------------------------------------------------------------------------------------------------------
# Held-out evaluation: greedy pass@1 of the stage's helper method (planner-coder, or mapcoder for MapCoder's agents)
# and of direct coding, and their difference (CG).


def eval_key(method):
    """The metrics key of a method's held-out pass@1: eval_pass1_planner_coder, eval_pass1_mapcoder, ..."""
    return "eval_pass1_" + method.replace("-", "_")


def efficiency_only_frac(reward_list, keys, G):
    """The fraction of groups whose advantages come from the efficiency bonus alone: rewards not all equal, while
    everything else a reward looks at (pass rate, format: `keys`, one per trained output) is equal in the group."""
    n = len(reward_list) // G
    hits = [len(set(reward_list[i * G:(i + 1) * G])) > 1 and len(set(keys[i * G:(i + 1) * G])) == 1 for i in range(n)]
    return float(np.mean(hits)) if hits else 0.0


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


def held_out_eval(run, step):
    """Greedy pass@1 on the held-out problems of the stage's helper method, of direct coding and (for planner-coder)
    of the Coder with a content-free plan (evaluate.py's attempt_and_judge, --eval-batch-size problems at a time):
    CG = helper - direct, plan information = planner-coder - content-free plan with its paired counts, the format of
    the helper's plans, and the paired comparison with step 0 (McNemar's exact test on the same problems). Per-problem
    rows go to <out>/eval/step_N.jsonl.

    Direct coding and the content-free plan use the Coder alone: in stages where the Coder is frozen they cannot
    change, so they run once and are read back from step 0's file afterwards (our choice: an evaluation is a large
    share of a CPU run's time)."""
    args, problems = run.args, run.eval_set
    helper = eval_method(args)
    frozen_coder = STAGES[args.stage]["train"] != "coder"
    # The content-free-plan control runs beside planner-coder: plan information = what the plans add beyond it.
    control = evaluate.PLAN_INFO_BASELINE.get(helper)
    out, rows = {}, []
    t0 = time.time()
    at_start = read_eval(args.out, 0) if step > 0 else {}  # step 0's rows: the cached Coder-only runs, McNemar's pairs
    for method in dict.fromkeys((helper, control, "direct") if control else (helper, "direct")):
        # Methods that only the frozen Coder writes for cannot change: run once, read back from step 0's file.
        cached = at_start.get(method, {}) if (method != helper and frozen_coder) else {}
        if cached and all(p.id in cached for p in problems):
            passed = [cached[p.id] for p in problems]
            rows += [dict(task_id=p.id, method=method, passed=ok, cached_from_step=0)
                     for p, ok in zip(problems, passed)]
        else:
            mine = grpo.shard(problems)  # under torchrun each rank evaluates its share; the rows are gathered
            local = []
            for a in range(0, len(mine), args.eval_batch_size):
                chunk = mine[a:a + args.eval_batch_size]
                records, _, _ = evaluate.attempt_and_judge(
                    method, run.model, run.tokenizer, chunk, run.agent, run.pool, seed=args.seed,
                    max_new_tokens=args.max_new_tokens, plan_max_new_tokens=args.plan_max_new_tokens,
                    mapcoder_k=args.mapcoder_k, mapcoder_t=args.mapcoder_t, stop_on_failure=args.stop_on_failure)
                local += [dict(task_id=p.id, method=method, passed=r["verdict"] == "passed",
                               pass_rate=r["pass_rate"], plan=r["plan"], plan_cut=r.get("plan_cut", False),
                               program=r["program"])
                          for p, (r,) in zip(chunk, records)]
            new = [r for part in grpo.gather(local) for r in part]
            rows += new
            passed = [r["passed"] for r in new]
            if method == helper and helper != "direct":
                out.update(agents.plan_stats([r["plan"] for r in new], [r["plan_cut"] for r in new], prefix="eval_"))
        out[eval_key(method)] = sum(passed) / max(1, len(passed))
        now = dict(zip((p.id for p in problems), passed))  # {task_id: passed}, for the paired tests
        start = at_start.get(method) if method == helper else None
        if start:
            # Paired with step 0 on the same problems: gained = solved now only, lost = solved at step 0 only.
            pair = evaluate.paired(now, start)
            out.update(eval_gained=pair["gained"], eval_lost=pair["lost"], eval_mcnemar_p=pair["p"])
        if method == helper:
            helper_passed = now
        if method == control:
            pair = evaluate.paired(helper_passed, now)
            out.update(eval_plan_info=out[eval_key(helper)] - out[eval_key(control)], eval_info_gained=pair["gained"],
                       eval_info_lost=pair["lost"], eval_info_p=pair["p"])
    if helper != "direct":
        out["eval_cg"] = rewards.collaboration_gain(out[eval_key(helper)], out["eval_pass1_direct"])
    out["t_eval"] = time.time() - t0
    if not run.lead:
        return out       # rank 0 writes the rows
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


def save_checkpoint(out, step, model, role, optimizer, scheduler, keep_last, base_name):
    root = os.path.join(out, "checkpoints")
    os.makedirs(root, exist_ok=True)
    final = os.path.join(root, f"step_{step:06d}")
    tmp = os.path.join(root, f".tmp_step_{step:06d}")
    shutil.rmtree(tmp, ignore_errors=True)
    grpo.save_adapter(model, role, os.path.join(tmp, "adapter", role), base_model_name_or_path=base_name)
    state = {
        "step": step,  # the number of completed steps
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "rng": rng_states(next(model.parameters()).device),
    }
    torch.save(state, os.path.join(tmp, "state.pt"))
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    for old in checkpoint_dirs(out)[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def load_checkpoint(path, model, role, optimizer, scheduler):
    """Restore a checkpoint into the model's adapter, the optimizer, the scheduler and the RNGs; returns its step.
    (Sampling needs no saved state: each problem's generator is a function of (seed, step, problem index).)"""
    grpo.load_adapter(model, role, os.path.join(path, "adapter", role))
    # weights_only=False: the file holds RNG states (numpy tuples) that we wrote ourselves in save_checkpoint.
    state = torch.load(os.path.join(path, "state.pt"), map_location="cpu", weights_only=False)
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    set_rng_states(state["rng"], next(model.parameters()).device)
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
# Curves: one PNG next to metrics.jsonl. matplotlib is an optional extra: training never fails for lack of it.

CURVES = (  # (panel title, metrics keys drawn in it)
    ("reward", ("reward_mean",)),
    ("pass rate of the programs", ("pass_rate", "all_pass_frac")),
    ("groups without signal", ("zero_var_frac", "eff_only_frac")),
    ("KL to the reference", ("kl",)),
    ("completion length (tokens)", ("completion_len",)),
    ("plan format (trained thoughts)", ("plan_ok_frac", "plan_parts_frac", "plan_placeholder_frac")),
    ("held-out pass@1 and CG", None),  # every eval_pass1_* key and eval_cg, with step 0 from the *_start keys
)


def curve_series(rows):
    """[(panel title, {label: [(step, value), ...]})] for every panel of CURVES, from the rows of metrics.jsonl; a
    panel whose keys no row has gets {} (the held-out panel of a run with --eval-every 0)."""
    panels = []
    for title, keys in CURVES:
        if keys is None:
            keys = sorted({k.removesuffix("_start") for r in rows for k in r
                           if k.startswith("eval_pass1_") or k.startswith("eval_cg")})
        series = {}
        for key in keys:
            pts = [(0, r[key + "_start"]) for r in rows if key + "_start" in r]
            pts += [(r["step"], r[key]) for r in rows if isinstance(r.get(key), (int, float))]
            if pts:
                series[key.replace("eval_pass1_", "pass@1 ").replace("eval_", "")] = pts
        panels.append((title, series))
    return panels


def plot_curves(run_dir):
    """Draw <run_dir>/curves.png from <run_dir>/metrics.jsonl: the training signals and the held-out pass@1 of both
    methods and CG against step. Returns the PNG's path, or None (with a note) when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only, no display
        import matplotlib.pyplot as plt
    except ImportError:
        print("note: matplotlib is not installed (pip install matplotlib): no curves.png", file=sys.stderr)
        return None
    path = os.path.join(run_dir, "metrics.jsonl")
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    fig, axes = plt.subplots(2, 4, figsize=(18, 7.5))
    for ax, (title, series) in zip(axes.flat, curve_series(rows)):
        for label, pts in series.items():
            ax.plot(*zip(*pts), marker="o" if title.startswith("held-out") else None, markersize=4, label=label)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if series:
            ax.legend(fontsize=8)
        else:  # say so rather than leave an empty frame that reads as a drawing bug
            ax.text(0.5, 0.5, "not measured in this run", ha="center", va="center", transform=ax.transAxes)
    axes.flat[-1].axis("off")
    fig.tight_layout()
    out = os.path.join(run_dir, "curves.png")
    fig.savefig(out + ".tmp.png", dpi=80)
    plt.close(fig)
    os.replace(out + ".tmp.png", out)
    return out


# -----------------------------------------------------------------------------------------------------------------


def main(argv=None):
    args = get_args(argv)
    if args.plot:
        if not os.path.isfile(os.path.join(args.plot, "metrics.jsonl")):
            fail(f"--plot {args.plot}: no metrics.jsonl there")
        try:
            out = plot_curves(args.plot)
        except (ValueError, KeyError, TypeError) as e:
            fail(f"--plot {args.plot}: metrics.jsonl is not readable: {e}")
        if out is None:
            sys.exit(1)
        print(f"wrote {out}")
        return
    check_args(args)
    # (0, 1, device) under plain python; under torchrun the process group, rank r on cuda:LOCAL_RANK (or the CPU).
    rank, world, args.device = grpo.dist_setup(args.device)
    # The sandbox's fork-server workers start before the model: small, clean processes (sandbox.py explains why).
    # The `with` makes sure they are shut down however training ends. Under torchrun the ranks of a machine share
    # its cores (SandboxPool's default).
    try:
        if world > 1 and args.problems_per_step < world:
            fail(f"--problems-per-step {args.problems_per_step} is global: it must be >= the {world} ranks")
        if agents.resolve_dtype(None if args.dtype == "auto" else args.dtype, args.device) == torch.float16:
            # A LoRA gradient through fp16 activations underflows without a loss scaler, and this script has none.
            fail(f"--dtype {args.dtype} gives float16 on {args.device}: training in fp16 needs loss scaling, which "
                 "train.py does not do; use --dtype bfloat16 or float32 (evaluate.py may use fp16)")
        # The model last among the cheap checks: a hub id costs a reachability probe of a few seconds.
        try:
            evaluate.check_models(args.model, args.planner_model)
        except evaluate.UsageError as e:
            fail(str(e))
        with sandbox.SandboxPool(workers=args.workers) as pool:
            train(args, pool, rank, world)
    except OSError as e:  # disk full, --out made read-only during the run, ... (before Exception, which re-raises)
        fail(f"I/O error: {e} (checkpoints of this run are in {args.out}/checkpoints; continue with --resume)")
    except Exception as e:
        if world == 1:
            raise
        # One line naming the rank; torchrun then stops the other ranks and exits non-zero.
        print(f"error: rank {rank}: {type(e).__name__}: {e}".splitlines()[0], file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        ckpts = checkpoint_dirs(args.out)
        words = list(sys.argv[1:] if argv is None else argv)
        if ckpts:
            again = shlex.join(words + ([] if args.resume else ["--resume"]))
            print(f"\ninterrupted: last checkpoint: {ckpts[-1]}; resume with: python train.py {again}", file=sys.stderr)
        else:  # --resume would find nothing to continue: the same command starts again
            again = shlex.join([w for w in words if w != "--resume"])
            print(f"\ninterrupted before the first checkpoint (nothing to resume); start again with: python train.py "
                  f"{again}", file=sys.stderr)
        sys.exit(130)
    finally:
        grpo.dist_teardown()


# Flags a resumed run may change: they decide how long it runs, where and how often it reports, not what it learns.
# Every other flag must equal the checkpointed run's (args.json), or the resumed run would not continue that run.
RESUME_MAY_CHANGE = ("resume", "num_steps", "out", "workers", "device", "save_every", "keep_last", "eval_every",
                     "eval_limit", "eval_batch_size", "plot", "adapters", "bench_kwargs")


def check_resume_settings(args):
    """--resume: one error line naming the first flag whose value differs from the checkpointed run's args.json."""
    path = os.path.join(args.out, "args.json")
    if not os.path.exists(path):
        return
    with open(path) as f:
        old = json.load(f)
    now = json.loads(json.dumps(vars(args)))  # tuples -> lists, as args.json stores them
    diff = [k for k in now if k not in RESUME_MAY_CHANGE and k in old and old[k] != now[k]]
    if diff:
        k = diff[0]
        more = (f" (and {len(diff) - 1} more: {', '.join('--' + d.replace('_', '-') for d in diff[1:])})"
                if diff[1:] else "")
        fail(f"--resume: --{k.replace('_', '-')} is {now[k]!r} but the checkpointed run used {old[k]!r}{more}; a "
             f"resumed run must keep the settings that decide what it learns (or start a new --out)")


def check_out_dir(args):
    """--out must be a writable directory (created if missing); --resume needs a checkpoint in it (and the settings it
    was made with), a new run none."""
    try:
        evaluate.writable_out_dir(args.out)
    except evaluate.UsageError as e:
        fail(str(e))
    if args.resume and not checkpoint_dirs(args.out):
        fail(f"--resume: no checkpoint in {args.out} (nothing to continue); drop --resume to start a new run there")
    if args.resume:
        check_resume_settings(args)
    if not args.resume and checkpoint_dirs(args.out):
        fail(f"{args.out} already holds checkpoints: pass --resume to continue, or a new --out")


@dataclass
class Run:
    """What a training run holds from one step to the next (state only; the functions below act on it)."""
    args: argparse.Namespace
    pool: object                 # sandbox.SandboxPool of this rank
    rank: int
    world: int
    train_set: list
    eval_set: list
    model: object                # the trained role's base model (with --planner-model, stage planner: the Planner's)
    tokenizer: object
    params: list                 # the trained adapter's parameters
    optimizer: object
    scheduler: object
    device: object
    agent: object = None         # agent(role): the context in which the model acts as that role (evaluate.make_agent)
    bar: object = None           # the progress bar (disabled off a terminal and on ranks other than 0)
    hinted: bool = False         # a step without reward variance has been explained (once per run)

    @property
    def lead(self):
        return self.rank == 0    # the one rank that prints, writes metrics, plots and checkpoints

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
    """The phase inside a step, on the bar (only on a terminal, see the bar's disable=None)."""
    if run.bar is not None:
        run.bar.set_postfix_str(text, refresh=True)


# Policies this large learn with gradient checkpointing on a CPU too: without it, Planner steps of the 1.5B
# (--planner-model, fp32, 2 x G=4, 256 + 256 tokens) were killed for memory at a 24 GB peak.
CPU_CKPT_PARAMS = 1e9


def grad_ckpt_on(flag, device, n_params=0):
    """--grad-ckpt, or by device and policy size when not given. our choice: on for CUDA, where memory bounds the
    batch; on a CPU off for a policy under CPU_CKPT_PARAMS parameters: a learning micro-batch of the recipe (8 rows x
    ~430 tokens, the 0.5B in fp32) ran in 0.82x the time without it and peaked 2.6 GB higher (6.9 -> 9.5 GB
    resident), which a machine that holds the model in RAM can spare; a larger one's activations cannot be spared."""
    if flag is not None:
        return bool(flag)
    return device.type == "cuda" or n_params >= CPU_CKPT_PARAMS


def judged_in_parent(problems):
    """The problems whose every test is judged in the parent. HumanEval's 4 helper checks (data.HUMANEVAL_HELPER)
    decide inside the candidate's process, where an always-equal object can pass them (sandbox.py): they are never
    a reward. Evaluation keeps them, with that limitation stated."""
    return [p for p in problems if not any(data.HUMANEVAL_HELPER in str(t) for t in p.hidden_tests)]


def set_up(args, pool, rank, world):
    """Seeds, data, the model with its adapters (only the trained one learns), optimizer and scheduler, and the
    resume; returns (Run, first step)."""
    role = STAGES[args.stage]["train"]
    check_out_dir(args)
    # Seeds: python / numpy / torch for init and dropout (the same on every rank: identical LoRA init); sampling
    # draws from one generator per problem (problem_generator).
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    try:
        train_set = data.load(args.bench, path=args.data, split=args.split, limit=args.limit, **args.bench_kwargs)
        train_set = judged_in_parent(train_set)
        eval_set = data.load(args.bench, path=args.data, split=args.eval_split, limit=args.eval_limit,
                             **args.bench_kwargs) \
            if args.eval_every > 0 else []
    except (FileNotFoundError, ValueError, KeyError) as e:
        fail(str(e))
    if not train_set:
        fail(f"no training problems in {args.bench} split {args.split!r}")
    if args.blind_weight and any(p.starter_code.strip() for p in train_set):
        fail(f"--blind-weight hides the statement, but {args.bench} problems carry starter code that shows the task; "
             "use it with a benchmark without starter code (mbpp)")
    if rank == 0:
        fp32 = agents.resolve_dtype(None if args.dtype == "auto" else args.dtype, args.device) == torch.float32
        print(time_estimate(args, len(eval_set), str(args.device).startswith("cpu"), fp32), flush=True)

    # One base in memory, one named adapter per role (the Planner's on its own base with --planner-model).
    dtype = None if args.dtype == "auto" else args.dtype
    try:
        model, tokenizer = agents.load_model(args.model, device=args.device, dtype=dtype)
        planner_model = agents.load_second_model(args.planner_model, tokenizer, args.device, dtype) \
            if args.planner_model else None
    except (FileNotFoundError, ValueError) as e:
        fail(str(e))
    device = next(model.parameters()).device
    if device.type != "cuda" and rank == 0:
        print(f"note: running on {device.type} (no CUDA): this works but is slow; use a GPU for real runs",
              file=sys.stderr)
    policy = evaluate.base_for(role, model, planner_model)  # its adapter learns, its bare weights: the KL reference
    try:
        loaded = evaluate.load_adapters(model, args.adapters, planner_model)
    except evaluate.UsageError as e:
        fail(str(e))
    if role not in loaded:
        grpo.add_lora(policy, role, r=args.lora_r, alpha=args.lora_alpha, dropout=args.lora_dropout,
                      targets=tuple(t for t in args.lora_targets.split(",") if t))
    # Only the trained adapter learns; a loaded frozen one must not (add/load_lora mark all LoRA params trainable).
    for m in {id(model): model, id(policy): policy}.values():
        for p in m.parameters():
            p.requires_grad_(False)
    params = grpo.lora_parameters(policy, role)
    for p in params:
        p.requires_grad_(True)
    if grad_ckpt_on(args.grad_ckpt, device, sum(p.numel() for p in policy.parameters())):
        grpo.enable_checkpointing(policy, True)

    # AdamW over the trained adapter only; linear warm-up then constant (our choice: short runs).
    optimizer = torch.optim.AdamW(params, lr=args.lr, weight_decay=args.weight_decay, betas=(0.9, 0.99))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / max(1, args.warmup_steps)))
    run = Run(args, pool, rank, world, train_set, eval_set, policy, tokenizer, params, optimizer, scheduler, device,
              agent=evaluate.make_agent(model, loaded | {role}, planner_model))

    metrics_path = os.path.join(args.out, "metrics.jsonl")
    start = 0
    if args.resume:
        ckpts = checkpoint_dirs(args.out)  # check_out_dir made sure there is one; every rank loads the same
        start = load_checkpoint(ckpts[-1], model, role, optimizer, scheduler)
        if run.lead:
            truncate_metrics(metrics_path, start)
            print(f"resumed from {ckpts[-1]} (step {start})")
    elif os.path.exists(metrics_path) and run.lead:
        os.remove(metrics_path)
    # Inputs are valid and the model is loaded: now the run's arguments are worth recording (all of them in
    # args.json, the ones that matter on one line).
    if run.lead:
        os.makedirs(args.out, exist_ok=True)  # only now: a run that never started leaves no directory behind
        with open(os.path.join(args.out, "args.json"), "w") as f:
            json.dump(vars(args), f, indent=1)
    frozen = [f"{r}={d}" for r, d in sorted(args.adapters.items()) if r != role]
    say(run, f"train {args.stage}: model {args.model} | {device} "
             f"{str(next(model.parameters()).dtype).replace('torch.', '')} | {args.num_steps} steps x "
             f"{args.problems_per_step} problems x G={args.group_size} | lr {args.lr:g} beta {args.beta:g} | "
             f"{len(train_set)} {args.bench}/{args.split} problems, eval on {len(eval_set)} {args.eval_split} | "
             f"out {args.out} (all arguments: args.json)" + (f" | {world} ranks" if world > 1 else "")
             + (f" | Planner: {args.planner_model}" if planner_model is not None else "")
             + (f" | frozen adapters: {', '.join(frozen)}" if frozen else "")
             + (f" | starting from {role}={args.adapters[role]}" if args.adapters.get(role) else ""))
    return run, start


def train(args, pool, rank=0, world=1):
    """The loop: per step, phases 0-8 (set_up, grpo_step, log_evaluate_checkpoint); then the final adapter."""
    run, start = set_up(args, pool, rank, world)
    # disable=None: the bar (and the phase shown in it) only on a terminal; in a log file only the step lines.
    run.bar = tqdm(range(start, args.num_steps), initial=start, total=args.num_steps, desc=f"train {args.stage}",
                   dynamic_ncols=True, disable=None if run.lead else True)
    for step in run.bar:
        m = {"step": step + 1}
        # ---- 0 eval before any update: the baseline Collaboration Gain
        if step == 0 and args.eval_every > 0 and run.eval_set:
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
        m["eff_only_frac"] = efficiency_only_frac(step_all["rewards"], step_all["keys"], G)
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
        rows = [json.loads(line) for line in f if line.strip()]
    rows = [m for m in rows if "t_step" in m]
    groups, informative = sum(m["groups"] for m in rows), sum(m["informative_groups"] for m in rows)
    hours = sum(m["t_step"] for m in rows) / 3600
    return (f"informative groups: {informative} of {groups} over {len(rows)} steps, "
            f"{informative / max(hours, 1e-9):.1f} per hour of step time")


def rollout_and_score(run, batch, generators):
    """Phases 1-3 on this rank's problems: sample, execute, reward. Returns (Samples or None, this rank's rewards,
    the step's per-sample data gathered from every rank in the step's problem order, this rank's times)."""
    args, stage_def = run.args, STAGES[run.args.stage]
    G, M = args.group_size, args.downstream_samples
    # ---- 1 sample
    t0 = time.time()
    samples, leaf_probs, leaf_ctxs, group_probs = rollout(args.stage, run.tokenizer, batch, args,
                                                          generators, run.agent, run.pool,
                                                          lambda text: show(run, text))
    times = {"t_sample": time.time() - t0}
    # ---- 2 execute (the toy stage has nothing to run)
    t0 = time.time()
    results = [None] * len(leaf_ctxs)
    if stage_def["reward"] != "toy" and leaf_ctxs:
        show(run, f"executing {len(leaf_ctxs)} programs")
        results = run.pool.run([agents.problem_job(p, c.get("program", ""), p.hidden_tests,
                                                   repeat=args.measure_repeats, stop_on_failure=args.stop_on_failure)
                                for p, c in zip(leaf_probs, leaf_ctxs)])
    times["t_execute"] = time.time() - t0
    # ---- 3 reward, one group (G outputs of the trained role, each with M downstream leaves) per problem that
    # reached the trained role (all of the batch, except in needs_public_failure stages)
    outputs = leaf_ctxs[::M]  # (G per group) the context right after each trained output: what the next role saw
    planner = stage_def["train"] == "planner" and samples
    if planner:  # the gate's verdict on the plan exactly as the Coder saw it, and whether its sample hit the budget
        for o in outputs:
            o["verdict"] = agents.plan_check(o["plan"], cut=o.get("planner_cut", False))
    if args.blind_weight and outputs:
        show(run, f"blind Coder: {len(outputs)} programs from the plans alone")
        t0 = time.time()
        blind = blind_pass_rates(run, [p for p in group_probs for _ in range(G)], [o["plan"] for o in outputs])
        for o, b in zip(outputs, blind):
            o["blind"] = b
        times["t_blind"] = seconds_since(t0, run.device)
    rewards_mine = []
    for i in range(len(group_probs)):
        rewards_mine += REWARDS[stage_def["reward"]](results[i * G * M:(i + 1) * G * M], outputs[i * G:(i + 1) * G],
                                                     G, M, args)
    # The plans exactly as the Coder saw them (the gate, the logs and the Coder share one plan text).
    plans = [o["plan"] for o in outputs] if planner else []
    cut = [o.get("planner_cut", False) for o in outputs] if planner else []
    gated = bool(stage_def.get("format_gate")) and args.format_gate
    mine = dict(rewards=rewards_mine, plans=plans, cut=cut, rows_per_rank=[len(rewards_mine)],
                blind=[o["blind"] for o in outputs] if args.blind_weight else [],
                lens=samples.completion_mask.sum(1).tolist() if samples else [],
                pass_rates=[r.pass_rate for r in results if r is not None],
                passed=[r.verdict == "passed" for r in results if r is not None],
                # what a trained output's reward looks at besides efficiency: its leaves' pass rates and its format
                keys=[(tuple(r.pass_rate for r in results[j * M:(j + 1) * M]),
                       outputs[j]["verdict"] if plans and gated else True)
                      for j in range(len(rewards_mine))] if stage_def["reward"] != "toy" else [])
    # The whole step's per-sample data (one list per rank, concatenated in rank order = problem order): the metrics
    # are those of the step, whatever the number of ranks.
    parts = grpo.gather(mine)
    return samples, rewards_mine, {k: [x for part in parts for x in part[k]] for k in mine}, times


def blind_pass_rates(run, problems, plans):
    """The blind Coder of --blind-weight: for each (problem, plan), the pass rate on the problem's hidden tests of the
    frozen Coder's greedy program written from the plan with the statement hidden (agents.blind_problem). A plan
    that says nothing leaves the Coder only the public examples, the same for every plan of the group, so the
    group's advantages come from what the plans say. our choice, the direct form of "score a plan by what it tells
    the Coder": execution (a likelihood of MBPP's one reference program, tried before, was measured not to agree
    with execution)."""
    args, tok = run.args, run.tokenizer
    prompts = [agents.coder_prompt(tok, agents.blind_problem(p), plan) for p, plan in zip(problems, plans)]
    with run.agent("coder") as m:
        s = agents.sample(m, tok, prompts, max_new_tokens=args.max_new_tokens, temperature=0.0,
                          stop=agents.ROLES["coder"]["stop"])
    programs = [agents.extract_code(text, p.kind, p.entry_point) for p, text in zip(problems, s.texts)]
    results = run.pool.run([agents.problem_job(p, prog, p.hidden_tests, stop_on_failure=args.stop_on_failure)
                            for p, prog in zip(problems, programs)])
    return [r.pass_rate for r in results]


def micro_batches(samples, size):
    """This rank's completions as the objective wants them (prompt left-padded + completion right-padded), cut into
    micro-batches of `size` rows, each trimmed of the columns none of its rows uses. Returns [(rows, input_ids,
    attention_mask, completion_mask, completion_start)]."""
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


def reference_logprobs(run, mbs):
    """Phase 5, no grad: per micro-batch the reference log-probs (adapters off = the frozen base = the reference
    policy; none when beta == 0) and, with several PPO passes, the sampling-time ones of the trained role."""
    ref_lp, old_lp = [], []
    with torch.no_grad():
        run.model.eval()
        for _, ids, am, _, left in mbs:
            if run.args.beta != 0:
                with grpo.adapters_off(run.model):
                    ref_lp.append(logprobs(run, ids, am, left))
            if run.args.ppo_epochs > 1:  # with one pass old == logp.detach() (learn)
                with run.agent(run.role):
                    old_lp.append(logprobs(run, ids, am, left))
    return ref_lp, old_lp


def learn(run, samples, adv, B, m, times):
    """Phases 5-6 on this rank's rows: reference (and old) log-probs, then the GRPO loss over micro-batches, each
    scaled by its rows over the step's B rows, so the gradients summed over micro-batches and over ranks are those
    of the mean over all B completions; clip, step. A rank without rows adds zero gradients."""
    args = run.args
    mbs = micro_batches(samples, args.micro_batch)
    # ---- 5 reference (and old) log-probs
    show(run, "reference log-probs")
    t0 = time.time()
    ref_lp, old_lp = reference_logprobs(run, mbs)
    times["t_reference"] = seconds_since(t0, run.device)

    # ---- 6 learn, forward AND backward under the trained role's adapter
    show(run, f"learning: {len(mbs)} micro-batches x {args.ppo_epochs} pass(es)")
    t0 = time.time()
    run.model.train()
    stats, skipped, updates = {}, False, 0
    # With several passes a later one may go non-finite after earlier updates: keep the adapter and AdamW state from
    # before the first pass, so "update skipped" means the whole step's updates (one pass needs no copy).
    before = ([p.detach().clone() for p in run.params], copy.deepcopy(run.optimizer.state_dict())) \
        if args.ppo_epochs > 1 else None
    with run.agent(run.role):
        for _ in range(args.ppo_epochs):
            run.optimizer.zero_grad(set_to_none=True)
            for j, (sl, ids, am, cm, left) in enumerate(mbs):
                lp = logprobs(run, ids, am, left)  # (mb, T)
                loss, st = grpo.grpo_loss(lp, old_lp[j] if args.ppo_epochs > 1 else lp.detach(),
                                          ref_lp[j] if args.beta != 0 else None, adv[sl], cm, beta=args.beta,
                                          clip_eps=args.clip_eps)
                if not torch.isfinite(loss):
                    skipped = True
                    break
                (loss * (lp.shape[0] / B)).backward()
                for k, v in st.items():
                    stats[k] = stats.get(k, 0.0) + v * lp.shape[0] / B / args.ppo_epochs
            skipped = sum_gradients(run, skipped)
            if skipped:
                break
            grad_norm = torch.nn.utils.clip_grad_norm_(run.params, args.grad_clip)
            if not torch.isfinite(grad_norm):
                skipped = True
                break
            run.optimizer.step()
            updates += 1
    if skipped:
        # Non-finite loss or gradient: drop this step's updates entirely (all its passes), log it, and carry on.
        run.optimizer.zero_grad(set_to_none=True)
        if before is not None and updates:
            with torch.no_grad():
                for p, saved in zip(run.params, before[0]):
                    p.copy_(saved)
            run.optimizer.load_state_dict(before[1])
        m["skipped"] = True
        say(run, f"warning: step {m['step']}: non-finite loss or gradient, update skipped", file=sys.stderr)
    else:
        m["grad_norm"] = float(grad_norm)
        for _ in range(updates):
            run.scheduler.step()  # the schedule counts optimizer updates: a skipped step does not advance it
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
    direct coding, CG, plan information with its paired counts, and the paired comparison with step 0."""
    line = f" eval {helper} {m[eval_key(helper)]:.3f}"
    if "eval_cg" in m:
        line += f" direct {m['eval_pass1_direct']:.3f} CG {m['eval_cg']:+.3f}"
    if "eval_plan_info" in m:
        line += (f" plan info {m['eval_plan_info']:+.3f} (+{m['eval_info_gained']} -{m['eval_info_lost']} "
                 f"p={m['eval_info_p']:.3g})")
    if "eval_mcnemar_p" in m:
        line += f" vs step 0: +{m['eval_gained']} -{m['eval_lost']} p={m['eval_mcnemar_p']:.3g}"
    return line


def log_evaluate_checkpoint(run, m):
    """Phases 7-8 of a step (also of a step skipped for want of a group): held-out eval when due (every rank takes
    its share), then on rank 0 one metrics line, one progress line, the curves, and the checkpoint when due."""
    args = run.args
    done = m["step"]
    last = done == args.num_steps
    if args.eval_every > 0 and run.eval_set and (done % args.eval_every == 0 or last):
        show(run, f"held-out eval on {len(run.eval_set)} problems")
        m.update(held_out_eval(run, done))
    # What a step buys per hour of its own time (held-out eval excluded; seconds summed over ranks).
    m["t_step"] = sum(m.get(k, 0.0) for k in ("t_sample", "t_execute", "t_blind", "t_reference",
                                               "t_learn"))
    m["informative_per_hour"] = 3600 * m["informative_groups"] / max(m["t_step"], 1e-9)
    if not run.lead:
        return
    with open(os.path.join(args.out, "metrics.jsonl"), "a") as f:
        f.write(json.dumps(m) + "\n")
    helper = eval_method(args)
    evaluated = " |" + eval_line(m, helper) if eval_key(helper) in m else ""
    if m.get("zero_var_frac") == 1 and not run.hinted:  # once per run: it is a setting's problem, or luck
        run.hinted = True
        say(run, no_signal_hint(m, args))
    if m.get("no_group"):
        say(run, f"step {done}: no problem of the batch failed its public tests: nothing to train on, step skipped"
                 + evaluated)
    else:
        run.bar.set_postfix(reward=f"{m['reward_mean']:.3f}", kl=f"{m.get('kl', 0):.4f}",
                            zv=f"{m['zero_var_frac']:.2f}", len=f"{m['completion_len']:.0f}")
        say(run, f"step {done}: reward {m['reward_mean']:.3f} pass {m.get('pass_rate', float('nan')):.3f} "
                 f"zero-var {m['zero_var_frac']:.2f} kl {m.get('kl', 0):.4f} clip {m.get('clip_frac', 0):.3f} "
                 f"len {m['completion_len']:.0f} gnorm {m.get('grad_norm', float('nan')):.3f} "
                 f"| sample {m['t_sample']:.1f}s execute {m['t_execute']:.1f}s learn {m['t_learn']:.1f}s" + evaluated)
    if "t_eval" in m or last:
        plot_curves(args.out)
    # Checkpoint (never after a skipped step's corrupted state: the update was dropped, weights are clean).
    if done % args.save_every == 0 or last:
        save_checkpoint(args.out, done, run.model, run.role, run.optimizer, run.scheduler, args.keep_last,
                        run.base_name)


if __name__ == "__main__":
    main()
