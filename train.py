"""train.py: CoRe-Code's collaborative GRPO, one agent at a time, as a plain script.

The method. A Planner writes a plan (an Algorithmic Thought), a Coder writes the program from it,
and rewards come only from executing programs on tests in the sandbox. `--stage planner` trains the
Planner's LoRA adapter while the Coder is frozen: for each problem the Planner samples a group of G
plans, the Coder writes M programs from each, and a plan's reward is its programs' pass rate, then
their CPU time. `--stage coder` then trains the Coder's adapter under the trained, frozen Planner:
one plan per problem, G programs from it, each rewarded by its pass rate, then its peak memory. The
same loop trains MapCoder's Retrieval and Debugging agents (`--stage retriever`, `--stage
debugger`) and the paper's single-agent baseline (`--stage direct`); STAGES says which adapter
learns and which reward applies. Every agent is a named LoRA adapter on ONE base model in memory.

Where we depart from plain GRPO (DeepSeekMath) or fill in what the paper does not say:
  - one optimisation pass per batch: the ratio to the sampling policy is exactly 1, so the PPO
    clip (CLIP_EPS) never binds; the loss keeps both, as TRL does;
  - the KL reference is the base model with every adapter off (no second copy), k3 estimator;
  - log-probs are taken at the sampling temperature (logits / T), where the tokens came from;
  - advantages divide by max(group std, --adv-std-floor 0.1), not the std alone, so a group that
    differs only by an efficiency bonus gets small advantages, not +-1;
  - the loss is the mean over completions of each completion's token mean (DeepSeekMath's form);
  - the Planner's reward is gated by the plan's format (agents.gate_label, rewards.format_gated):
    a plan that says nothing or copies the problem gets -0.5 whatever its programs scored;
  - the reward shapes (sigmoid CPU-time bonus, memory bonus against the group's best, noise
    floors) are ours (rewards.py), since the paper's formulas are not available;
  - frozen roles before the trained one write greedily, once per problem: a group shares one
    context.

One step (the loop in `train`): 1 sample, 2 execute, 3 reward, 4 advantages, 5 reference
log-probs, 6 learn, 7 log, 8 evaluate and save. Each phase is one call below the loop; resume,
progress and refusals are helpers further down.

What it is not: a trainer framework (no Trainer class, callbacks or config system), or a vLLM
rollout engine: our KV-cache sampler (agents.sample) shares a prefill per group, but has no paged
attention; one process, one device.

References: DeepSeekMath (GRPO, arXiv:2402.03300); the CoRe-Code paper (the method); nanoGPT and
nanochat's chat_rl.py (the script's shape); TRL's GRPOTrainer (the loss our tests compare with).
"""
import argparse
import dataclasses
import importlib.util
import json
import os
import random
import shlex
import shutil
import sys
import time
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import torch
from tqdm import tqdm

import agents
import data
import grpo
import rewards
import sandbox
from evaluate import (UsageError, at_least, check_inputs, cli, held_out_eval, load_given_plans,
                      open_team, parser, progress)

# -------------------------------------------------------------------------------------------------
# Settings nobody changed between runs: named constants (our choices); the rest are flags below.
CLIP_EPS = 0.2            # PPO clip range; inert with one pass per batch (see learn)
GRAD_CLIP = 1.0           # max global grad norm
WEIGHT_DECAY = 0.0        # AdamW
LORA_R = 16               # LoRA rank, alpha 32 (scaling 2), on every attention and MLP projection
LORA_ALPHA = 32
LORA_TARGETS = grpo.DEFAULT_TARGETS
LOGPROB_CHUNK = 256       # completion tokens per output-layer chunk: one chunk x vocab fp32 buffer
GATE_PENALTY = 0.5        # the reward of a plan the format gate refuses (rewards.format_gated)
TRUNCATION_PENALTY = 0.1  # deducted from a well-formed plan that reached its token limit
TIMING_REPEATS = 3        # executions of each passing program: CPU time = min, peak memory = median
EVAL_BATCH_SIZE = 16      # held-out problems generated together (90 ran a 24 GB CPU out of memory)
SAVE_EVERY = 25           # every step writes a checkpoint; the newest and every 25th are kept,
KEEP_LAST = 3             # the last three of those
TOY_TARGET = "a"          # the toy stage rewards this character

# The stages. `chain`: the roles in the order they act on a problem; `train`: the role whose
# samples form the GRPO group (its adapter is the only thing updated); `reward`:
# rewards.planner_reward ("planner"), rewards.coder_reward ("coder") or the toy reward; `gate`:
# the Planner's format gate applies. Roles before the trained one act once per problem, the first
# role after it M (--downstream-samples) times per sample, later ones once. `needs_public_failure`
# keeps only problems whose upstream program fails a PUBLIC test, with its feedback in the prompt
# (hidden tests never reach a prompt); `eval_method` is the held-out method compared with direct
# coding. "toy" rewards a character of the raw text: the tests prove with it that this loop learns.
STAGES = {
    "planner": dict(chain=("planner", "coder"), train="planner", reward="planner", gate=True),
    "coder": dict(chain=("planner", "coder"), train="coder", reward="coder"),
    "direct": dict(chain=("coder",), train="coder", reward="coder", eval_method="direct"),
    "retriever": dict(chain=("retriever", "planner", "coder"), train="retriever",
                      reward="planner", eval_method="mapcoder"),
    "debugger": dict(chain=("coder", "debugger"), train="debugger", reward="coder",
                     needs_public_failure=True, eval_method="mapcoder"),
    "toy": dict(chain=("coder",), train="coder", reward="toy"),
}


def get_args(argv=None):
    p = parser("Collaborative GRPO for code generation (CoRe-Code): train one agent's LoRA "
               "adapter with the others frozen: the Planner, then the Coder.", split="train")
    p.add_argument("--stage", choices=sorted(STAGES),
                   help="the agent trained: planner, coder, direct (single-agent GRPO), "
                        "retriever or debugger (MapCoder), toy")
    p.add_argument("--num-steps", type=at_least(1), default=200, help="optimizer steps")
    p.add_argument("--problems-per-step", type=at_least(1), default=4, help="problems (groups)")
    p.add_argument("--group-size", type=at_least(2), default=8, metavar="G",
                   help="samples of the trained role per problem")
    p.add_argument("--downstream-samples", type=at_least(1), default=1, metavar="M",
                   help="outputs of the first frozen role after the trained one, per sample")
    p.add_argument("--temperature", type=at_least(1e-6, float), default=1.0, metavar="T",
                   help="sampling temperature of the trained role (and of frozen roles after it "
                        "when M > 1)")
    p.add_argument("--beta", type=at_least(0.0, float), default=0.04, help="KL coefficient")
    p.add_argument("--adv-std-floor", type=at_least(0.0, float), default=0.1, metavar="S",
                   help="advantages divide by max(group std, S); 0 = plain GRPO")
    p.add_argument("--lr", type=at_least(0.0, float), default=1e-5, help="AdamW learning rate")
    p.add_argument("--warmup-steps", type=at_least(0), default=10, metavar="N",
                   help="linear warm-up steps, then constant")
    p.add_argument("--micro-batch", type=at_least(1), default=8, help="completions a backward pass")
    p.add_argument("--grad-ckpt", action=argparse.BooleanOptionalAction, default=True,
                   help="gradient checkpointing of the decoder layers (less memory, ~1.6x slower)")
    p.add_argument("--eval-split", default="validation", metavar="SPLIT",
                   help="held-out split of the periodic evaluation")
    p.add_argument("--eval-limit", type=at_least(0), default=20, help="held-out problems")
    p.add_argument("--eval-every", type=at_least(0), default=25, metavar="N",
                   help="held-out evaluation every N steps, at step 0 and at the end; 0 = never")
    p.add_argument("--allow-held-out-split", action="store_true",
                   help="allow training on a split other than train, or choosing checkpoints on "
                        "test")
    p.add_argument("--plans-from", metavar="FILE",
                   help="stage coder: the Coder writes from these plans instead of the Planner's: "
                        "an evaluate.py <row>.jsonl with one plan per training problem (e.g. "
                        "--method reference-plan --split train)")
    p.add_argument("--resume", action="store_true", help="continue from the last checkpoint")
    args = p.parse_args(argv)
    args.out = args.out or os.path.join("runs", args.stage or "")
    return args


# -------------------------------------------------------------------------------------------------
# The loop.


def train(args, team):
    state, start = set_up(args, team)
    for step in range(start, args.num_steps):
        m = {"step": step + 1}
        if step == 0 and state.eval_set:  # the baseline: CG and plan information before any update
            m.update({k + "_start": v for k, v in evaluate_held_out(state, 0).items()})
        state.show = progress(state.bar, lambda: f"step {step + 1}/{args.num_steps}: ")
        # ---- 1 sample: the stage's chain of roles, G samples of the trained role per problem
        problems, generators = step_problems(state, step)
        rollouts, samples = sample(state, problems, generators, m)
        # ---- 2 execute every program on its problem's hidden tests in the sandbox
        execute(state, rollouts, m)
        # ---- 3 reward each group (rewards.py)
        reward(state, rollouts, m)
        # ---- 4 advantages: group-normalised rewards
        adv = advantages(state, rollouts, m)
        # ---- 5 reference log-probs (adapters off) and 6 learn: the GRPO loss, one optimizer step
        if adv is not None:
            learn(state, samples, adv.to(state.device), m)
        # ---- 7 log, 8 evaluate and save
        if state.eval_set and ((step + 1) % args.eval_every == 0 or step + 1 == args.num_steps):
            m.update(evaluate_held_out(state, step + 1))
        log(state, m)
        save_checkpoint(state, step + 1)
    save_final(state)


@dataclass
class Rollout:
    """One sample of the trained role and what came of it: a step fills it, the reward reads it."""
    problem: data.Problem
    text: str                    # the trained role's completion (a plan, a retrieval, a program)
    length: int                  # its tokens, EOS included (what the loss averages over)
    plan: str = ""               # the plan the Coder wrote from ("" when none)
    plan_truncated: bool = False  # that plan reached its token limit
    programs: list = field(default_factory=list)  # the M programs executed for this sample
    # their sandbox.ProgramResults (verdict, pass rate, ...)
    results: list = field(default_factory=list)
    gate: str = ""               # the format gate's label of the plan (Planner stage)
    reward: float = 0.0
    without: dict = field(default_factory=dict)   # {efficiency term: the reward without it}


# -------------------------------------------------------------------------------------------------
# The phases.


def step_problems(state, step):
    """The step's problems (a pure function of (step, seed), so a resumed run repeats what the
    uninterrupted one did) and one sampling generator per problem."""
    args = state.args
    ids = batch_indices(step, len(state.train_set), args.problems_per_step, args.seed)
    generators = [problem_generator(args.seed, step, i, state.device) for i in ids]
    return [state.train_set[i] for i in ids], generators


def sample(state, problems, generators, m):
    """Phase 1: the stage's chain (agents.run_chain). Frozen roles before the trained one write once
    per problem, the trained role G samples, the first role after it M outputs each. Returns the
    Rollouts (G per group, in group order) and the trained role's agents.Samples (one row per
    Rollout)."""
    args, stage = state.args, STAGES[state.args.stage]
    t0 = time.time()
    chain = stage_chain(args)
    starts = [{"k": agents.MAPCODER_K} for _ in problems]
    if state.plans:  # --plans-from: the Coder writes from the given plans; no Planner samples
        chain = [link for link in chain if link[0] != "planner"]
        for ctx, p in zip(starts, problems):
            ctx["plan"], ctx["plan_truncated"] = state.plans[p.id]
    at = [role for role, _, _ in chain].index(stage["train"])
    probs, ctxs, _ = agents.run_chain(state.team, chain[:at], problems, starts, list(generators),
                                      show=state.show)
    if stage.get("needs_public_failure"):
        probs, ctxs, generators = failing_public(state, probs, ctxs, generators)
    leaves, samples = [], {}
    if probs:  # (the debugger stage keeps none when every upstream program passes)
        _, leaves, samples = agents.run_chain(state.team, chain[at:], probs, ctxs, list(generators),
                                              show=state.show)
    G, M = args.group_size, args.downstream_samples
    rollouts = []
    trained = samples.get(stage["train"])
    lengths = trained.completion_mask.sum(1).tolist() if trained else []
    for i, text in enumerate(trained.texts if trained else []):
        mine = leaves[i * M:(i + 1) * M]  # the contexts the M downstream outputs ended in
        programs = [c["program"] for c in mine] if stage["reward"] != "toy" else []
        rollouts.append(Rollout(probs[i // G], text, lengths[i], mine[0].get("plan", ""),
                                mine[0].get("plan_truncated", False), programs))
    m["t_sample"] = time.time() - t0
    return rollouts, trained


def execute(state, rollouts, m):
    """Phase 2: every program on its problem's hidden tests, all in one pool.run (spread over
    workers)."""
    t0 = time.time()
    jobs = [agents.problem_job(r.problem, program, r.problem.hidden_tests, repeat=TIMING_REPEATS)
            for r in rollouts for program in r.programs]
    if jobs:
        state.show(f"executing {len(jobs)} programs")
        results = iter(state.team.pool.run(jobs))
        for r in rollouts:
            r.results = [next(results) for _ in r.programs]
    m["t_execute"] = time.time() - t0


def reward(state, rollouts, m):
    """Phase 3: each group's rewards (score_group), and the step's figures in the metrics."""
    stage = STAGES[state.args.stage]
    # the gate reads the plan exactly as the Coder saw it
    for r in rollouts if stage.get("gate") else []:
        r.gate = agents.gate_label(r.plan, truncated=r.plan_truncated, problem=r.problem)
    G = state.args.group_size
    for j in range(0, len(rollouts), G):
        score_group(stage["reward"], rollouts[j:j + G])
    if stage["train"] == "planner":
        truncated = [r.plan_truncated for r in rollouts]
        m.update(agents.plan_stats([r.plan for r in rollouts], truncated))
    results = [x for r in rollouts for x in r.results]
    if results:
        m["pass_rate"] = float(np.mean([x.pass_rate for x in results]))
        m["all_pass_frac"] = float(np.mean([x.verdict == "passed" for x in results]))
    if rollouts:
        m["completion_len"] = float(np.mean([r.length for r in rollouts]))
    for term in rollouts[0].without if rollouts else {}:  # how often a term reordered a group
        without = [r.without[term] for r in rollouts]
        m[f"{term}_rank_frac"] = rewards.rank_changed([r.reward for r in rollouts], without, G)


def score_group(kind, group):
    """The rewards of one group (rewards.py composes each): sets each Rollout's reward, and the
    reward without its efficiency term (the log's time_rank_frac / memory_rank_frac)."""
    if kind == "toy":
        for r, x in zip(group, rewards.toy_rewards([r.text for r in group], target=TOY_TARGET)):
            r.reward = x
        return
    pass_rates = [[x.pass_rate for x in r.results] for r in group]
    if kind == "planner":
        cpu_s = [[x.cpu_s for x in r.results] for r in group]
        labels = [r.gate for r in group] if group[0].gate else None
        kw = dict(labels=labels, gate_penalty=GATE_PENALTY, truncation_penalty=TRUNCATION_PENALTY)
        scored = rewards.planner_reward(pass_rates, cpu_s, **kw)
        without = {"time": rewards.planner_reward(pass_rates, cpu_s, w_time=0.0, **kw)}
    else:  # coder: the trained role's own programs (M = 1)
        pass_rates = [p for (p,) in pass_rates]
        peak = [r.results[0].peak_bytes for r in group]
        scored = rewards.coder_reward(pass_rates, peak)
        without = {"memory": rewards.coder_reward(pass_rates, peak, w_mem=0.0)}
    for g, r in enumerate(group):
        r.reward = scored[g]
        r.without = {term: values[g] for term, values in without.items()}


def advantages(state, rollouts, m):
    """Phase 4: group-normalised advantages of the step's rewards (grpo.group_advantages), or None
    when no problem of the step made a group (the debugger stage)."""
    G, B = state.args.group_size, len(rollouts)
    m["groups"] = B // G
    if B == 0:
        # our choice: skip the step (logged, no update, the LR schedule not advanced) rather than
        # draw more problems, so that a step's problems stay a pure function of (step, seed).
        m.update(no_group=True, informative_groups=0, lr=state.optimizer.param_groups[0]["lr"])
        return None
    floor = state.args.adv_std_floor
    adv, stats = grpo.group_advantages([r.reward for r in rollouts], G, std_floor=floor)  # (B,)
    m.update(stats)
    # groups with a gradient
    m["informative_groups"] = round((1 - stats["zero_var_frac"]) * (B // G))
    return adv


def learn(state, samples, adv, m):
    """Phases 5-6: reference log-probs with the adapters off, then the GRPO loss over micro-batches,
    each scaled by its rows over the step's B, so the summed gradients are those of the mean over
    all B completions; clip, one optimizer step. One optimisation pass per batch (DeepSeekMath's mu
    = 1): the old log-probs are the policy's own, detached, so the ratio is exactly 1 and the clip
    is inert; a second pass would be a loop around phase 6 with old log-probs taken first."""
    args, model = state.args, state.model
    mbs = micro_batches(samples, args.micro_batch)
    B = len(adv)
    # ---- 5 reference log-probs: the frozen base = the reference policy (none when beta = 0)
    state.show("reference log-probs")
    t0 = time.time()
    model.eval()
    with torch.no_grad(), grpo.adapters_off(model):
        ref = [logprobs(state, mb) if args.beta != 0 else None for mb in mbs]
    m["t_reference"] = seconds_since(t0, state.device)
    # ---- 6 learn: forward and backward under the trained role's adapter
    state.show(f"learning: {len(mbs)} micro-batches")
    t0 = time.time()
    model.train()
    state.optimizer.zero_grad(set_to_none=True)
    stats, finite = {}, True
    with agents.acting(state.team, state.role):
        for mb, ref_lp in zip(mbs, ref):
            lp = logprobs(state, mb)  # (mb, T)
            loss, st = grpo.grpo_loss(lp, lp.detach(), ref_lp, adv[mb.rows], mb.completion_mask,
                                      beta=args.beta, clip_eps=CLIP_EPS)
            if not torch.isfinite(loss):
                finite = False
                break
            (loss * (lp.shape[0] / B)).backward()
            for k, v in st.items():
                stats[k] = stats.get(k, 0.0) + v * lp.shape[0] / B
    step_optimizer(state, finite, m)
    model.eval()
    m.update(stats)
    m["t_learn"] = seconds_since(t0, state.device)


def log(state, m):
    """Phase 7: one JSON line in metrics.jsonl, one line under the progress bar, curves.png."""
    m["t_step"] = sum(m.get(k, 0.0) for k in ("t_sample", "t_execute", "t_reference", "t_learn"))
    m["informative_per_hour"] = 3600 * m["informative_groups"] / max(m["t_step"], 1e-9)
    with open(os.path.join(state.args.out, "metrics.jsonl"), "a") as f:
        f.write(json.dumps(m) + "\n")
    state.bar.update(1)
    say(state, step_line(state, m))
    plot_curves(state.args.out)


def evaluate_held_out(state, step):
    """Phase 8: evaluate.held_out_eval of the stage's method (CG, plan information, paired with step
    0). While the Coder is frozen, direct coding and the plan controls cannot change: read back from
    step 0 (an evaluation is a large share of a CPU run)."""
    args = state.args
    method = STAGES[args.stage].get("eval_method", "planner-coder")
    show = progress(state.bar, lambda: f"held-out eval at step {step}: ")
    show(f"{len(state.eval_set)} problems")
    step0 = eval_path(args.out, 0) if step > 0 else None
    metrics, line = held_out_eval(state.team, method, state.eval_set, eval_path(args.out, step),
                                  step0_path=step0, coder_frozen=state.role != "coder",
                                  seed=args.seed, batch_size=EVAL_BATCH_SIZE, show=show)
    say(state, f"step {step} held-out:{line}" + (" (before any update)" if step == 0 else ""))
    return metrics


# -------------------------------------------------------------------------------------------------
# What the phases use: the chain, micro-batches, log-probs, the optimizer step.


def stage_chain(args):
    """((role, k, temperature), ...) of the stage: frozen roles before the trained one once per
    problem, greedy; the trained role G times at --temperature; the first role after it M times and
    later ones once, greedy with M = 1 (a plan's reward is then not blurred by the Coder's sampling
    noise), at --temperature with M > 1 (M greedy outputs would be one output M times)."""
    roles, trained = STAGES[args.stage]["chain"], STAGES[args.stage]["train"]
    downstream_t = args.temperature if args.downstream_samples > 1 else 0.0
    chain = []
    for j, role in enumerate(roles):
        after = j - roles.index(trained)
        if after < 0:
            chain.append((role, 1, 0.0))
        elif after == 0:
            chain.append((role, args.group_size, args.temperature))
        else:
            chain.append((role, args.downstream_samples if after == 1 else 1, downstream_t))
    return chain


def failing_public(state, problems, ctxs, generators):
    """The debugger stage's problems: those whose upstream program fails a PUBLIC test
    (agents.check_public), with that test's feedback in the context; hidden tests never reach a
    prompt."""
    verdicts = agents.check_public(problems, [c.get("program", "") for c in ctxs], state.team.pool)
    keep = [i for i, (ok, _) in enumerate(verdicts) if not ok]
    return ([problems[i] for i in keep], [dict(ctxs[i], feedback=verdicts[i][1]) for i in keep],
            [generators[i] for i in keep])


class MicroBatch(NamedTuple):
    """One micro-batch of the step's completions, trimmed to the columns its rows use."""
    rows: slice                    # its rows among the step's
    input_ids: torch.Tensor        # (mb, left + right) prompt left-padded, completion right-padded
    attention_mask: torch.Tensor   # (mb, left + right)
    completion_mask: torch.Tensor  # (mb, right), EOS included
    completion_start: int          # left: the longest prompt in the micro-batch


def micro_batches(samples, size):
    """The step's completions as the loss wants them (prompt left-padded, completion right-padded),
    in micro-batches of `size` sequences, each trimmed of the columns none of its sequences uses."""
    if not samples:
        return []
    input_ids = torch.cat([samples.prompt_ids, samples.completion_ids], 1)  # (b, P+T)
    attn = torch.cat([samples.prompt_mask, samples.completion_mask], 1)  # (b, P+T)
    cmask = samples.completion_mask  # (b, T), includes EOS
    P, b = samples.prompt_ids.shape[1], input_ids.shape[0]
    out = []
    for a in range(0, b, size):
        rows = slice(a, min(b, a + size))
        left = int(samples.prompt_mask[rows].sum(1).max())  # longest prompt in the micro-batch
        right = max(1, int(cmask[rows].sum(1).max()))  # longest completion
        cols = slice(P - left, P + right)
        ids, mask = input_ids[rows][:, cols], attn[rows][:, cols]  # (mb, left + right)
        out.append(MicroBatch(rows, ids, mask, cmask[rows][:, :right], left))
    return out


def logprobs(state, mb):
    """Token log-probs of a micro-batch's completions at the sampling temperature (policy and
    reference alike): the tokens were drawn from softmax(logits / T). (mb, T)"""
    return grpo.token_logprobs(state.model, mb.input_ids, mb.attention_mask, mb.completion_start,
                               chunk=LOGPROB_CHUNK, temperature=state.args.temperature)


def step_optimizer(state, finite, m):
    """Clip and step; a non-finite loss or gradient drops the step's update (logged as skipped; the
    LR schedule counts updates, so it does not advance)."""
    grad_norm = torch.nn.utils.clip_grad_norm_(state.params, GRAD_CLIP) if finite else None
    if grad_norm is None or not torch.isfinite(grad_norm):
        state.optimizer.zero_grad(set_to_none=True)
        m["skipped"] = True
        say(state, f"warning: step {m['step']}: non-finite loss or gradient, update skipped",
            file=sys.stderr)
    else:
        state.optimizer.step()
        state.scheduler.step()
        m["grad_norm"] = float(grad_norm)
    m["lr"] = state.optimizer.param_groups[0]["lr"]


def seconds_since(t0, device):
    """Wall seconds since t0, once the device has run what was queued (CUDA runs asynchronously)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.time() - t0


# -------------------------------------------------------------------------------------------------
# The training state, set-up, resume and checkpoints.


@dataclass
class State:
    """What a training run holds from one step to the next (state only; the functions act on it)."""
    args: argparse.Namespace
    team: agents.Team            # the models, their adapters, the token limits and the sandbox pool
    train_set: list
    eval_set: list
    model: object                # the base model, with the trained role's adapter
    params: list                 # the trained adapter's parameters
    optimizer: object
    scheduler: object
    device: object
    plans: dict                  # --plans-from: {problem id: (plan, truncated)}; else {}
    bar: object = None           # the progress bar (disabled off a terminal)
    show: object = None          # show(text): where the step in flight is (evaluate.progress)
    t_start: float = 0.0         # when this process began its first step, and which step that was
    first_step: int = 0

    @property
    def role(self):
        return STAGES[self.args.stage]["train"]



def set_up(args, team):
    """Seeds, data, the trained adapter (a fresh one unless --adapter gives it), optimizer and
    scheduler, the resume; returns (State, first step)."""
    role = STAGES[args.stage]["train"]
    # The LoRA init draws from the global RNGs; sampling from one generator per problem
    # (problem_generator).
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    train_set, eval_set = load_data(args)
    plans = {}
    if args.plans_from:  # one plan per training problem, or one UsageError line
        plans = {i: ps[0] for i, ps in load_given_plans(args.plans_from, train_set, 1).items()}
    model = team.model
    if role not in team.adapters:
        grpo.add_lora(model, role, r=LORA_R, alpha=LORA_ALPHA, dropout=0.0, targets=LORA_TARGETS)
        team.adapters = team.adapters | {role}
    # Only the trained adapter learns; a loaded frozen one must not (loading marks LoRA params
    # trainable).
    model.requires_grad_(False)
    params = grpo.lora_parameters(model, role)
    for p in params:
        p.requires_grad_(True)
    if args.grad_ckpt:
        grpo.enable_checkpointing(model, True)
    # AdamW over the trained adapter only; linear warm-up then constant (our choice: short runs).
    optimizer = torch.optim.AdamW(params, lr=args.lr, weight_decay=WEIGHT_DECAY, betas=(0.9, 0.99))
    warmup = max(1, args.warmup_steps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warmup))
    device = next(model.parameters()).device
    state = State(args, team, train_set, eval_set, model, params, optimizer, scheduler, device,
                  plans)
    start = resume_or_start(state)
    # disable=None: the bar only on a terminal; in a log file the step lines and a phase line a
    # minute.
    state.bar = tqdm(total=args.num_steps, initial=start, desc=f"train {args.stage}",
                     dynamic_ncols=True, disable=None)
    state.show = progress(state.bar, lambda: "")
    say(state, header(state, start))
    if importlib.util.find_spec("matplotlib") is None:
        say(state, "curves.png: not drawn without matplotlib (pip install matplotlib); "
                   "metrics.jsonl holds every figure")
    state.t_start, state.first_step = time.time(), start
    return state, start


def resume_or_start(state):
    """--resume: the last checkpoint's adapter, optimizer, scheduler and RNGs (metrics of later
    steps
    dropped: they are redone). A new run: the run directory's files of an earlier start removed.
    Then args.json and settings.json. Returns the first step to run."""
    args, start = state.args, 0
    metrics = os.path.join(args.out, "metrics.jsonl")
    if args.resume:
        last = checkpoint_dirs(args.out)[-1]  # check_args made sure there is one
        start = load_checkpoint(last, state)
        truncate_metrics(metrics, start)
        print(f"resumed from {last} (step {start})")
    os.makedirs(args.out, exist_ok=True)
    for name in ([] if args.resume else ["metrics.jsonl", "settings.json"]):
        if os.path.exists(os.path.join(args.out, name)):
            os.remove(os.path.join(args.out, name))
    # settings.json also records the sandbox's mode (not compared on --resume: the pool checks it).
    settings = {**args.settings, "sandbox": state.team.pool.mode}
    files = {"args.json": vars(args), "settings.json": settings}
    for name, content in files.items():
        with open(os.path.join(args.out, name), "w") as f:
            json.dump(content, f, indent=1)
    return start


def problem_generator(seed, step, index, device):
    """The sampling generator of training problem `index` at `step`, the same in any batch."""
    key = ((seed * 1_000_003 + step) * 1_000_003 + index) % 2**63
    return torch.Generator(device=device).manual_seed(key)


def batch_indices(step, n_problems, per_step, seed):
    """Problems of `step`: consecutive slices of a per-epoch permutation, a pure function of (step,
    seed), so a resumed run sees exactly the problems the uninterrupted run would have seen."""
    out = []
    for j in range(step * per_step, (step + 1) * per_step):
        epoch, i = divmod(j, n_problems)
        out.append(int(np.random.RandomState(seed + epoch).permutation(n_problems)[i]))
    return out


def checkpoint_dirs(out):
    root = os.path.join(out, "checkpoints")
    if not os.path.isdir(root):
        return []
    return sorted(os.path.join(root, d) for d in os.listdir(root) if d.startswith("step_"))


def save_checkpoint(state, step):
    """The training state after `step` (adapter, optimizer, scheduler, RNGs), written to a temporary
    directory and renamed into place, so a kill never leaves half a checkpoint. Every completed step
    writes one, so a stop loses at most the step in flight; kept: the newest, and the last KEEP_LAST
    of every SAVE_EVERY-th step (and the end's)."""
    args, root = state.args, os.path.join(state.args.out, "checkpoints")
    os.makedirs(root, exist_ok=True)
    final, tmp = os.path.join(root, f"step_{step:06d}"), os.path.join(root, f".tmp_step_{step:06d}")
    shutil.rmtree(tmp, ignore_errors=True)
    grpo.save_adapter(state.model, state.role, os.path.join(tmp, "adapter", state.role),
                      base_model_name_or_path=args.model)
    training_state = {"step": step, "optimizer": state.optimizer.state_dict(),
                      "scheduler": state.scheduler.state_dict(), "rng": rng_states(state.device)}
    torch.save(training_state, os.path.join(tmp, "state.pt"))
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    dirs = checkpoint_dirs(args.out)
    kept = [d for d in dirs if int(d[-6:]) % SAVE_EVERY == 0 or int(d[-6:]) == args.num_steps]
    for old in set(dirs) - set(kept[-KEEP_LAST:]) - {dirs[-1]}:
        shutil.rmtree(old, ignore_errors=True)


def load_checkpoint(path, state):
    """Restore a checkpoint's training state; returns its step. (Sampling needs no saved state: each
    problem's generator is a function of (seed, step, problem index).)"""
    grpo.load_adapter(state.model, state.role, os.path.join(path, "adapter", state.role))
    # weights_only=False: the file holds RNG states (numpy tuples) that save_checkpoint wrote.
    saved = torch.load(os.path.join(path, "state.pt"), map_location="cpu", weights_only=False)
    state.optimizer.load_state_dict(saved["optimizer"])
    state.scheduler.load_state_dict(saved["scheduler"])
    set_rng_states(saved["rng"], state.device)
    return saved["step"]


def rng_states(device):
    """The RNGs a resumed run continues: python, numpy, torch's CPU one and the run's CUDA
    device's."""
    cuda = [torch.cuda.get_rng_state(device)] if device.type == "cuda" else []
    return {"python": random.getstate(), "numpy": np.random.get_state(),
            "torch": torch.get_rng_state(), "cuda": cuda}


def set_rng_states(saved, device):
    random.setstate(saved["python"])
    np.random.set_state(saved["numpy"])
    torch.set_rng_state(saved["torch"])
    if saved["cuda"] and device.type == "cuda":
        torch.cuda.set_rng_state(saved["cuda"][0], device)


def truncate_metrics(path, step):
    """A stopped run may have logged steps after its last checkpoint: drop them, they will be
    redone."""
    if not os.path.exists(path):
        return
    with open(path) as f:
        kept = [line for line in f if line.strip() and json.loads(line)["step"] <= step]
    with open(path + ".tmp", "w") as f:
        f.writelines(kept)
    os.replace(path + ".tmp", path)


def save_final(state):
    """The final adapter, where `--stage coder` and evaluate.py look for it, and the run's
    summary."""
    args = state.args
    final = os.path.join(args.out, "final")
    tmp = final + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    grpo.save_adapter(state.model, state.role, os.path.join(tmp, state.role),
                      base_model_name_or_path=args.model)
    with open(os.path.join(tmp, "args.json"), "w") as f:
        json.dump(vars(args), f, indent=1)
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    state.bar.close()
    print(informative_summary(args.out))
    print(f"done: adapter in {os.path.join(final, state.role)}, metrics in "
          f"{os.path.join(args.out, 'metrics.jsonl')}")


def eval_path(out, step):
    return os.path.join(out, "eval", f"step_{step:06d}.jsonl")


# -------------------------------------------------------------------------------------------------
# What the run prints: its header and work, a line per step, curves.png, the closing summary.


def say(state, *lines, **kw):
    """A line under the progress bar."""
    tqdm.write(*lines, **kw)


def header(state, start):
    """The run's first lines: what trains on what, the work ahead in the reader's units, the
    sandbox's mode and what the efficiency term does."""
    args, role = state.args, state.role
    dtype = str(next(state.model.parameters()).dtype).replace("torch.", "")
    work = (f"{args.num_steps - start} steps x {args.problems_per_step} problems x "
            f"G={args.group_size} {role} samples")
    if STAGES[args.stage]["chain"][-1] != role:
        work += f" x M={args.downstream_samples} programs each"
    parts = [f"train {args.stage}: model {args.model} on {state.device} {dtype}",
             f"work: {work} (plans <= {args.plan_max_new_tokens} tokens, programs <= "
             f"{args.max_new_tokens})", f"lr {args.lr:g} beta {args.beta:g}",
             f"{len(state.train_set)} {args.bench}/{args.split} problems",
             f"held-out eval: {len(state.eval_set)} {args.eval_split} problems, every "
             f"{args.eval_every or '-'} steps", f"run directory {args.out} (args.json)"]
    parts += [f"adapter {r}={d}" for r, d in sorted(args.adapters.items()) if d]
    if args.plans_from:
        parts.append(f"the Coder's plans from {args.plans_from} (no Planner samples)")
    lines = [" | ".join(parts), sandbox.mode_line(state.team.pool.mode)]
    if STAGES[args.stage]["reward"] == "planner":
        lines.append("reward: pass rate, then CPU time against the group's median all-passing "
                     "program (time_rank_frac logs how often it reorders a group)")
    elif STAGES[args.stage]["reward"] == "coder":
        lines.append("reward: pass rate, then peak memory above the group's lowest; differences "
                     "under the 1 MiB noise floor tie (memory_rank_frac logs how often it reorders "
                     "a group)")
    if state.device.type == "cpu":
        lines.append("on a CPU: the defaults (200 steps x 4 problems x G=8) are sized for a GPU "
                     "(README, Quick start); the time left follows each step")
    return "\n".join(lines)


def step_line(state, m):
    """`step 3: reward 0.250 pass 0.125 ... | sample 12.0s execute 1.1s learn 30.2s | 45s/step,
    ~2.1h left`"""
    done = m["step"]
    # seconds a step, evals included
    pace = (time.time() - state.t_start) / max(1, done - state.first_step)
    left = f" | {pace:.0f}s/step, ~{pace * (state.args.num_steps - done) / 3600:.1f}h left"
    if m.get("no_group"):
        return f"step {done}: no problem of the batch failed its public tests: step skipped" + left
    state.bar.set_postfix(reward=f"{m['reward_mean']:.3f}", kl=f"{m.get('kl', 0):.4f}",
                          zv=f"{m['zero_var_frac']:.2f}")
    nan = float("nan")
    return (f"step {done}: reward {m['reward_mean']:.3f} pass {m.get('pass_rate', nan):.3f} "
            f"zero-var {m['zero_var_frac']:.2f} kl {m.get('kl', 0):.4f} "
            f"clip {m.get('clip_frac', 0):.3f} len {m.get('completion_len', 0):.0f} "
            f"gnorm {m.get('grad_norm', nan):.3f} | sample {m['t_sample']:.1f}s "
            f"execute {m['t_execute']:.1f}s learn {m['t_learn']:.1f}s" + left)


def plot_curves(run_dir):
    """curves.png in the run directory: reward, pass rate, KL and held-out CG over steps, redrawn
    after every step from metrics.jsonl. Needs matplotlib (an optional extra); without it,
    nothing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    keys = [("reward_mean", "reward"), ("pass_rate", "pass rate"), ("kl", "KL"),
            ("eval_cg", "held-out CG")]
    fig, axes = plt.subplots(1, len(keys), figsize=(4 * len(keys), 3))
    for ax, (key, title) in zip(axes, keys):
        points = [(r["step"], r[key]) for r in rows if key in r]
        if key == "eval_cg":
            points = [(0, r["eval_cg_start"]) for r in rows if "eval_cg_start" in r] + points
        if points:
            ax.plot(*zip(*points), marker="o")
        ax.set_title(title)
        ax.set_xlabel("step")
    fig.tight_layout()
    fig.savefig(os.path.join(run_dir, "curves.png"))
    plt.close(fig)


def informative_summary(run_dir):
    """One line over a run's metrics.jsonl (resumed parts included): informative groups / all
    groups, and per hour of step time (a group whose rewards all tie gives no policy gradient)."""
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        rows = [m for m in (json.loads(line) for line in f if line.strip()) if "t_step" in m]
    groups = sum(m["groups"] for m in rows)
    informative = sum(m["informative_groups"] for m in rows)
    hours = sum(m["t_step"] for m in rows) / 3600
    return (f"informative groups: {informative} of {groups} over {len(rows)} steps, "
            f"{informative / max(hours, 1e-9):.1f} per hour of step time")


# -------------------------------------------------------------------------------------------------
# Inputs: the data, the checks made before anything slow, the command line.


def load_data(args):
    """The training problems (judged_in_parent: HumanEval's helper checks decide inside the
    candidate's process, where an always-equal object can pass them, so they are never a reward) and
    the held-out ones; one UsageError line if absent."""
    try:
        train_set = data.load(args.bench, path=args.data, split=args.split, limit=args.limit,
                              **args.bench_kwargs)
        eval_set = []
        if args.eval_every > 0 and args.eval_limit > 0:
            eval_set = data.load(args.bench, path=args.data, split=args.eval_split,
                                 limit=args.eval_limit, **args.bench_kwargs)
    except (FileNotFoundError, ValueError, KeyError) as e:
        raise UsageError(str(e)) from None
    train_set = judged_in_parent(train_set)
    # Training never reads a held-out reference solution, nor so a plan written from one.
    eval_set = [dataclasses.replace(p, reference="") for p in eval_set]
    if not train_set:
        raise UsageError(f"no training problems in {args.bench} split {args.split!r}")
    return train_set, eval_set


def judged_in_parent(problems):
    """The problems whose every test is judged in the sandbox's parent process (HumanEval's helper
    checks are not: data.HUMANEVAL_HELPER)."""
    return [p for p in problems if not any(data.HUMANEVAL_HELPER in str(t) for t in p.hidden_tests)]


# Flags a resumed run may change: how long it runs, where and how often it reports, and memory for
# time (--micro-batch, --grad-ckpt: the same gradient up to summation order), not what it learns.
# Every other setting must equal the checkpointed run's (settings.json); for --plans-from that is
# the file's content (its digest), wherever it lies.
RESUME_MAY_CHANGE = {"resume", "num_steps", "out", "workers", "device", "eval_every", "eval_limit",
                     "adapter", "bench_kwargs", "micro_batch", "grad_ckpt", "allow_unisolated",
                     "allow_uncounted", "plans_from"}


def check_args(args):
    """Everything that can be wrong, checked before anything slow: one UsageError line each."""
    if not args.stage:
        raise UsageError("--stage is required (planner, coder, direct, retriever, debugger or "
                         "toy); see --help")
    held_out = held_out_use(args)
    if held_out and not args.allow_held_out_split:
        raise UsageError(f"{held_out}; use another split, or pass --allow-held-out-split to do it "
                         "anyway")
    if agents.resolve_dtype(args.dtype, args.device) == torch.float16:
        # A LoRA gradient through fp16 activations underflows without a loss scaler; there is none
        # here.
        raise UsageError(f"--dtype {args.dtype} gives float16 on {args.device}: training in fp16 "
                         "needs loss scaling, which train.py does not do; use bfloat16 or float32")
    if args.plans_from and args.stage != "coder":
        raise UsageError(f"--plans-from is read by --stage coder only (not {args.stage})")
    if args.plans_from and not os.path.isfile(args.plans_from):
        raise UsageError(f"--plans-from {args.plans_from}: no such file; pass a <row>.jsonl with "
                         "plans (evaluate.py --method reference-plan --split train)")
    keys = [k for k in vars(args) if k not in RESUME_MAY_CHANGE]
    args.settings = check_inputs(args, args.out, keys, "checkpoints" if args.resume else "")
    if args.stage == "coder" and "planner" not in args.adapters and not args.plans_from:
        args.adapters["planner"] = os.path.join("runs", "planner", "final", "planner")
        if not os.path.isdir(args.adapters["planner"]):
            raise UsageError(f"stage coder needs the trained Planner: no adapter at "
                             f"{args.adapters['planner']}; run --stage planner first, or pass "
                             "--adapter planner=DIR (--adapter planner=none for the base Planner)")
    if args.resume and not checkpoint_dirs(args.out):
        raise UsageError(f"--resume: no checkpoint in {args.out} (nothing to continue); drop "
                         "--resume to start a new run there")
    if not args.resume and checkpoint_dirs(args.out):
        raise UsageError(f"{args.out} already holds checkpoints: pass --resume to continue, or a "
                         "new --out")


def held_out_use(args):
    """Why this run would train on held-out problems or choose its checkpoints with test or training
    problems ("" when it would not): only a split named "train" is trained on, on every
    benchmark."""
    if args.stage == "toy":  # it reads only the prompts' characters
        return ""
    if args.split != "train":
        return (f"--split {args.split} holds held-out problems (only a split named train is "
                "trained on)")
    if args.eval_every > 0 and args.eval_split in ("test", "train", "all"):
        return (f"--eval-split {args.eval_split} would choose checkpoints on test or training "
                "problems")
    return ""


def start(args):
    """The checks that cost nothing, then the sandbox pool and the team, then training. The pool's
    fork-server workers start before the model (small, clean processes); the `with` shuts them down
    however training ends."""
    check_args(args)
    reward = STAGES[args.stage]["reward"]
    try:
        with open_team(args, need_cpu=reward == "planner", need_memory=reward == "coder") as team:
            train(args, team)
    except OSError as e:  # disk full, the run directory made read-only during the run, ...
        raise UsageError(f"I/O error: {e} (checkpoints of this run are in {args.out}/checkpoints; "
                         "continue with --resume)") from None


def main(argv=None):
    args = get_args(argv)
    words = list(sys.argv[1:] if argv is None else argv)

    def stopped():
        if checkpoint_dirs(args.out):
            again = shlex.join(words + ([] if args.resume else ["--resume"]))
            return (f"every completed step is kept, the last in {checkpoint_dirs(args.out)[-1]}; "
                    f"resume with: python train.py {again}")
        again = shlex.join([w for w in words if w != "--resume"])
        return ("before the first checkpoint (nothing to resume); start again with: python "
                f"train.py {again}")

    rc = cli(start, args, stopped)
    if rc:
        sys.exit(rc)


if __name__ == "__main__":
    main()
