"""Benchmark: agents.sample vs HF `generate`, side by side; and the memory gradient checkpointing saves.

What it is. Part 1, speed: on the tiny random Qwen2 (tests/tiny_model.py, built into a temp dir) and, when it
has been built, the real Qwen2.5-Coder-0.5B, both samplers run on the same loaded model, the same prompts, the
same batch B and the same number of new tokens, alternating, best of `--rounds`. Equal work: EOS is ignored by
both (ours: eos_token_ids=(); HF: the generation config's eos_token_id set to None for the call), so every row
generates exactly N tokens and tokens/s = B * N / seconds on both sides (checked). Two workloads:
  - group sampling, the GRPO rollout: n prompts x G samples at temperature 1 (ours: `group_size=G`; HF:
    `num_return_sequences=G`). This is the headline ratio in the RESULT line.
  - greedy on B distinct ragged prompts: also checks that our tokens equal HF's token for token.
Part 2, memory: peak memory of one LoRA training step (forward + backward of grpo.token_logprobs on a batch),
with and without grpo.enable_checkpointing, each in a fresh child process started before this process loads
any model. On CPU the peak is the child's resident-set high-water mark measured from right before the step
(VmHWM reset through /proc/self/clear_refs, so loading the bf16 checkpoint into fp32 does not mask the step);
the child's whole-life ru_maxrss (from os.wait4) is printed next to it. On CUDA: torch.cuda.max_memory_allocated.
The ratio in the RESULT line is step peak with / without checkpointing, resident weights included.
Part 3, dropping finished rows (agents.sample's drop_finished, on the 0.5B only): the two sampling
calls of one Planner-stage rollout at the recipe's shapes, as train.py's `sample` makes them:
--drop-problems MBPP train problems x G planner prompts at temperature 1 with the Planner's stop
strings and a generator per problem (plans <= 128 tokens), then the Coder on those plans (one row
per plan, greedy as with M = 1, <= 256 tokens). Each call runs without and with dropping,
alternating, best of --drop-rounds, same seeds; the tokens, masks and texts must be identical.
Printed per call: wall and CPU time of both sides, their ratio (old / new: > 1 = faster), the
prefill's share of the old side's time, and the share of row-steps in which the row had already
finished (the work dropping can save). Not a measure of the rollout's other phases (parsing, running
programs).
Part 4, decode attention (agents.PACKED_SDPA, no model needed): one layer's attention of one padded decode step at
the 0.5B's head layout (14 query heads, 2 KV heads, d = 64, bf16), --attn-batch rows x --attn-len cached tokens:
transformers <= 5.17's path (K/V repeated to every query head, then SDPA) against ours (a KV head's query heads as
its rows), alternating, best of 5; outputs must agree.

What it is not. Not a throughput study across batch sizes, not a measure of prefix caching or serving engines.
Where our speed comes from: one prefill per prompt (HF prefills every one of the G copies of a prompt), and less
Python per step; the model forward itself is the same HF code in both, so at batch-1-like compute-bound settings
(greedy on the 0.5B) expect a ratio near 1.

Run:   .venv/bin/python tests/bench/bench_sampler.py            (tiny + the 0.5B if present; CPU or CUDA;
       the speed part uses 1 CPU thread by default, see --threads)
       .venv/bin/python tests/bench/bench_sampler.py --parts drop      (Part 3 alone: ~10-40 min on 2 shared cores)
       .venv/bin/python tests/bench/bench_sampler.py --parts attn      (Part 4 alone: seconds)
Ends with: RESULT sampler_vs_hf_tiny=<ours/HF tokens/s> sampler_vs_hf_0p5b=<...> greedy_identical=<true|false>
           ckpt_mem_ratio=<step peak with checkpointing / without> drop_finished_speedup_plan=<old/new wall>
           drop_finished_speedup_code=<...> drop_finished_identical=<true|false>
           decode_attn_repeat_over_packed=<one layer's decode attention, old/new time>   ("na": part not run)
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(HERE))
from tiny_model import real_model_dir  # noqa: E402

REAL_MODEL, REAL_WHERE = real_model_dir()

# ----------------------------------------------------------------------------------------------------------------
# config
parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("--device", default=None, help="cpu | cuda (default: cuda when available)")
parser.add_argument("--real-model", default=REAL_MODEL,
                    help="the 0.5B model dir (default: $CORECODE_MODEL, else where ../shared/models/get-model puts "
                         "it); skipped cleanly when absent")
parser.add_argument("--threads", type=int, default=1, help="torch CPU threads for the speed part (0: torch's "
                    "default). 1 by default: on a shared 2-core machine two OpenMP threads stall at every barrier "
                    "while another job holds a core, which slowed both samplers 10x and pulled the ratio to ~1; "
                    "one thread is only time-sliced, so the ratio stays a measure of work")
# tiny model workloads (B = prompts x group)
parser.add_argument("--tiny-prompts", type=int, default=4)
parser.add_argument("--tiny-group", type=int, default=4)
parser.add_argument("--tiny-new", type=int, default=64)
parser.add_argument("--tiny-rounds", type=int, default=5)
# real model workloads: small on 2 CPU cores
parser.add_argument("--real-prompts", type=int, default=2)
parser.add_argument("--real-group", type=int, default=2)
parser.add_argument("--real-new", type=int, default=32)
parser.add_argument("--real-rounds", type=int, default=3, help="rounds of the group-sampling comparison")
# memory of one LoRA training step
parser.add_argument("--mem-model", default="auto", help="auto (the 0.5B when present, else a 8-layer random model), "
                    "or a model dir, or 'skip'")
parser.add_argument("--mem-batch", type=int, default=2)
parser.add_argument("--mem-seq", type=int, default=256, help="tokens per row (prompt 64 + completion)")
# dropping finished rows: a Planner-stage rollout's sampling on the 0.5B
parser.add_argument("--drop-problems", type=int, default=4, help="MBPP train problems (recipe: 4 per step)")
parser.add_argument("--drop-group", type=int, default=8, help="G plans per problem")
parser.add_argument("--drop-plan-new", type=int, default=128, help="plan budget (the recipe's)")
parser.add_argument("--drop-code-new", type=int, default=256, help="program budget (the recipe's)")
parser.add_argument("--drop-rounds", type=int, default=2)
parser.add_argument("--drop-threads", type=int, default=2, help="torch CPU threads for part 3 (the trainer's)")
parser.add_argument("--parts", default="speed,mem,drop,attn",
                    help="comma-separated parts to run: speed, mem, drop, attn")
parser.add_argument("--attn-batch", type=int, default=64, help="part 4: decode rows")
parser.add_argument("--attn-len", type=int, default=1024, help="part 4: cached tokens per row")
parser.add_argument("--mem-child", default=None, help=argparse.SUPPRESS)  # internal: "0" / "1" = checkpointing
parser.add_argument("--mem-path", default=None, help=argparse.SUPPRESS)
args = parser.parse_args()

PROBLEMS = [  # MBPP-style prompts with their tests, as the Coder sees them: realistic, ragged lengths
    ("Write a function to find the minimum cost path to reach (m, n) from (0, 0) for the given cost matrix.",
     ["assert min_cost([[1, 2, 3], [4, 8, 2], [1, 5, 3]], 2, 2) == 8",
      "assert min_cost([[2, 3, 4], [5, 9, 3], [2, 6, 4]], 2, 2) == 12"]),
    ("Write a python function to check whether the given number is a perfect square or not.",
     ["assert is_Perfect_Square(10) == False", "assert is_Perfect_Square(36) == True"]),
    ("Write a function to find the longest common subsequence of two strings. Return its length.",
     ["assert lcs('AGGTAB', 'GXTXAYB') == 4", "assert lcs('ABC', 'AC') == 2", "assert lcs('', 'A') == 0"]),
    ("Write a function to remove all whitespaces from a string.",
     ["assert remove_all_spaces('python  program') == 'pythonprogram'"]),
    ("Write a function that takes a list of integers and returns a new list with every even number doubled and "
     "every odd number removed, keeping the original order.",
     ["assert double_evens([1, 2, 3, 4]) == [4, 8]", "assert double_evens([]) == []"]),
    ("Write a python function to count the number of set bits in a non-negative integer.",
     ["assert count_Set_Bits(2) == 1", "assert count_Set_Bits(7) == 3"]),
    ("Write a function to merge two sorted lists into one sorted list without using sort().",
     ["assert merge([1, 3], [2, 4]) == [1, 2, 3, 4]"]),
    ("Write a function to return the n-th Fibonacci number using iteration.",
     ["assert fib(1) == 1", "assert fib(10) == 55", "assert fib(20) == 6765"]),
]
SYSTEM = "You are an expert Python programmer. Answer with one ```python code block and nothing else."


# ----------------------------------------------------------------------------------------------------------------
# Part 2 child: one LoRA training step, print its peak memory as JSON (runs in a fresh process)

def _status_bytes(field):
    """A memory field of /proc/self/status (VmRSS, VmHWM, ...) in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def mem_child(path, ckpt):
    import torch

    import agents
    import grpo

    model, tok = agents.load_model(path, device=args.device)
    device = next(model.parameters()).device
    grpo.add_lora(model, "policy")
    grpo.enable_checkpointing(model, on=ckpt)
    model.train()
    g = torch.Generator().manual_seed(0)
    B, L, P = args.mem_batch, args.mem_seq, min(64, args.mem_seq // 2)
    ids = torch.randint(3, model.config.vocab_size, (B, L), generator=g).to(device)  # (B, L)
    am = torch.ones_like(ids)  # (B, L)
    # The step's own peak: on CUDA reset the allocator's counter; on CPU reset the RSS watermark (Linux:
    # writing 5 to clear_refs sets VmHWM to the current RSS), so model loading does not count.
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
        setup = torch.cuda.memory_allocated()
    else:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        setup = _status_bytes("VmRSS")
    t0 = time.perf_counter()
    logp = grpo.token_logprobs(model, ids, am, P)  # (B, L-P)
    (-logp.mean()).backward()
    peak = torch.cuda.max_memory_allocated() if device.type == "cuda" else _status_bytes("VmHWM")
    # The shape it ran, echoed: the parent prints and checks this, not its own arguments.
    print(json.dumps({"peak": peak, "setup": setup, "seconds": time.perf_counter() - t0, "batch": B, "seq": L}))


def run_mem_child(path, ckpt):
    """Run one child to completion; return its JSON (step peak) plus its whole-life ru_maxrss from os.wait4."""
    cmd = [sys.executable, os.path.abspath(__file__), "--mem-child", str(int(ckpt)), "--mem-path", path,
           "--mem-batch", str(args.mem_batch), "--mem-seq", str(args.mem_seq)]
    if args.device:
        cmd += ["--device", args.device]
    # glibc's malloc raises its mmap threshold as large blocks are freed, after which freed tensors stay in the
    # heap and the RSS peak depends on allocation order (we saw 4.5 to 5.6 GB for the same step). A fixed low
    # threshold makes every large tensor its own mapping, returned at free: RSS then follows live memory.
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    with tempfile.TemporaryFile(mode="w+") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=env)
        out = proc.stdout.read()
        # Reap it ourselves: wait4 hands back this child's own rusage (RUSAGE_CHILDREN would mix children).
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        tail = (err.read().strip().splitlines() or ["(no stderr)"])[-1]
    if proc.returncode != 0:
        raise RuntimeError(f"memory child (checkpointing={ckpt}) exited {proc.returncode}: {tail}")
    result = json.loads(out.strip().splitlines()[-1])
    print(f"memory child: {json.dumps(result)}", flush=True)
    if (result["batch"], result["seq"]) != (args.mem_batch, args.mem_seq):
        raise RuntimeError(f"memory child ran {result['batch']} x {result['seq']} tokens, asked for "
                           f"{args.mem_batch} x {args.mem_seq}")
    result["maxrss"] = usage.ru_maxrss * 1024  # Linux reports KiB
    return result


# ----------------------------------------------------------------------------------------------------------------
# Part 1: speed

def spice(model):
    """Redraw the tiny model's matrices at a larger scale (in memory): its stock weights make greedy decoding
    repeat one token, which would make the greedy-identity check vacuous. Speed does not depend on values."""
    import torch

    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=g).to(p.dtype) * 2 / p.shape[1] ** 0.5)


def sync(device):
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


def run_ours(model, tok, prompts, group, new, temperature):
    import agents

    return agents.sample(model, tok, prompts, group_size=group, max_new_tokens=new, temperature=temperature,
                         seed=0, eos_token_ids=()).completion_ids


def run_hf(model, tok, prompts, group, new, temperature):
    device = next(model.parameters()).device
    enc = tok(prompts, padding=True, padding_side="left", return_tensors="pt").to(device)
    gc = model.generation_config
    saved = gc.eos_token_id
    gc.eos_token_id = None  # no EOS stopping criterion at all: every row runs the full N steps, as ours
    try:
        if temperature > 0:
            kw = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0, num_return_sequences=group)
        else:
            kw = dict(do_sample=False)
        out = model.generate(**enc, max_new_tokens=new, pad_token_id=tok.pad_token_id, **kw)
    finally:
        gc.eos_token_id = saved
    return out[:, enc["input_ids"].shape[1]:]


def timed(fn, device):
    """(wall seconds, this process's CPU seconds, result). CPU time is the cross-check on a shared machine:
    other people's jobs stretch wall time by tens of seconds at random, but barely change our CPU time."""
    sync(device)
    t0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    sync(device)
    return time.perf_counter() - t0, time.process_time() - c0, out


def user_prompt(tok, i):
    import agents

    text, tests = PROBLEMS[i % len(PROBLEMS)]
    return agents.chat_prompt(tok, SYSTEM, text + "\nYour code should pass these tests:\n" + "\n".join(tests))


def compare(label, model, tok, n_prompts, group, new, rounds, temperature):
    """Alternate ours / HF `rounds` times; return (ours tok/s, HF tok/s, ours ids, HF ids) from the best rounds."""
    import agents

    device = next(model.parameters()).device
    prompts = [user_prompt(tok, i) for i in range(n_prompts)]
    B = n_prompts * group
    best = {"ours": float("inf"), "hf": float("inf")}  # fastest wall time of each side
    cpu = {"ours": float("inf"), "hf": float("inf")}  # least CPU time of each side
    outs = {}
    for _ in range(rounds):
        for name, fn in (("ours", run_ours), ("hf", run_hf)):
            sec, cpu_sec, ids = timed(lambda: fn(model, tok, prompts, group, new, temperature), device)
            assert ids.shape == (B, new), f"{name} generated {tuple(ids.shape)}, expected {(B, new)}"
            best[name], cpu[name] = min(best[name], sec), min(cpu[name], cpu_sec)
            outs[name] = ids
    ours_tps, hf_tps = B * new / best["ours"], B * new / best["hf"]
    ratio, cpu_ratio = ours_tps / hf_tps, cpu["hf"] / cpu["ours"]
    lengths = tok(prompts, return_length=True)["length"]
    print(f"{label:34s} B={B:3d} ({n_prompts}x{group}) N={new:3d} prompt tokens {min(lengths)}-{max(lengths)}: "
          f"ours {ours_tps:8.1f} tok/s  HF {hf_tps:8.1f} tok/s  ratio {ratio:5.2f} (CPU-time ratio {cpu_ratio:5.2f})",
          flush=True)
    if device.type == "cpu" and not 0.75 < ratio / cpu_ratio < 1.33:
        print(f"  warning: wall-clock and CPU-time ratios disagree: the machine was busy; rerun, or read the "
              f"CPU-time ratio", flush=True)
    return ratio, outs["ours"], outs["hf"]


def speed(path, is_tiny, device):
    import torch

    import agents

    model, tok = agents.load_model(path, device=device)
    if is_tiny:
        spice(model)
    n, G, N, R = ((args.tiny_prompts, args.tiny_group, args.tiny_new, args.tiny_rounds) if is_tiny else
                  (args.real_prompts, args.real_group, args.real_new, args.real_rounds))
    name = "tiny" if is_tiny else "0.5B"
    if is_tiny:  # one untimed call each: first-call allocations and lazy imports
        run_ours(model, tok, [user_prompt(tok, 0)], 1, 2, 1.0)
        run_hf(model, tok, [user_prompt(tok, 0)], 1, 2, 1.0)
    sampling_ratio, _, _ = compare(f"{name} group sampling (T=1)", model, tok, n, G, N, R, 1.0)
    # Greedy is mostly the identity check: on the real model one round is enough (and costs minutes on CPU).
    greedy_ratio, ours, ref = compare(f"{name} greedy, distinct prompts", model, tok, n * G, 1, N,
                                      R if is_tiny else 1, 0.0)
    identical = bool(torch.equal(ours, ref))
    print(f"{name} greedy tokens identical to HF generate: {identical}", flush=True)
    del model
    return sampling_ratio, greedy_ratio, identical


# ----------------------------------------------------------------------------------------------------------------
# Part 3: dropping finished rows

def old_vs_new(label, call, device, rounds):
    """Alternate call(drop_finished=False) / call(True) `rounds` times; print both sides; return (old/new wall-time
    ratio, whether every run gave the same tokens, masks and texts, one run's Samples)."""
    import torch

    import agents

    best = {False: float("inf"), True: float("inf")}
    cpu = {False: float("inf"), True: float("inf")}
    prefill = {False: float("inf"), True: float("inf")}
    real_prefill, clock = agents.prefill, []

    def timed_prefill(*a):  # the prefill's own time, to tell it apart from decoding
        sync(device)
        t0 = time.perf_counter()
        out = real_prefill(*a)
        sync(device)
        clock.append(time.perf_counter() - t0)
        return out

    agents.prefill, outs = timed_prefill, []
    try:
        for _ in range(rounds):
            for drop in (False, True):
                clock.clear()
                sec, cpu_sec, s = timed(lambda: call(drop), device)
                if sec < best[drop]:
                    best[drop], prefill[drop] = sec, sum(clock)
                cpu[drop] = min(cpu[drop], cpu_sec)
                outs.append(s)
    finally:
        agents.prefill = real_prefill
    same = all(torch.equal(o.completion_ids, outs[0].completion_ids) and
               torch.equal(o.completion_mask, outs[0].completion_mask) and o.texts == outs[0].texts for o in outs)
    m = outs[0].completion_mask.float()  # (B, T)
    ratio, cpu_ratio = best[False] / best[True], cpu[False] / cpu[True]
    print(f"{label}: B={m.shape[0]} T={m.shape[1]} completion tokens mean {m.sum(1).mean():.0f}; row-steps finished "
          f"{1 - m.mean():.2f}; old {best[False]:6.1f} s (prefill {prefill[False] / best[False]:.0%}, CPU "
          f"{cpu[False]:6.1f} s)  new {best[True]:6.1f} s (CPU {cpu[True]:6.1f} s)  old/new {ratio:.2f} (CPU-time "
          f"{cpu_ratio:.2f}); identical: {same}", flush=True)
    return ratio, same, outs[0]


def rollout_setup(path, device, what):
    """Part 3: the model, --drop-problems MBPP train problems and G, as in train.py's sample."""
    import torch

    import agents
    import data

    if args.drop_threads:
        torch.set_num_threads(args.drop_threads)
    problems = data.load("mbpp", split="train")[: args.drop_problems]
    model, tok = agents.load_model(path, device=device)
    print(f"{what}: {len(problems)} MBPP train problems x G={args.drop_group}, dtype "
          f"{next(model.parameters()).dtype}, threads {torch.get_num_threads()}", flush=True)
    return model, tok, problems, len(problems), args.drop_group


def gens(k, device):
    """train.py: one generator per problem; a problem's rows share it."""
    import torch

    return [torch.Generator(device=device).manual_seed(i) for i in range(k)]


def coder_prompts(tok, problems, G, plan_texts):
    """The Coder's prompt for each plan; row i*G+g: plan g of problem i."""
    import agents

    planner, coder = agents.ROLES["planner"], agents.ROLES["coder"]
    rows = [p for p in problems for _ in range(G)]
    return [coder.prompt(tok, p, planner.parse(text, p, {})) for p, text in zip(rows, plan_texts)]


def drop_finished(path, device):
    import agents

    model, tok, problems, n, G = rollout_setup(path, device, "drop finished rows")
    planner, coder = agents.ROLES["planner"], agents.ROLES["coder"]
    plan_prompts = [agents.planner_prompt(tok, p) for p in problems]
    plan_ratio, plan_same, plans = old_vs_new("planner", lambda drop: agents.sample(
        model, tok, plan_prompts, group_size=G, max_new_tokens=args.drop_plan_new, temperature=1.0,
        stop=planner.stop, generator=gens(n, device), drop_finished=drop), device, args.drop_rounds)
    code_prompts = coder_prompts(tok, problems, G, plans.texts)
    # Greedy, so the generators draw nothing; given anyway, as train.py's sample does.
    code_ratio, code_same, _ = old_vs_new("coder", lambda drop: agents.sample(
        model, tok, code_prompts, max_new_tokens=args.drop_code_new, temperature=0.0,
        stop=coder.stop, generator=gens(n * G, device), drop_finished=drop),
        device, args.drop_rounds)
    del model
    return plan_ratio, code_ratio, plan_same and code_same


# ----------------------------------------------------------------------------------------------------------------
# Part 4: decode attention, the KV cache repeated per query head (transformers <= 5.17) vs ours

def decode_attention(device):
    import torch
    import torch.nn.functional as F

    import agents

    g = torch.Generator(device=device).manual_seed(0)
    B, H, KV, L, d = args.attn_batch, 14, 2, args.attn_len, 64  # Qwen2.5-0.5B's head layout
    q = torch.randn(B, H, 1, d, generator=g, device=device, dtype=torch.bfloat16)  # (B, H, 1, d)
    k, v = (torch.randn(B, KV, L, d, generator=g, device=device, dtype=torch.bfloat16) for _ in "kv")  # (B, KV, L, d)
    mask = torch.arange(L, device=device)[None, None, None, :] >= torch.randint(0, L // 4, (B, 1, 1, 1), device=device)
    layer = type("Layer", (), {"num_key_value_groups": H // KV, "is_causal": True})()

    def repeat():  # transformers <= 5.17 with a mask: K/V repeated to every query head, then SDPA
        return F.scaled_dot_product_attention(q, k.repeat_interleave(H // KV, 1), v.repeat_interleave(H // KV, 1),
                                              attn_mask=mask).transpose(1, 2)  # (B, 1, H, d)

    def packed():
        return agents._sdpa_packed_gqa(layer, q, k, v, mask)[0]  # (B, 1, H, d)

    same = torch.allclose(repeat().float(), packed().float(), atol=2e-2)
    best = {}
    for _ in range(5):
        for f in (repeat, packed):
            sync(device)
            t0 = time.perf_counter()
            f()
            sync(device)
            best[f.__name__] = min(best.get(f.__name__, float("inf")), time.perf_counter() - t0)
    ratio = best["repeat"] / best["packed"]
    print(f"decode attention, one layer, B={B} L={L} bf16: repeated K/V {best['repeat'] * 1e3:.1f} ms, packed "
          f"{best['packed'] * 1e3:.1f} ms: x{ratio:.2f}; same output: {same}", flush=True)
    return ratio


# ----------------------------------------------------------------------------------------------------------------

def main():
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    args.device = device.type
    print(f"device={device} torch={torch.__version__} threads={torch.get_num_threads()}", flush=True)
    tmp = tempfile.mkdtemp(prefix="bench-sampler-")
    try:
        run(tmp, device)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run(tmp, device):
    from tiny_model import build_tiny_model

    real = args.real_model if args.real_model and os.path.isdir(args.real_model) else None

    # Part 2 first: the memory children must start while this process is still small (ru_maxrss of a child
    # started by exec inherits the parent's high-water mark).
    parts = set(args.parts.split(","))
    ckpt_ratio = "na"
    mem_path = {"auto": real, "skip": None}.get(args.mem_model, args.mem_model) if "mem" in parts else None
    if args.mem_model == "auto" and mem_path is None and "mem" in parts:
        mem_path = build_tiny_model(os.path.join(tmp, "mid"), num_layers=8, hidden=256)  # activations visible
    try:
        import grpo  # noqa: F401  (add_lora / enable_checkpointing / token_logprobs, written in parallel)
    except ImportError as e:
        print(f"memory part skipped: grpo.py not importable ({e}); the lead runs it once grpo.py lands", flush=True)
        mem_path = None
    if mem_path:
        runs = {}
        for ckpt in (False, True):
            r = runs[ckpt] = run_mem_child(mem_path, ckpt)
            print(f"LoRA step on {os.path.basename(mem_path.rstrip('/'))} B={r['batch']} L={r['seq']} "
                  f"checkpointing={'on ' if ckpt else 'off'}: step peak {r['peak'] / 2**20:6.0f} MiB "
                  f"(= {r['setup'] / 2**20:.0f} resident before the step + {(r['peak'] - r['setup']) / 2**20:.0f}), "
                  f"process ru_maxrss {r['maxrss'] / 2**20:6.0f} MiB, {r['seconds']:.1f} s", flush=True)
        ckpt_ratio = f"{runs[True]['peak'] / runs[False]['peak']:.3f}"
        extra = [runs[c]["peak"] - runs[c]["setup"] for c in (True, False)]
        print(f"checkpointing: step peak x{ckpt_ratio}, memory the step adds x{extra[0] / max(extra[1], 1):.3f}")

    # Part 1
    tiny_ratio = real_ratio = identical = "na"
    if "speed" in parts:
        tiny_dir = build_tiny_model(os.path.join(tmp, "tiny"))
        r, _, tiny_same = speed(tiny_dir, True, device)
        tiny_ratio, identical = f"{r:.3f}", str(tiny_same).lower()
        if real:
            r, _, same = speed(real, False, device)
            real_ratio, identical = f"{r:.3f}", str(tiny_same and same).lower()
    if not real:
        print(f"0.5B model skipped: {REAL_WHERE if args.real_model is None else f'{args.real_model} not found'}")

    # Part 3
    drop, attn = ["na"] * 3, "na"
    if "drop" in parts and real:
        drop = [f"{x:.3f}" if isinstance(x, float) else str(x).lower() for x in drop_finished(real, device)]
    if "attn" in parts:
        attn = f"{decode_attention(device):.3f}"
    print(f"RESULT sampler_vs_hf_tiny={tiny_ratio} sampler_vs_hf_0p5b={real_ratio} greedy_identical={identical} "
          f"ckpt_mem_ratio={ckpt_ratio} drop_finished_speedup_plan={drop[0]} drop_finished_speedup_code={drop[1]} "
          f"drop_finished_identical={drop[2]} decode_attn_repeat_over_packed={attn}")


if __name__ == "__main__":
    if args.mem_child is not None:
        mem_child(args.mem_path, args.mem_child == "1")
    else:
        main()
