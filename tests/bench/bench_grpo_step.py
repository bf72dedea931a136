"""Benchmark: one GRPO optimisation step, grpo.py vs TRL's GRPOTrainer with PEFT LoRA, side by side.

What it is: for each model (the tiny random Qwen2 of tests/tiny_model.py, and the 0.5B Qwen2.5-Coder when it has
been built), each implementation runs in a fresh subprocess on the SAME fixed prompts and completions (sampling is
excluded: TRL is driven through its `rollout_func` hook, which returns our fixed token ids), the same group size,
completion lengths, rewards, LoRA rank/alpha/targets, beta, clip, learning rate, and gradient checkpointing on in
both. A step = reference log-probs (adapters off, no grad) + policy log-probs + GRPO loss (DeepSeekMath form, TRL
loss_type="grpo") + backward + AdamW step. We report the median wall time per step over a few steps after warm-up
(fastest of --rounds runs), and memory: on CPU the peak RSS during the steps (VmHWM reset right before the first
step, so it counts the resident weights plus what the steps allocate) and the process's ru_maxrss (which on the 0.5B
model is set by from_pretrained, before any step, so it mostly compares imports and loading); on CUDA the peak
allocated device memory during the steps. RESULT's peak_mem_vs_trl is the step peak (weights included: the same
fp32 model is resident in both, so this ratio cannot go far below 1 when the batch is small); step_extra_mem_vs_trl
compares what the steps add above the memory at setup; maxrss_vs_trl compares ru_maxrss.
Where the time goes on our side: grpo.token_logprobs never builds (B, T, V) logits (the output layer and the
log-softmax run in chunks of the head). (It also ran each group's shared prompt once; that path was removed: on the
recipe's Planner micro-batch it was not faster than the plain forward on a CPU. Figures measured with it are older.)

What it is not: a measure of sampling speed, or of training quality. `--baselines peft_hf` adds a third column: a
straightforward PEFT + HF step (full logits, PEFT LoRA, HF gradient_checkpointing_enable), the fallback when TRL
cannot be used.

Needs TRL, which is not a project dependency; install it without touching torch:
       echo torch==2.13.0 > /tmp/c.txt && .venv/bin/pip install trl -c /tmp/c.txt      (TRL 1.16 was measured)
Without TRL the PEFT + HF baseline stands in, and RESULT says baseline=peft_hf.
Run:   .venv/bin/python tests/bench/bench_grpo_step.py --threads 1   (tiny + 0.5B if present, CPU; ~15 min)
Ends with: RESULT step_time_vs_trl=<ours/trl> peak_mem_vs_trl=<ours/trl> ...   (the largest model measured)
"""
import argparse
import importlib.util
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

# ----------------------------------------------------------------------------------------------------------------
# config
parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
# what to compare
parser.add_argument("--models", nargs="*", default=None, help="model dirs; default: tiny + the 0.5B when present")
parser.add_argument("--baselines", default="trl", help="comma list from: trl, peft_hf")
parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
# batch shape (B = prompts x group size). Defaults: one micro-batch of train.py (--group-size 8, --micro-batch 8 =
# one group), with prompts as long as completions as in the planner stage (MBPP planner prompts are ~300 tokens,
# plans <= 256), scaled down to 128 + 128 so that the 0.5B step runs in minutes on 2 CPU cores.
parser.add_argument("--prompts", type=int, default=1)
parser.add_argument("--group-size", type=int, default=8)
parser.add_argument("--prompt-len", type=int, default=128)
parser.add_argument("--completion-len", type=int, default=128)
# method
parser.add_argument("--rank", type=int, default=16)
parser.add_argument("--beta", type=float, default=0.04)
parser.add_argument("--lr", type=float, default=1e-5)
# timing
parser.add_argument("--warmup", type=int, default=1)
parser.add_argument("--steps", type=int, default=3)
parser.add_argument("--rounds", type=int, default=2, help="run every implementation this many times, alternating; "
                    "keep each one's fastest median (robust to other processes on a shared machine)")
parser.add_argument("--threads", type=int, default=0, help="torch CPU threads in every worker (0: torch's default)")
parser.add_argument("--mmap-threshold", type=int, default=65536,
                    help="glibc MALLOC_MMAP_THRESHOLD_ for every worker (0: glibc's dynamic default); see spawn()")
parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)  # internal: ours | trl | peft_hf
parser.add_argument("--model", default=None, help=argparse.SUPPRESS)  # internal: the worker's model dir
args = parser.parse_args()


# ----------------------------------------------------------------------------------------------------------------
# fixed data, identical in every worker


def fixed_batch(vocab, eos_id):
    """Ragged prompts (lengths in [P/2, P]) and completions (lengths in [T/4, T], ending in EOS), seeded."""
    import torch

    g = torch.Generator().manual_seed(0)
    P, T = args.prompt_len, args.completion_len
    prompts, completions = [], []
    for _ in range(args.prompts):
        n = int(torch.randint(P // 2, P + 1, (1,), generator=g))
        prompts.append(torch.randint(3, vocab, (n,), generator=g).tolist())
    for _ in range(args.prompts * args.group_size):
        n = int(torch.randint(max(1, T // 4), T + 1, (1,), generator=g))
        completions.append(torch.randint(3, vocab, (n - 1,), generator=g).tolist() + [eos_id])
    return prompts, completions


def reward_of(completion_ids):
    # Any fixed function of the tokens, spread enough that no group is tied.
    return (sum(completion_ids) % 97) / 96.0


def pad_batch(prompts, completions, pad_id):
    """Our layout: (B, P+T) left-padded prompts + right-padded completions, attention and completion masks."""
    import torch

    G = args.group_size
    P, T = max(map(len, prompts)), max(map(len, completions))
    B = len(completions)
    ids = torch.full((B, P + T), pad_id)
    am = torch.zeros(B, P + T, dtype=torch.long)
    for i, c in enumerate(completions):
        p = prompts[i // G]
        ids[i, P - len(p):P], am[i, P - len(p):P] = torch.tensor(p), 1
        ids[i, P:P + len(c)], am[i, P:P + len(c)] = torch.tensor(c), 1
    return ids, am, P, am[:, P:]


def load(path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(args.device)
    return model, AutoTokenizer.from_pretrained(path)


def sync():
    import torch

    if args.device == "cuda":
        torch.cuda.synchronize()


# Memory of the training steps alone. ru_maxrss cannot be reset and, on the 0.5B model, is set by from_pretrained
# (bf16 file -> fp32 copies) before any step runs, so it says little about the step. Linux can reset the peak-RSS
# watermark (VmHWM) by writing 5 to /proc/self/clear_refs: we do that right before the first step, after setup
# (model, adapters, trainer), so the step peak = resident weights + everything the steps allocate.
STEP_MEM = {}


def _status_kib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def start_step_memory():
    """Call once, right before the first (warm-up) step."""
    import torch

    if STEP_MEM:
        return
    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        STEP_MEM["setup"] = torch.cuda.memory_allocated()
    else:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        STEP_MEM["setup"] = _status_kib("VmRSS") * 1024


def step_peak():
    import torch

    return torch.cuda.max_memory_allocated() if args.device == "cuda" else _status_kib("VmHWM") * 1024


# ----------------------------------------------------------------------------------------------------------------
# workers: each runs warmup + steps and prints one JSON line


def worker_ours(path):
    import torch

    sys.path.insert(0, ROOT)
    import grpo

    model, tok = load(path)
    prompts, completions = fixed_batch(model.config.vocab_size, tok.eos_token_id)
    ids, am, P, cmask = pad_batch(prompts, completions, tok.pad_token_id)
    ids, am, cmask = ids.to(args.device), am.to(args.device), cmask.to(args.device)
    rewards = [reward_of(c) for c in completions]
    grpo.add_lora(model, "policy", r=args.rank, alpha=2 * args.rank)
    grpo.enable_checkpointing(model)
    opt = torch.optim.AdamW(grpo.lora_parameters(model, "policy"), lr=args.lr)
    model.train()
    times = []
    start_step_memory()
    for _ in range(args.warmup + args.steps):
        sync()
        t0 = time.perf_counter()
        with torch.no_grad(), grpo.adapters_off(model):
            ref = grpo.token_logprobs(model, ids, am, P)  # (B, T)
        logp = grpo.token_logprobs(model, ids, am, P)  # (B, T)
        adv, _ = grpo.group_advantages(rewards, args.group_size)
        # One pass per batch: old log-probs are the current ones, detached (as TRL does when old logps are None).
        loss, _ = grpo.grpo_loss(logp, logp.detach(), ref, adv.to(logp.device), cmask, beta=args.beta)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        times.append(time.perf_counter() - t0)
    return times[args.warmup:], loss.item()


def worker_trl(path):
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    sys.path.insert(0, ROOT)
    import grpo  # only for DEFAULT_TARGETS, the same targets in both

    model, tok = load(path)
    prompts, completions = fixed_batch(model.config.vocab_size, tok.eos_token_id)
    G = args.group_size

    def rollout(batch_prompts, trainer):
        # TRL hands us the B prompt strings ("p<i>", each repeated G times in a row); we return the fixed token ids
        # instead of sampling. logprobs are only read for vLLM importance sampling, which is off.
        seen = {}
        out = {"prompt_ids": [], "completion_ids": [], "logprobs": []}
        for text in batch_prompts:
            i = int(text[1:])
            k = seen.get(i, 0)
            seen[i] = k + 1
            c = completions[i * G + k % G]
            out["prompt_ids"].append(prompts[i])
            out["completion_ids"].append(c)
            out["logprobs"].append([0.0] * len(c))
        return out

    def reward(prompts, completions, completion_ids, **kw):
        return [reward_of(c) for c in completion_ids]

    class Timer(TrainerCallback):
        """Wall time from step begin (before TRL's rollout/ref pass in training_step) to step end (after optim)."""

        def __init__(self):
            self.times, self.t0 = [], None

        def on_step_begin(self, a, state, control, **kw):
            start_step_memory()
            sync()
            self.t0 = time.perf_counter()

        def on_step_end(self, a, state, control, **kw):
            sync()
            self.times.append(time.perf_counter() - self.t0)

    n_steps = args.warmup + args.steps
    data = Dataset.from_dict({"prompt": [f"p{i}" for i in range(args.prompts)] * n_steps})
    cfg = GRPOConfig(
        output_dir=tempfile.mkdtemp(), report_to=[], save_strategy="no", logging_steps=10**6, disable_tqdm=True,
        per_device_train_batch_size=args.prompts * G, num_generations=G, max_completion_length=args.completion_len,
        max_steps=n_steps, learning_rate=args.lr, beta=args.beta, epsilon=0.2, loss_type="grpo",
        scale_rewards="group", num_iterations=1, gradient_checkpointing=True,
        gradient_checkpointing_kwargs={"use_reentrant": False}, use_cpu=args.device == "cpu",
        bf16=args.device == "cuda", dataloader_num_workers=0, seed=0, lr_scheduler_type="constant",
        # torch AdamW's default weight decay, and no gradient clipping: the same update as our step.
        warmup_steps=0, weight_decay=0.01, max_grad_norm=0.0,
    )
    peft_cfg = LoraConfig(r=args.rank, lora_alpha=2 * args.rank, lora_dropout=0.0,
                          target_modules=list(grpo.DEFAULT_TARGETS), task_type="CAUSAL_LM")
    timer = Timer()
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=cfg, train_dataset=data, processing_class=tok,
                          peft_config=peft_cfg, rollout_func=rollout, callbacks=[timer])
    result = trainer.train()
    return timer.times[args.warmup:], result.training_loss


def worker_peft_hf(path):
    """The straightforward way: PEFT LoRA, HF checkpointing, full (B, T, V) logits, same loss and optimizer."""
    import torch
    import torch.nn.functional as F
    from peft import LoraConfig, get_peft_model

    sys.path.insert(0, ROOT)
    import grpo

    model, tok = load(path)
    prompts, completions = fixed_batch(model.config.vocab_size, tok.eos_token_id)
    ids, am, P, cmask = pad_batch(prompts, completions, tok.pad_token_id)
    ids, am, cmask = ids.to(args.device), am.to(args.device), cmask.to(args.device)
    pos = (am.cumsum(-1) - 1).clamp(min=0)
    rewards = [reward_of(c) for c in completions]
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model = get_peft_model(model, LoraConfig(r=args.rank, lora_alpha=2 * args.rank,
                                             target_modules=list(grpo.DEFAULT_TARGETS), task_type="CAUSAL_LM"))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.lr)
    model.train()
    start_step_memory()

    def logprobs():
        logits = model(input_ids=ids, attention_mask=am, position_ids=pos, use_cache=False).logits  # (B, L, V)
        return F.log_softmax(logits[:, P - 1:-1].float(), -1).gather(-1, ids[:, P:, None]).squeeze(-1)  # (B, T)

    times = []
    for _ in range(args.warmup + args.steps):
        sync()
        t0 = time.perf_counter()
        with torch.no_grad(), model.disable_adapter():
            ref = logprobs()
        logp = logprobs()
        adv, _ = grpo.group_advantages(rewards, args.group_size)
        loss, _ = grpo.grpo_loss(logp, logp.detach(), ref, adv.to(logp.device), cmask, beta=args.beta)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        times.append(time.perf_counter() - t0)
    return times[args.warmup:], loss.item()


WORKERS = {"ours": worker_ours, "trl": worker_trl, "peft_hf": worker_peft_hf}


def run_worker():
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    times, loss = WORKERS[args.worker](args.model)
    out = {"times": times, "loss": loss, "step_peak": step_peak(), "setup": STEP_MEM["setup"],
           # the whole process, model loading and imports included (Linux reports KiB)
           "maxrss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    print("BENCH " + json.dumps(out), flush=True)


# ----------------------------------------------------------------------------------------------------------------
# driver: one fresh subprocess per (model, implementation)


def spawn(impl, model_dir):
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", impl, "--model", model_dir]
    for key in ("device", "prompts", "group_size", "prompt_len", "completion_len", "rank", "beta", "lr", "warmup",
                "steps", "threads"):
        cmd += ["--" + key.replace("_", "-"), str(getattr(args, key))]
    env = dict(os.environ)
    if args.mmap_threshold:
        # glibc's default raises its mmap threshold as large blocks are freed, after which freed activations stay in
        # the heap and RSS stays high (on the 0.5B, ~550 MiB retained after one checkpointed forward whose live
        # memory grew by ~45 MiB). A fixed threshold hands large blocks back on free, so RSS tracks live memory.
        # Same setting for every implementation.
        env["MALLOC_MMAP_THRESHOLD_"] = str(args.mmap_threshold)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("BENCH ")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout)[-3000:]
        return {"error": f"{impl} failed (rc={proc.returncode}):\n{tail}"}
    return json.loads(lines[-1][6:])


def main():
    sys.path.insert(0, os.path.dirname(HERE))
    from tiny_model import build_tiny_model, real_model_dir

    models = args.models
    if not models:
        models = [build_tiny_model(os.path.join(tempfile.mkdtemp(), "tiny"))]
        real, where = real_model_dir()
        if real:
            models.append(real)
        else:
            print(f"0.5B skipped: {where}")
    baselines = [b for b in args.baselines.split(",") if b]
    if "trl" in baselines and importlib.util.find_spec("trl") is None:
        print("TRL is not installed: comparing against the PEFT + HF step instead (see the docstring to install TRL)")
        baselines = [b for b in baselines if b != "trl"] or ["peft_hf"]
    B = args.prompts * args.group_size
    print(f"GRPO step: B={B} (prompts={args.prompts} x G={args.group_size}), prompt<={args.prompt_len}, "
          f"completion<={args.completion_len}, LoRA r={args.rank}, beta={args.beta}, device={args.device}, "
          f"threads={args.threads or 'default'}, MALLOC_MMAP_THRESHOLD_={args.mmap_threshold or 'default'}, "
          f"checkpointing on, median of {args.steps} steps after "
          f"{args.warmup} warm-up, best of {args.rounds} rounds")
    unit = "alloc" if args.device == "cuda" else "RSS"
    print(f"step peak = peak {unit} during the steps (weights included); step extra = step peak - {unit} at setup; "
          f"maxrss = whole process incl. loading (CPU)")
    print(f"{'model':<30} {'impl':<8} {'s/step':>8} {'step peak MiB':>14} {'step extra MiB':>15} "
          f"{'maxrss MiB':>11} {'loss':>8}")
    summary = {}
    for model_dir in models:
        label = os.path.basename(model_dir.rstrip("/"))
        rows = {}
        for _ in range(args.rounds):
            for impl in ["ours"] + baselines:
                r = spawn(impl, model_dir)
                if "error" in r:
                    print(r["error"])
                    continue
                r["median"] = statistics.median(r["times"])
                print(f"{label:<30} {impl:<8} {r['median']:8.3f} {r['step_peak'] / 2**20:14.0f} "
                      f"{(r['step_peak'] - r['setup']) / 2**20:15.0f} {r['maxrss'] / 2**20:11.0f} {r['loss']:8.4f}",
                      flush=True)
                # Fastest median of the rounds (other processes only ever slow a run down); largest memory.
                best = rows.setdefault(impl, r)
                best["median"] = min(best["median"], r["median"])
                for key in ("step_peak", "maxrss"):
                    best[key] = max(best[key], r[key])
        for base in baselines:
            if "ours" in rows and base in rows:
                o, b = rows["ours"], rows[base]
                ratios = {"step_time": o["median"] / b["median"], "peak_mem": o["step_peak"] / b["step_peak"],
                          "step_extra": (o["step_peak"] - o["setup"]) / max(1, b["step_peak"] - b["setup"]),
                          "maxrss": o["maxrss"] / b["maxrss"]}
                print(f"{label:<30} ours/{base}: step time x{ratios['step_time']:.3f}, step peak memory "
                      f"x{ratios['peak_mem']:.3f}, step extra memory x{ratios['step_extra']:.3f}, "
                      f"process maxrss x{ratios['maxrss']:.3f}")
                summary[(label, base)] = ratios
    # RESULT: the largest model measured against the first baseline that ran; the tiny model's ratios ride along.
    labels = [os.path.basename(m.rstrip("/")) for m in models]
    found = [(lab, base) for lab in reversed(labels) for base in baselines if (lab, base) in summary]
    if not found:
        print("RESULT step_time_vs_trl=nan peak_mem_vs_trl=nan error=no_successful_pair")
        return
    label, base = found[0]
    r = summary[(label, base)]
    line = (f"RESULT step_time_vs_trl={r['step_time']:.3f} peak_mem_vs_trl={r['peak_mem']:.3f} "
            f"step_extra_mem_vs_trl={r['step_extra']:.3f} maxrss_vs_trl={r['maxrss']:.3f} model={label} "
            f"device={args.device}")
    if (labels[0], base) in summary and labels[0] != label:
        small = summary[(labels[0], base)]
        line += f" small_step_time_vs_trl={small['step_time']:.3f} small_peak_mem_vs_trl={small['peak_mem']:.3f}"
    if base != "trl":
        line += f" baseline={base}"
    print(line)


if __name__ == "__main__":
    if args.worker:
        run_worker()
    else:
        main()
