"""Benchmark: two speed paths, each against the plain path it short-cuts, side by side on the recipe's shapes.

What it is: the evidence for keeping or removing (issue 48: a speed path stays only where it buys >= 5% of a recipe
step; recipe = Planner stage, 4 problems x G=8, plans <= 256 tokens, programs <= 512, the 0.5B in bf16 on a CPU).
  --parts logprob: grpo.token_logprobs on one Planner micro-batch (1 MBPP train problem x G=8, its real Planner
      prompt, random plans of 60-256 tokens): a reference forward without grad + a policy forward and backward (the
      reference + learn phases' work), with each group's shared prompt run once (grpo._shared_prompt_hidden, two
      length buckets) vs the plain forward (grpo.prepared_mask_ok patched to False), and with one bucket.
  --parts mask: agents.sample with the prepared 4D decode mask (agents._decode_mask) vs the plain 2D mask: 4 Planner
      prompts x G=8, 24 tokens (EOS off), at T=1 with one seed.
Runs alternate, best of --rounds; a step's share is the phase's saving times the phase's share of a step (README,
"What training does": a bf16 recipe step at 128 + 256 tokens was sampling 90 s, reference 9 s, learning 34 s).
What it is not: a whole-step measurement. Written for the trees that still had these paths: --parts mask runs on
commit b549b4f (agents._decode_mask left in a2418c6), --parts logprob on the commit that adds this file.
Run:   .venv/bin/python tests/bench/bench_speed_paths.py --parts logprob,mask    (~10-30 min on 2 cores)
Ends with: RESULT logprob_plain_over_shared=<...> logprob_one_bucket_over_two=<...> mask_2d_over_4d=<...>
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("--model", default=None, help="the 0.5B dir (default: tiny_model.real_model_dir())")
parser.add_argument("--parts", default="logprob,mask")
parser.add_argument("--rounds", type=int, default=2)
args = parser.parse_args()


def best_of(modes, run):
    """Alternate the modes `args.rounds` times; the fastest wall time of each."""
    best = {}
    for r in range(args.rounds):
        for name, patch in modes.items():
            restore = patch()
            t0 = time.perf_counter()
            try:
                run()
            finally:
                restore()
            dt = time.perf_counter() - t0
            best[name] = min(best.get(name, float("inf")), dt)
            print(f"round {r} {name}: {dt:.1f} s", flush=True)
    return best


def patcher(module, **attrs):
    def patch():
        old = {k: getattr(module, k) for k in attrs}
        for k, v in attrs.items():
            setattr(module, k, v)
        return lambda: [setattr(module, k, v) for k, v in old.items()]
    return patch


def main():
    import torch

    import agents
    import data
    import grpo
    from tiny_model import real_model_dir

    path = args.model or real_model_dir()[0]
    model, tok = agents.load_model(path, device="cpu", dtype="bf16")
    out = {}
    if "logprob" in args.parts:
        grpo.add_lora(model, "planner")
        g = torch.Generator().manual_seed(0)
        prompt = tok([agents.planner_prompt(tok, data.load("mbpp", split="train")[0])], add_special_tokens=False,
                     return_tensors="pt")["input_ids"]  # (1, P)
        G, P = 8, prompt.shape[1]
        lens = torch.randint(60, 257, (G,), generator=g)  # ragged plans <= 256 tokens
        T = int(lens.max())
        ids = torch.cat([prompt.repeat(G, 1), torch.randint(100, 20000, (G, T), generator=g)], 1)  # (G, P+T)
        am = torch.cat([torch.ones(G, P, dtype=torch.long), (torch.arange(T)[None] < lens[:, None]).long()], 1)
        print(f"logprob: P={P}, completion lengths {lens.tolist()}", flush=True)

        def step():
            with grpo.use_adapter(model, "planner"):
                with torch.no_grad(), grpo.adapters_off(model):
                    grpo.token_logprobs(model, ids, am, P)
                model.train()
                grpo.token_logprobs(model, ids, am, P).sum().backward()
                model.eval()

        best = best_of({"plain": patcher(grpo, prepared_mask_ok=lambda m: False), "shared": patcher(grpo),
                        "one_bucket": patcher(grpo, _length_buckets=lambda lengths, min_saving=0: [lengths.argsort()])},
                       step)
        out["logprob_plain_over_shared"] = best["plain"] / best["shared"]
        out["logprob_one_bucket_over_two"] = best["one_bucket"] / best["shared"]
    if "mask" in args.parts:
        prompts = [agents.planner_prompt(tok, p) for p in data.load("mbpp", split="train")[:4]]
        best = best_of({"4d": patcher(grpo), "2d": patcher(grpo, prepared_mask_ok=lambda m: False)},
                       lambda: agents.sample(model, tok, prompts, group_size=8, max_new_tokens=24, temperature=1.0,
                                             seed=0, eos_token_ids=()))
        out["mask_2d_over_4d"] = best["2d"] / best["4d"]
    print("RESULT " + " ".join(f"{k}={v:.3f}" for k, v in out.items()))


if __name__ == "__main__":
    main()
