"""Benchmark: one WHOLE Planner-stage GRPO step, train.py vs TRL's GRPOTrainer + PEFT, side by side, with where each
spends its time.

What it is: both sides run the same step on the same MBPP train problems: the Planner (a LoRA
adapter) samples G plans per problem at the training temperature, the frozen Coder (the bare base:
the adapter switched off) writes one greedy program per plan, every program runs on its problem's
hidden tests in our sandbox (sandbox.py, the same jobs and repeats), train.score_group scores each
plan (pass rate, CPU-time bonus, the format gate), and one GRPO update follows (reference log-probs
with the adapter off, policy forward + backward in micro-batches, clip, AdamW).
  - ours: train.py's own main() (exactly `python train.py --stage planner ...`, printed below) runs for --steps
    steps in a fresh subprocess, with wall-clock timers wrapped around module functions (agents.prefill /
    decode_n_tokens / sample, train.logprobs, SandboxPool.run, Tensor.backward, clip_grad_norm_, the optimizer
    step); train.py is not changed. Its metrics.jsonl (t_sample, t_execute, t_reference, t_learn) is read back and
    printed beside the finer figures.
  - TRL: GRPOTrainer with its own generation (HF generate, num_generations=G, max_completion_length = the plan
    budget, the same temperature, top-p 1, the Planner's stop strings), PEFT LoRA with the same r / alpha /
    dropout / targets, the same beta, clip, learning rate, warm-up, AdamW betas and weight decay, grad clip,
    gradient checkpointing (non-reentrant) and micro-batch (per_device_train_batch_size = train.py's
    --micro-batch, gradient accumulation over the step's rows, so one generation and one update per step), loss
    type "grpo" (DeepSeekMath, as ours). Its prompts are our agents.planner_prompt strings (plain strings: TRL
    tokenizes them as they are and applies no chat template). Its reward function does what our Planner stage
    does: the Coder (the same PEFT model under `disable_adapter()`, HF generate, greedy, <= the program budget,
    in one batch of all plans, inside TRL's own unwrap_model_for_generation) writes a program per plan, which runs
    in our sandbox and is scored by train.score_group (rewards.planner_reward).
Both sides load the model with agents.load_model and read every setting they share from train.py
(its defaults and constants: one source of truth), except the flags below. A step is timed from its
start to the optimizer's update (ours: train.step_problems -> the end of train.learn; TRL:
on_step_begin -> on_step_end); logging, checkpoints and held-out evaluation (off) are outside it. We
report the median step after --warmup warm-up step(s), with its breakdown: generation split into
prefill (the first forward of each generate call) and decode (the rest of it: the token loop,
sampling, stop checks), sandbox, reference log-probs, policy forward (with grad), backward
(checkpoint recompute included), optimizer (clip + step).

What it is not: a measure of training quality, or a comparison at equal samples: each side draws its own plans (the
same problems, temperature and budgets), so their lengths differ, and batch decoding runs until the longest row of
the batch stops. The tables therefore also give decode steps and mean tokens per generation, and seconds per decode
step. Where the two sides still differ in what they compute (not in how fast), it is listed at the end of the output.

Needs TRL, which is not a project dependency; install it without touching torch:
       echo torch==2.13.0 > /tmp/c.txt && .venv/bin/pip install trl -c /tmp/c.txt      (TRL 1.16 was measured)
Run (the documented CPU recipe: 4 problems x G=8, plans <= 128, programs <= 256 tokens; --dtype defaults to bfloat16
where the CPU computes it natively, else float32; ~1 h on a 2-core CPU in float32 for --steps 2, mostly TRL):
       .venv/bin/python tests/bench/bench_whole_step.py          (the 0.5B from $CORECODE_MODEL or the get-model cache)
       .venv/bin/python tests/bench/bench_whole_step.py --model tiny     (the tiny random model: minutes, a smoke test)
Ends with: RESULT whole_step_vs_trl=<ours/trl s per step> ours_step_s=... trl_step_s=... sample_vs_trl=...
learn_vs_trl=... model=... dtype=...    (sample = Planner + Coder generation; learn = reference + policy forward +
backward + optimizer)
"""
import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, ROOT)

# ----------------------------------------------------------------------------------------------------------------
# config
parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
# what to compare
parser.add_argument("--model", default=None, help="model dir, or 'tiny' for the tiny random model (default: "
                    "$CORECODE_MODEL, else ~/.cache/corecode/models/qwen2.5-coder-0.5b-instruct)")
parser.add_argument("--dtype", default=None, choices=["float32", "bfloat16"],
                    help="weights dtype on both sides (default: bfloat16 where the CPU computes it natively "
                         "(agents.cpu_has_native_bf16) or on CUDA, else float32)")
parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
parser.add_argument("--sides", default="ours,trl", help="comma list from: ours, trl")
parser.add_argument("--data", default=None, help="mbpp.jsonl (default: data.py's: $CORECODE_MBPP, "
                                                 "../shared/data/mbpp.jsonl, the cache)")
# the step's shape: train.py's documented CPU recipe (README, "What training does")
parser.add_argument("--problems", type=int, default=4, help="problems (groups) per step")
parser.add_argument("--group-size", type=int, default=8, help="G: plans per problem")
parser.add_argument("--plan-max-new-tokens", type=int, default=128, help="the Planner's token budget")
parser.add_argument("--max-new-tokens", type=int, default=256, help="the Coder's token budget")
parser.add_argument("--no-grad-ckpt", action="store_true", help="gradient checkpointing off on both sides "
                                                                 "(default: on on both; train.py's own default is "
                                                                 "off on a CPU, so ours passes the flag explicitly)")
# timing
parser.add_argument("--steps", type=int, default=2, help="steps per side, warm-up included")
parser.add_argument("--warmup", type=int, default=1, help="first steps left out of the median")
parser.add_argument("--threads", type=int, default=0, help="torch CPU threads in each worker (0: torch's default)")
parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)  # internal: ours | trl
args = parser.parse_args()


# ----------------------------------------------------------------------------------------------------------------
# timers shared by both workers: wall seconds per phase, one dict per step


def now():
    import torch

    if args.device == "cuda":
        torch.cuda.synchronize()  # a phase's queued GPU work is billed to that phase
    return time.perf_counter()


class Phases:
    """Accumulates seconds (and counts) per key within the current step; a finished step is one dict in `steps`."""

    def __init__(self):
        self.steps, self.cur, self.t0 = [], None, None
        self.gen = None  # the generate call in flight: {"role": ..., "first": bool}, or None

    def start_step(self):
        self.cur, self.t0, self.c0 = defaultdict(float), now(), time.process_time()

    def end_step(self):
        self.cur["step"] = now() - self.t0
        # CPU seconds of this process (all its threads; the sandbox's processes not included): the work done,
        # which other jobs on a shared machine slow down far less than the wall time
        self.cur["step_cpu"] = time.process_time() - self.c0
        self.steps.append(dict(self.cur))
        self.cur = None

    def add(self, key, value):
        if self.cur is not None:  # outside a step (set-up, logging) nothing is counted
            self.cur[key] += value

    def wrap(self, fn, key):
        """fn, timed under `key` (a string, or a callable of the call's (args, kwargs) that returns one)."""

        def timed(*a, **kw):
            t0 = now()
            try:
                return fn(*a, **kw)
            finally:
                self.add(key(a, kw) if callable(key) else key, now() - t0)

        return timed


PH = Phases()


def time_learning_phases():
    """Both sides: backward (Tensor.backward: the one call each loss goes through, checkpoint recompute included),
    the optimizer (clip_grad_norm_ + the AdamW step, by torch's global step hooks)."""
    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    torch.Tensor.backward = PH.wrap(torch.Tensor.backward, "backward")
    torch.nn.utils.clip_grad_norm_ = PH.wrap(torch.nn.utils.clip_grad_norm_, "optimizer")
    started = {}
    register_optimizer_step_pre_hook(lambda opt, a, kw: started.__setitem__("t", now()))
    register_optimizer_step_post_hook(lambda opt, a, kw: PH.add("optimizer", now() - started.pop("t")))


def count_tokens(role, completion_mask_rows, steps):
    """Decode steps run (the batch's longest row) and completion tokens per row (EOS included), summed per step."""
    PH.add(role + "_steps", steps)
    PH.add(role + "_rows", len(completion_mask_rows))
    PH.add(role + "_tokens", sum(completion_mask_rows))


# ----------------------------------------------------------------------------------------------------------------
# workers: each runs --steps steps and prints one JSON line


def train_defaults():
    """train.py's defaults for every setting this benchmark does not set (one source of truth for both sides)."""
    import train

    return train.get_args(["--stage", "planner"])


def recipe_argv(model, dtype, out):
    """train.py's command line of this benchmark's step."""
    argv = ["--stage", "planner", "--model", model, "--dtype", dtype, "--device", args.device,
            "--num-steps", str(args.steps), "--problems-per-step", str(args.problems),
            "--group-size", str(args.group_size), "--plan-max-new-tokens", str(args.plan_max_new_tokens),
            "--max-new-tokens", str(args.max_new_tokens), "--eval-every", "0", "--out", out]
    if args.data:
        argv += ["--data", args.data]
    argv += ["--no-grad-ckpt" if args.no_grad_ckpt else "--grad-ckpt"]
    return argv


def worker_ours(model, dtype):
    """train.main in this process, timers wrapped around the functions it calls (train.py unchanged)."""
    import torch

    import agents
    import sandbox
    import train

    roles = train.STAGES["planner"]["chain"]  # ("planner", "coder"): the order of agents.sample calls in a step
    calls = [0]

    def role_now():
        return roles[min(calls[0], len(roles) - 1)]

    sample = agents.sample

    def sample_timed(*a, **kw):
        t0 = now()
        s = sample(*a, **kw)
        role = role_now()
        PH.add(role + "_total", now() - t0)
        count_tokens(role, s.completion_mask.sum(1).tolist(), s.completion_ids.shape[1])
        calls[0] += 1
        return s

    agents.sample = sample_timed
    agents.prefill = PH.wrap(agents.prefill, lambda a, kw: role_now() + "_prefill")
    agents.decode_n_tokens = PH.wrap(agents.decode_n_tokens, lambda a, kw: role_now() + "_decode")
    sandbox.SandboxPool.run = PH.wrap(sandbox.SandboxPool.run, "execute")
    # train.logprobs: the reference (no grad) and the policy forward (grad) of every micro-batch
    train.logprobs = PH.wrap(train.logprobs,
                             lambda a, kw: "policy_forward" if torch.is_grad_enabled() else "reference")
    time_learning_phases()
    # A step: from choosing its problems (train.step_problems) to the end of its update
    # (train.learn).
    step_problems, learn = train.step_problems, train.learn

    def step_problems_timed(*a, **kw):
        calls[0] = 0
        PH.start_step()
        return step_problems(*a, **kw)

    def learn_timed(*a, **kw):
        learn(*a, **kw)
        PH.end_step()

    train.step_problems, train.learn = step_problems_timed, learn_timed
    out = tempfile.mkdtemp(prefix="bench-whole-step-")
    argv = recipe_argv(model, dtype, out)
    train.main(argv)
    with open(os.path.join(out, "metrics.jsonl")) as f:
        metrics = [json.loads(line) for line in f if line.strip()]
    keep = ("step", "t_sample", "t_execute", "t_reference", "t_learn", "reward_mean", "pass_rate", "completion_len",
            "zero_var_frac", "plan_ok_frac")
    return {"steps": PH.steps, "metrics": [{k: m[k] for k in keep if k in m} for m in metrics],
            "command": "python train.py " + " ".join(argv)}


def worker_trl(model_dir, dtype):
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import GenerationConfig, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer
    from trl.models.utils import unwrap_model_for_generation

    import agents
    import data
    import sandbox
    import train

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    d = train_defaults()
    G, P = args.group_size, args.problems
    # The same problems as train.py's steps: its training set and its batch order (train.batch_indices).
    problems = train.judged_in_parent(data.load("mbpp", path=args.data, split=d.split))
    # The sandbox's fork-server workers start before the model (small, clean processes: sandbox.py says why).
    pool = sandbox.SandboxPool(workers=d.workers)
    pool.run = PH.wrap(pool.run, "execute")
    model, tok = agents.load_model(model_dir, device=args.device, dtype=dtype)
    rows = [i for s in range(args.steps) for i in train.batch_indices(s, len(problems), P, d.seed)]
    prompts = [agents.ROLES["planner"]["prompt"](tok, problems[i], {}) for i in rows]
    # TRL tokenizes a plain-string prompt with add_special_tokens=True; ours with False: the same ids when the
    # tokenizer adds nothing (Qwen2's does not); recorded so that a difference would show.
    same_ids = tok(prompts[0])["input_ids"] == tok(prompts[0], add_special_tokens=False)["input_ids"]
    dataset = Dataset.from_dict({"prompt": prompts, "idx": rows})
    eos = agents.stop_token_ids(model, tok)
    stops = list(agents.PLANNER_STOP)
    holder = {}

    def generate_timed(role, generate):
        """model.generate with the tokenizer passed (HF's stop strings need it), split into prefill (its first
        forward, timed by the hooks below) and decode (the rest of the call)."""

        def gen(*a, **kw):
            t0 = now()
            PH.gen = call = {"role": role, "first": True, "prefill": 0.0}
            try:
                out = generate(*a, tokenizer=tok, **kw)
            finally:
                PH.gen = None
            PH.add(role + "_prefill", call["prefill"])
            PH.add(role + "_decode", now() - t0 - call["prefill"])
            new = out[:, kw["input_ids"].shape[1]:]  # (B, T) generated ids, pad after a row's end
            ended = torch.isin(new, torch.tensor(eos + [tok.pad_token_id], device=new.device))  # (B, T)
            lens = torch.where(ended.any(1), ended.int().argmax(1) + 1, new.shape[1])  # (B,) incl. the EOS
            count_tokens(role, lens.tolist(), new.shape[1])
            return out

        return gen

    def reward_planner_stage(prompts, completions, completion_ids, idx, **kw):
        """What train.py's Planner stage does after sampling: plan text (as ours cuts it), Coder program (greedy, the
        adapter off), sandbox on the hidden tests, train.score_group per group (one group = G
        consecutive rows)."""
        trainer = holder["trainer"]
        probs = [problems[i] for i in idx]
        plans, truncated = [], []
        for ids, p in zip(completion_ids, probs):
            ids = list(ids)
            while ids and ids[-1] == tok.pad_token_id and tok.pad_token_id not in eos:
                ids.pop()  # rows ended by a stop string are padded (pad is an EOS id on Qwen, not on the tiny model)
            keep = len(ids) - (1 if ids and ids[-1] in eos else 0)
            text = tok.decode(ids[:keep])
            hits = [i for i in (text.find(s) for s in stops) if i >= 0]
            # Truncated as agents' _decode_texts says it.
            truncated.append(keep == args.plan_max_new_tokens and not hits)
            plan_text = text[:min(hits)] if hits else text
            plans.append(agents.ROLES["planner"].parse(plan_text, p, {})["plan"])
        # The Coder: one greedy program per plan, all plans in one batch (as train.sample does).
        t0 = now()
        coder_prompts = [agents.ROLES["coder"].prompt(tok, p, {"plan": plan})
                         for p, plan in zip(probs, plans)]
        enc = tok(coder_prompts, padding=True, padding_side="left", add_special_tokens=False, return_tensors="pt")
        enc = {k: v.to(trainer.model.device) for k, v in enc.items()}
        cfg = GenerationConfig(max_new_tokens=args.max_new_tokens, do_sample=False, eos_token_id=eos,
                               pad_token_id=tok.pad_token_id)
        with unwrap_model_for_generation(trainer.model_wrapped, trainer.accelerator,
                                         gradient_checkpointing_kwargs=trainer.args.gradient_checkpointing_kwargs) \
                as unwrapped, torch.no_grad(), unwrapped.disable_adapter():
            # unwrapped is trainer.model (one process, no wrapper): its own generate, not the Planner's timed one
            out = generate_timed("coder", holder["generate"])(**enc, generation_config=cfg)
        texts = tok.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
        programs = [agents.ROLES["coder"].parse(t, p, {})["program"] for t, p in zip(texts, probs)]
        PH.add("coder_total", now() - t0)
        results = pool.run([agents.problem_job(p, prog, p.hidden_tests, repeat=train.TIMING_REPEATS)
                            for p, prog in zip(probs, programs)])
        rollouts = [train.Rollout(p, "", 0, plan, cut, [prog], [res],
                                  gate=agents.gate_label(plan, truncated=cut, problem=p))
                    for p, plan, cut, prog, res in zip(probs, plans, truncated, programs, results)]
        for g in range(0, len(rollouts), G):
            train.score_group("planner", rollouts[g:g + G])
        return [r.reward for r in rollouts]

    class StepTimer(TrainerCallback):
        """A step: on_step_begin (before TRL's generation, in its first micro-batch) -> on_step_end (after the
        optimizer step, the scheduler and zero_grad)."""

        def on_step_begin(self, a, state, control, **kw):
            PH.start_step()

        def on_step_end(self, a, state, control, **kw):
            PH.end_step()

    B = P * G
    bf16 = dtype == "bfloat16"
    cfg = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="bench-whole-step-trl-"), report_to=[], save_strategy="no",
        logging_steps=10**6, disable_tqdm=True, seed=d.seed, use_cpu=args.device == "cpu", bf16=bf16, fp16=False,
        dataloader_num_workers=0, shuffle_dataset=False, max_steps=args.steps,
        # the step: B rows in micro-batches of train.py's --micro-batch, one generation and one update per step
        per_device_train_batch_size=d.micro_batch, gradient_accumulation_steps=B // d.micro_batch,
        num_generations=G, max_completion_length=args.plan_max_new_tokens, temperature=d.temperature,
        top_p=1.0, top_k=0, generation_kwargs={"stop_strings": stops},
        # the objective: DeepSeekMath's loss, beta, clip, one pass (old log-probs = the current ones, as ours)
        loss_type="grpo", beta=d.beta, epsilon=train.CLIP_EPS, num_iterations=1,
        scale_rewards="group",
        # the optimizer: train.py's AdamW, warm-up then constant, clip
        learning_rate=d.lr, weight_decay=train.WEIGHT_DECAY, adam_beta1=0.9, adam_beta2=0.99,
        max_grad_norm=train.GRAD_CLIP,
        lr_scheduler_type="constant_with_warmup", warmup_steps=d.warmup_steps,
        gradient_checkpointing=not args.no_grad_ckpt, gradient_checkpointing_kwargs={"use_reentrant": False},
    )
    peft_cfg = LoraConfig(r=train.LORA_R, lora_alpha=train.LORA_ALPHA, lora_dropout=0.0,
                          target_modules=list(train.LORA_TARGETS), task_type="CAUSAL_LM")
    trainer = GRPOTrainer(model=model, reward_funcs=reward_planner_stage, args=cfg, train_dataset=dataset,
                          processing_class=tok, peft_config=peft_cfg, callbacks=[StepTimer()])
    holder["trainer"] = trainer
    # Timers. The Planner: TRL's _generate (tokenize, HF generate, decode) and, inside it, model.generate; the first
    # forward of every generate call is its prefill (a forward hook on the HF model under PEFT).
    trainer._generate = PH.wrap(trainer._generate, "planner_total")
    holder["generate"] = trainer.model.generate
    trainer.model.generate = generate_timed("planner", holder["generate"])
    hf_model = trainer.model.get_base_model()
    started = {}

    def pre(module, a):
        if PH.gen is not None and PH.gen["first"]:  # clocks only around a prefill (on CUDA a clock is a sync)
            started["t"] = now()

    def post(module, a, out):
        if PH.gen is not None and PH.gen["first"] and "t" in started:
            PH.gen["first"], PH.gen["prefill"] = False, now() - started.pop("t")

    hf_model.register_forward_pre_hook(pre)
    hf_model.register_forward_hook(post)
    # Log-probs: no grad = the reference (with one pass TRL computes no old log-probs); grad = the policy forward.
    trainer._get_per_token_logps_and_entropies = PH.wrap(
        trainer._get_per_token_logps_and_entropies,
        lambda a, kw: "policy_forward" if torch.is_grad_enabled() else "reference")
    time_learning_phases()
    try:
        trainer.train()
    finally:
        pool.close()
    return {"steps": PH.steps, "prompt_ids_equal": same_ids}


WORKERS = {"ours": worker_ours, "trl": worker_trl}


def run_worker(model, dtype):
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    out = WORKERS[args.worker](model, dtype)
    out["threads"] = torch.get_num_threads()
    print("BENCH " + json.dumps(out), flush=True)


# ----------------------------------------------------------------------------------------------------------------
# driver: one fresh subprocess per side, then the tables


ROWS = (  # (label, key or a function of the step dict)
    ("planner generation", "planner_total"),
    ("  prefill", "planner_prefill"),
    ("  decode", "planner_decode"),
    ("coder generation", "coder_total"),
    ("  prefill", "coder_prefill"),
    ("  decode", "coder_decode"),
    ("sandbox execution", "execute"),
    ("reference log-probs", "reference"),
    ("policy forward", "policy_forward"),
    ("backward", "backward"),
    ("optimizer (clip+step)", "optimizer"),
)
SAMPLE_KEYS = ("planner_total", "coder_total")
LEARN_KEYS = ("reference", "policy_forward", "backward", "optimizer")
TIMED_KEYS = SAMPLE_KEYS + ("execute",) + LEARN_KEYS


def median_step(steps):
    """The step whose total is the median (lower median for an even count) of the measured steps, whole: its
    parts add up to it, which per-key medians would not."""
    measured = steps[args.warmup:] or steps[-1:]
    target = statistics.median_low([s["step"] for s in measured])
    return next(s for s in measured if s["step"] == target), len(measured)


def derived(s):
    s = dict(s)
    s["other"] = s["step"] - sum(s.get(k, 0.0) for k in TIMED_KEYS)
    s["sample"] = sum(s.get(k, 0.0) for k in SAMPLE_KEYS)
    s["learn"] = sum(s.get(k, 0.0) for k in LEARN_KEYS)
    return s


def side_table(name, s):
    print(f"\n{name}: one step, {s['step']:.2f} s ({s['step_cpu']:.1f} CPU s in this process)")
    print(f"  {'phase':<24} {'seconds':>9} {'share':>7}")
    for label, key in ROWS + (("other (unattributed)", "other"),):
        v = s.get(key, 0.0)
        print(f"  {label:<24} {v:9.2f} {100 * v / s['step']:6.1f}%")
    for role in ("planner", "coder"):
        steps, rows = s.get(role + "_steps", 0), max(1, s.get(role + "_rows", 0))
        if steps:
            print(f"  {role}: {int(rows)} rows, {int(steps)} decode steps, {s[role + '_tokens'] / rows:.1f} tokens/row "
                  f"(EOS included), {s.get(role + '_decode', 0) / steps * 1000:.0f} ms per decode step")


def main():
    sys.path.insert(0, os.path.dirname(HERE))
    import agents
    import train
    from tiny_model import build_tiny_model, real_model_dir

    sides = [x for x in args.sides.split(",") if x]
    bad = [x for x in sides if x not in WORKERS]
    if bad or not sides:
        print(f"error: --sides takes a comma list from ours, trl; got {args.sides!r}", file=sys.stderr)
        sys.exit(2)
    if "trl" in sides and importlib.util.find_spec("trl") is None:
        print("TRL is not installed (see this script's docstring to install it, or run --sides ours): no comparison")
        sys.exit(1)
    if args.model == "tiny":
        model = build_tiny_model(os.path.join(tempfile.mkdtemp(), "tiny"))
    elif args.model:
        model = args.model
    else:
        model, where = real_model_dir()
        if not model:
            print(f"error: {where}; or pass --model DIR (--model tiny: the tiny random model)", file=sys.stderr)
            sys.exit(2)
    dtype = args.dtype or ("bfloat16" if args.device == "cuda" or agents.cpu_has_native_bf16() else "float32")
    label = "tiny" if args.model == "tiny" else os.path.basename(model.rstrip("/"))
    d = train_defaults()
    print(f"whole Planner-stage GRPO step: {label} {dtype} on {args.device} | {args.problems} problems x "
          f"G={args.group_size} plans <= {args.plan_max_new_tokens} tokens (T={d.temperature}), 1 greedy program per "
          f"plan <= {args.max_new_tokens} tokens | LoRA r={train.LORA_R} "
          f"alpha={train.LORA_ALPHA:g} | "
          f"beta={d.beta} "
          f"lr={d.lr:g} micro-batch {d.micro_batch} | grad ckpt {'off' if args.no_grad_ckpt else 'on'} | "
          f"{args.steps} steps per side, median after {args.warmup} warm-up | threads {args.threads or 'default'}")
    results, logs = {}, tempfile.mkdtemp(prefix="bench-whole-step-logs-")
    for side in sides:
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", side]
        for key in ("model", "dtype", "device", "data", "problems", "group_size", "plan_max_new_tokens",
                    "max_new_tokens", "steps", "threads"):
            value = {"model": model, "dtype": dtype}.get(key, getattr(args, key))
            if value is not None:
                cmd += ["--" + key.replace("_", "-"), str(value)]
        if args.no_grad_ckpt:
            cmd.append("--no-grad-ckpt")
        t0 = time.time()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        log = os.path.join(logs, side + ".log")  # the worker's own output (warnings, train.py's lines)
        with open(log, "w") as f:
            f.write(proc.stdout + proc.stderr)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("BENCH ")]
        if proc.returncode != 0 or not lines:
            print(f"{side} failed (rc={proc.returncode}, log {log}):\n{(proc.stderr or proc.stdout)[-3000:]}")
            continue
        r = json.loads(lines[-1][6:])
        r["median"], r["measured"] = median_step(r["steps"])
        r["median"] = derived(r["median"])
        results[side] = r
        print(f"\n[{side}: {time.time() - t0:.0f} s in all, {len(r['steps'])} steps: "
              + ", ".join(f"{s['step']:.1f}" for s in r["steps"]) + f" s; {r['threads']} torch threads; log {log}]")
        if side == "ours":
            print(f"  = {r['command']}")
            for m in r["metrics"]:
                print("  metrics.jsonl: " + " ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                                                     for k, v in m.items()))
        elif not r.get("prompt_ids_equal", True):
            print("  note: TRL's tokenization of the prompt strings adds special tokens that ours does not")
        side_table(side, r["median"])
    if "ours" in results and "trl" in results:
        o, t = results["ours"]["median"], results["trl"]["median"]
        print(f"\nside by side (seconds of the median step; ours/trl):")
        print(f"  {'phase':<24} {'ours':>9} {'trl':>9} {'ours/trl':>9}")
        for lab, key in ROWS + (("other (unattributed)", "other"), ("sample (gen. both roles)", "sample"),
                                ("learn (ref+fwd+bwd+opt)", "learn"), ("WHOLE STEP", "step"),
                                ("step CPU s (process)", "step_cpu")):
            a, b = o.get(key, 0.0), t.get(key, 0.0)
            print(f"  {lab:<24} {a:9.2f} {b:9.2f} {a / b if b else float('nan'):9.3f}")
        print("\nnot identical between the sides (what is computed, not how fast): each side samples its own plans "
              "(lengths differ; see decode steps above); TRL prefills every row (B = problems x G) where ours "
              "prefills each problem once; TRL's micro-batches mix groups (it shuffles the rows) where ours are one "
              "group each; advantages: ours divide by max(std, --adv-std-floor), TRL by std + 1e-4; HF's stop strings "
              "match the end of the tokens, ours the decoded tail (the same strings)")
        ratio = o["step"] / t["step"]
        print(f"RESULT whole_step_vs_trl={ratio:.3f} ours_step_s={o['step']:.2f} trl_step_s={t['step']:.2f} "
              f"sample_vs_trl={o['sample'] / t['sample']:.3f} learn_vs_trl={o['learn'] / t['learn']:.3f} "
              f"execute_vs_trl={o['execute'] / t['execute'] if t.get('execute') else float('nan'):.3f} "
              f"step_cpu_vs_trl={o['step_cpu'] / t['step_cpu']:.3f} "
              f"model={label} dtype={dtype} device={args.device} steps_measured="
              f"{min(results['ours']['measured'], results['trl']['measured'])}")
    elif results:
        side, r = next(iter(results.items()))
        print(f"RESULT whole_step_vs_trl=nan {side}_step_s={r['median']['step']:.2f} model={label} dtype={dtype} "
              f"device={args.device}")
    else:
        print(f"RESULT whole_step_vs_trl=nan error=no_side_ran model={label} dtype={dtype}")
        sys.exit(1)


if __name__ == "__main__":
    if args.worker:
        run_worker(args.model, args.dtype)
    else:
        main()
