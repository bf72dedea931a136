"""Evaluate code-generation methods on a benchmark: problems -> samples -> sandbox verdicts -> metrics.

What it is: a script. It loads one base model (plus optional per-role LoRA adapters), runs one or more methods
(`agents.METHODS`: direct, CoT, SCoT, Planner->Coder, Reflexion, MapCoder) on the same problems, executes every
program on the problem's hidden tests in the sandbox, and writes to <out>/: args.json (vars(args)), settings.json
(what decides the results; a resume must match it), <row>.jsonl (one line per problem: its n samples with program,
verdict, pass rate, CPU ms, peak MB and timings, appended chunk by chunk, so a kill loses one chunk; a row is a
method, or with --ablate one adapter combination of it) and summary.json (per row: pass@1, pass@5 when n >= 5, apr,
cpu_ms, peak_mb, cg, problems, samples, wall_s); then prints one comparison table. Under torchrun each chunk is
split over the ranks and rank 0 writes the same files a single process would (README, "Many GPUs").

What it is not: a sampler, a sandbox or a metric library (agents.py, sandbox.py and rewards.py are); this file only
wires them together and keeps the books. train.py's held-out evaluation reuses `attempt_and_judge`.

References: the pass@k estimator of Chen et al. 2021; APR and Collaboration Gain as in ../shared/DESIGN.md.

Usage:
  python evaluate.py --bench mbpp         # direct, planner-coder, content-free-plan: greedy, CG and plan information
  python evaluate.py --method planner-coder content-free-plan other-plan --split validation   # the plan controls
  python evaluate.py --compare runs/eval/A runs/eval/B               # paired: gained / lost / McNemar p per row
  python evaluate.py --method planner-coder --adapter planner=P --adapter coder=C -n 5 --temperature 0.8
  python evaluate.py --method mapcoder --adapter retriever=R --adapter debugger=D --mapcoder-k 3 --mapcoder-t 5
  python evaluate.py --method planner-coder --ablate --adapter planner=P --adapter coder=C
      # rows planner-coder[planner+coder], [planner] (w/o Coder RL), [coder] (w/o Planner RL), [base]
"""
import argparse
import contextlib
import hashlib
import itertools
import json
import os
import sys
import time

import torch
from tqdm import tqdm

import agents
import data
import grpo
import rewards
from sandbox import SandboxPool

# Roles that can carry a LoRA adapter (`--adapter ROLE=DIR`); a new agent is one more name.
ADAPTER_ROLES = ("planner", "coder", "retriever", "debugger")

# What `python evaluate.py --bench mbpp` runs: direct coding, Planner -> Coder and the Coder with a content-free plan
# on the same problems, so the summary carries CoRe-Code's Collaboration Gain and plan information.
DEFAULT_METHODS = ("direct", "planner-coder", "content-free-plan")

# Collaboration Gain: a method with a helper agent -> the same Coder without it, on the same problems.
# A plain dict so later methods add one line.
CG_BASELINE = {"planner-coder": "direct", "planner-coder-plain": "direct", "given-plan": "direct", "mapcoder": "direct"}

# Plan information: pass@1 with the Planner's own plans minus pass@1 with one fixed content-free plan
# (agents.CONTENT_FREE_PLAN), on the same problems: what the plans tell the Coder beyond the problem itself. A Planner
# can raise planner-coder pass@1 toward direct coding by saying less; only plan information > 0 shows plans that help.
# given-plan: the plans of another run (--plans-from, e.g. a larger Planner's) in front of this Coder.
PLAN_INFO_BASELINE = {"planner-coder": "content-free-plan", "planner-coder-plain": "content-free-plan",
                      "given-plan": "content-free-plan"}

# --ablate: the roles whose trained adapters a method's ablation switches on and off. Each combination is its own
# row, named method[roles on] ("[base]" = none of them), e.g. planner-coder[planner] = "w/o Coder RL". Roles not
# listed keep whatever adapter was given. Ablation rows get no CG: direct coding runs with the given Coder adapter,
# which is the right baseline only for some of the combinations.
ABLATE_ROLES = {"planner-coder": ("planner", "coder"), "planner-coder-plain": ("planner", "coder"),
                "mapcoder": ("retriever", "debugger")}

# Settings that change what a results file measures. A resumed run must match them exactly; the rest
# (--limit, --method, --batch-size, --workers, --device, --out) may change between runs.
# our choice: --batch-size is not in the list although, when sampling, the batch layout shifts the
# random stream; results stay valid samples of the same distribution, which is what pass@k needs.
RESULT_SETTINGS = ("bench", "split", "data", "model", "dtype", "n", "temperature", "max_new_tokens",
                   "plan_max_new_tokens", "seed", "repair_rounds", "mapcoder_k", "mapcoder_t", "timing_repeats",
                   "adapters", "bench_option", "stop_on_failure", "planner_model")
# What a results file made before a setting existed was made with (so it still resumes).
SETTING_DEFAULTS = {"bench_option": [], "stop_on_failure": False, "planner_model": None}

# The methods in which the Planner writes (the ones --planner-model changes).
PLANNER_METHODS = ("planner-coder", "planner-coder-plain", "other-plan", "mapcoder")


class UsageError(Exception):
    """A problem with the user's inputs; main() prints it as one `error: ...` line and exits 2."""


class OneLineParser(argparse.ArgumentParser):
    """argparse with one error line (both scripts): the message and where to look, not ~20 lines of usage."""

    def error(self, message):
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


# ---------------------------------------------------------------------------------------------------
# Pure helpers (no model, no sandbox): unit-tested on hand-made records.


def first_failure(result) -> str:
    """The error message of the first non-passing test ("" when all passed or none says anything)."""
    return next((t.error for t in result.tests if t.verdict != "passed" and t.error), "")


def sample_record(attempt, result) -> dict:
    """One attempt + its sandbox result -> the JSON-ready dict stored per sample."""
    return {
        "program": attempt.program,
        "raw": attempt.raw,
        "plan": attempt.plan,
        "plan_cut": attempt.plan_cut,
        "rounds": attempt.rounds,
        "verdict": result.verdict,
        "passed": result.passed,
        "total": result.total,
        "pass_rate": result.pass_rate,
        "cpu_ms": 1000.0 * result.cpu_s,
        # MB here means MiB (2**20 bytes), the unit ru_maxrss-based tools usually print.
        "peak_mb": result.peak_bytes / 2**20,
        "wall_ms": 1000.0 * result.wall_s,
        # Short excerpt only: enough to see why a sample failed without bloating the file. The program-level
        # error (crash at import, timeout) first, else the first failing test's message.
        "error": (result.error or first_failure(result))[-500:],
    }


def method_metrics(records: list, n: int) -> dict:
    """Metrics of one method over its (non-empty list of) per-problem records (each with `samples`).

    pass@k is the unbiased estimator per problem (c passing out of its samples), averaged over problems;
    pass@5 only when n >= 5 (with fewer samples the estimator is undefined). APR is the mean fraction of
    hidden tests passed, per problem over its samples, then over problems. cpu_ms / peak_mb average
    over passing samples only, since a crashing program is trivially fast and small; None when nothing
    passes. wall_s sums the per-problem share of generation + execution time, so it stays meaningful
    across resumed runs.
    """
    out = {"problems": len(records), "samples": sum(len(r["samples"]) for r in records)}
    # A sample is correct when the sandbox says "passed" (all hidden tests), not when some rate rounds up.
    correct = [[s["verdict"] == "passed" for s in r["samples"]] for r in records]
    out["pass@1"] = rewards.mean_pass_at_k(correct, 1)
    if n >= 5:
        out["pass@5"] = rewards.mean_pass_at_k(correct, 5)
    # Nested per problem: rewards.apr averages each problem's samples first, so problems weigh the same.
    out["apr"] = rewards.apr([[s["pass_rate"] for s in r["samples"]] for r in records])
    passing = [s for r in records for s in r["samples"] if s["verdict"] == "passed"]
    out["cpu_ms"] = sum(s["cpu_ms"] for s in passing) / len(passing) if passing else None
    out["peak_mb"] = sum(s["peak_mb"] for s in passing) / len(passing) if passing else None
    out["wall_s"] = sum(r.get("wall_s", 0.0) for r in records)
    # Methods that write a plan: its format (agents.plan_stats), so a trained Planner's plans are compared with the
    # untrained one's on the same problems, including how many ran into --plan-max-new-tokens.
    samples = [s for r in records for s in r["samples"] if s.get("plan")]
    out.update(agents.plan_stats([s["plan"] for s in samples], [bool(s.get("plan_cut")) for s in samples]))
    return out


def first_passed(records: list) -> dict:
    """{problem id: did its first sample pass} (greedy: its only sample) -- the paired outcome of a problem."""
    return {r["id"]: r["samples"][0]["verdict"] == "passed" for r in records if r["samples"]}


def paired(a: dict, b: dict) -> dict:
    """A paired comparison of two {problem id: passed} maps on the problems both have: gained = solved by a only,
    lost = solved by b only, p = exact McNemar (rewards.mcnemar_exact). With n > 1 the first sample of each problem
    stands for it (our choice: pass@1's paired test needs one outcome per problem)."""
    common = sorted(set(a) & set(b))
    gained = sum(1 for k in common if a[k] and not b[k])
    lost = sum(1 for k in common if b[k] and not a[k])
    return {"problems": len(common), "a_passed": sum(a[k] for k in common), "b_passed": sum(b[k] for k in common),
            "gained": gained, "lost": lost, "p": rewards.mcnemar_exact(gained, lost)}


def summarize(records: dict, n: int, exact_apr: bool = True) -> dict:
    """{method: [per-problem records]} -> {method: metrics}, plus `cg` and `plan_info` where their baseline is present,
    each with its paired counts (`cg_gained`, `cg_lost`, `cg_p`; likewise `plan_info_*`).

    CG = pass@1(method) - pass@1(direct), plan_info = pass@1(planner-coder) - pass@1(content-free-plan), computed on
    the problems both rows have, so a partial run of one of them never compares different problem sets. exact_apr=False
    (tests skipped after a failure, --stop-on-failure): APR is None, since skipped tests would count as failed.
    """
    summary = {m: method_metrics(recs, n) for m, recs in records.items()}
    if not exact_apr:
        for m in summary.values():
            m["apr"] = None
    for key, baselines in (("cg", CG_BASELINE), ("plan_info", PLAN_INFO_BASELINE)):
        for method, baseline in baselines.items():
            if method not in records or baseline not in records:
                continue
            common = {r["id"] for r in records[method]} & {r["id"] for r in records[baseline]}
            if not common:
                continue
            with_helper = method_metrics([r for r in records[method] if r["id"] in common], n)["pass@1"]
            without = method_metrics([r for r in records[baseline] if r["id"] in common], n)["pass@1"]
            pair = paired(first_passed(records[method]), first_passed(records[baseline]))
            summary[method].update({key: with_helper - without, f"{key}_vs": baseline, f"{key}_gained": pair["gained"],
                                    f"{key}_lost": pair["lost"], f"{key}_p": pair["p"]})
    return summary


def row_files(path: str) -> dict:
    """--compare's input: a results dir -> {row name: its .jsonl}, or one row's .jsonl file -> {its name: it}."""
    if os.path.isfile(path) and path.endswith(".jsonl"):
        return {os.path.basename(path)[:-len(".jsonl")]: path}
    if not os.path.isdir(path):
        raise UsageError(f"--compare {path}: not a results dir or a <row>.jsonl file")
    rows = {name: os.path.join(path, f"{name}.jsonl") for name in all_row_names()}
    return {name: f for name, f in rows.items() if os.path.exists(f)}


def compare(path_a: str, path_b: str) -> str:
    """`--compare A B`: for every row that both hold (or the two given row files), pass@1 of each on their common
    problems and the paired counts: gained = solved in A only, lost = solved in B only, exact McNemar p. A table."""
    a, b = row_files(path_a), row_files(path_b)
    pairs = [(k, k) for k in a if k in b] if len(a) > 1 or len(b) > 1 else [(k, j) for k in a for j in b]
    if not pairs:
        raise UsageError(f"--compare: {path_a} and {path_b} hold no row in common (rows: {sorted(a)} / {sorted(b)})")
    lines = [("row", "problems", "A pass@1%", "B pass@1%", "A-B%", "gained", "lost", "p")]
    for ka, kb in pairs:
        ra, rb = first_passed(read_records(a[ka])), first_passed(read_records(b[kb]))
        pair = paired(ra, rb)
        if not pair["problems"]:
            continue
        pa, pb = (100.0 * pair[k] / pair["problems"] for k in ("a_passed", "b_passed"))
        lines.append((ka if ka == kb else f"{ka} vs {kb}", str(pair["problems"]), f"{pa:.1f}", f"{pb:.1f}",
                      f"{pa - pb:+.1f}", f"+{pair['gained']}", f"-{pair['lost']}", f"{pair['p']:.3g}"))
    if len(lines) == 1:
        raise UsageError(f"--compare: no problem in common between {path_a} and {path_b}")
    widths = [max(len(r[i]) for r in lines) for i in range(len(lines[0]))]
    out = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))) for r in lines]
    return "\n".join(out[:1] + ["-" * len(out[0])] + out[1:] + [
        "gained = solved in A only, lost = solved in B only (first sample per problem); p = exact McNemar"])


def ablation_rows(method: str) -> list:
    """[(row name, roles whose adapter is on)] for --ablate: every on/off combination of ABLATE_ROLES[method],
    all on first and none last: planner-coder[planner+coder], planner-coder[planner], planner-coder[coder],
    planner-coder[base]."""
    roles = ABLATE_ROLES[method]
    return [(f"{method}[{'+'.join(on) or 'base'}]", set(on))
            for k in range(len(roles), -1, -1) for on in itertools.combinations(roles, k)]


def result_rows(methods: list, ablate: bool, given: set) -> list:
    """The result rows of a run: [(row name, method, roles whose adapter is switched off)].

    Without --ablate one row per method, all given adapters on. With it, a method of ABLATE_ROLES whose ablated
    roles all have an adapter in `given` becomes one row per combination (`ablation_rows`); other methods stay one
    row. Raises UsageError when --ablate finds nothing to ablate.
    """
    rows = []
    for method in methods:
        roles = ABLATE_ROLES.get(method, ())
        if ablate and roles and set(roles) <= given:
            rows += [(name, method, set(roles) - on) for name, on in ablation_rows(method)]
        else:
            rows.append((method, method, set()))
    if ablate and all(name == method for name, method, _ in rows):
        need = "; ".join(f"{m}: " + " and ".join(f"--adapter {r}=DIR" for r in roles)
                         for m, roles in ABLATE_ROLES.items())
        raise UsageError(f"--ablate needs a method with all its ablated adapters given ({need})")
    return rows


def all_row_names() -> list:
    """Every row name a results dir can hold: each method, followed by its ablation rows."""
    names = []
    for method in agents.METHODS:
        names.append(method)
        if method in ABLATE_ROLES:
            names += [name for name, _ in ablation_rows(method)]
    return names


def format_table(summary: dict, n: int) -> str:
    """Plain-text, aligned comparison table; rates in percent, '-' where a value does not apply."""
    cols = ["method", "problems", "pass@1%"] + (["pass@5%"] if n >= 5 else []) + \
        ["apr%", "cpu_ms", "peak_mb", "cg%", "info%", "cut%", "wall_s"]

    def cell(v, scale=1.0, fmt="{:.1f}"):
        return "-" if v is None else fmt.format(scale * v)

    rows = [cols]
    for method, m in summary.items():
        row = [method, str(m["problems"]), cell(m["pass@1"], 100)]
        if n >= 5:
            row.append(cell(m.get("pass@5"), 100))
        row += [cell(m["apr"], 100), cell(m["cpu_ms"], fmt="{:.2f}"), cell(m["peak_mb"], fmt="{:.2f}"),
                cell(m.get("cg"), 100, "{:+.1f}"), cell(m.get("plan_info"), 100, "{:+.1f}"),
                cell(m.get("plan_cut_frac"), 100), cell(m["wall_s"])]
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(cols))]
    # Method names left-aligned, numbers right-aligned: columns of figures line up on the decimal point.
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
             for r in rows]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def format_pairs(summary: dict) -> str:
    """One line per paired difference in the summary (CG, plan information): points, gained / lost problems, p."""
    labels = (("cg", "CG"), ("plan_info", "plan information"))
    return "\n".join(f"{label} of {method} (vs {m[key + '_vs']}): {100 * m[key]:+.1f} points, +{m[key + '_gained']} / "
                     f"-{m[key + '_lost']} problems, exact McNemar p = {m[key + '_p']:.3g}"
                     for method, m in summary.items() for key, label in labels if key in m)


def adapter_digest(directory: str) -> str:
    """A hash of an adapter's content (its config and weights files): results are keyed on what an adapter is, not on
    where it lies, so an adapter overwritten at the same path is never mistaken for the one measured before."""
    h = hashlib.sha1()
    for name in sorted(os.listdir(directory)):
        if name.startswith("adapter_") and os.path.isfile(os.path.join(directory, name)):
            with open(os.path.join(directory, name), "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
    return h.hexdigest()[:16]


def default_out_dir(args) -> str:
    """runs/eval/<bench>-<split>-<model basename>-n<N>-t<T>-tok<plan budget>-<code budget>[-a<hash of the adapters'
    content>]: the settings a user changes most, so that changing one starts a new directory rather than an error."""
    model = os.path.basename(os.path.normpath(args.model))
    if getattr(args, "planner_model", None):
        model += "-planner-" + os.path.basename(os.path.normpath(args.planner_model))
    name = (f"{args.bench}-{args.split}-{model}-n{args.n}-t{args.temperature:g}"
            f"-tok{args.plan_max_new_tokens}-{args.max_new_tokens}")
    adapters = [f"{role}={adapter_digest(d)}" for role, d in sorted(args.adapters.items()) if d]
    if adapters:
        # Adapter dirs are often named just "planner" / "coder": a short hash of their content keeps trained runs
        # apart from the base model's and from each other; paths and digests are in settings.json.
        name += "-a" + hashlib.sha1("\n".join(adapters).encode()).hexdigest()[:8]
    if getattr(args, "plans_from", None) and os.path.isfile(args.plans_from):
        name += "-p" + file_digest(args.plans_from)  # given-plan: which plans (by content)
    return os.path.join("runs", "eval", name)


def result_settings(args) -> dict:
    """The settings that decide what is measured, with paths made absolute so cwd does not matter. Adapters are
    stored as one `<role>_adapter` key per role (the layout of results dirs made before --adapter existed)."""
    s = {k: getattr(args, k) for k in RESULT_SETTINGS if k != "adapters"}
    s.update({f"{r}_adapter": args.adapters.get(r) for r in ADAPTER_ROLES})
    for k in ("data", "model", "planner_model") + tuple(f"{r}_adapter" for r in ADAPTER_ROLES):
        if s[k] and os.path.exists(s[k]):
            s[k] = os.path.abspath(s[k])
    # The adapters' content decides the results; the path alone would let an overwritten adapter reuse old results.
    s.update({f"{r}_adapter_digest": adapter_digest(d) for r, d in args.adapters.items() if d})
    return s


def check_settings(path: str, settings: dict) -> None:
    """On a resume, refuse if any result-deciding setting differs from the one the results were made with."""
    if not os.path.exists(path):
        return
    with open(path) as f:
        old = json.load(f)
    diff = [f"{k}: {old.get(k, SETTING_DEFAULTS.get(k))!r} -> {v!r}" for k, v in settings.items()
            if old.get(k, SETTING_DEFAULTS.get(k)) != v]
    if diff:
        raise UsageError(f"{os.path.dirname(path)} holds results for other settings ({'; '.join(diff)}); "
                         "pass a different --out or delete that directory")


def write_settings(path: str, settings: dict) -> None:
    """Record the result-deciding settings on first use (check_settings has already vetted a resume)."""
    if not os.path.exists(path):
        with open(path, "w") as f:
            json.dump(settings, f, indent=2)


def read_records(path: str) -> list:
    """Per-problem records of one method file. A line cut short by a kill is dropped (and the file
    rewritten without it) so that appending continues on a clean line boundary."""
    if not os.path.exists(path):
        return []
    records, good = [], []
    # Bytes, not text: the size check below must compare like with like.
    with open(path, "rb") as f:
        for line in f:
            try:
                records.append(json.loads(line))
            except (json.JSONDecodeError, UnicodeDecodeError):
                # Only the last line can be partial (whole lines are appended); an unparseable one is redone.
                continue
            good.append(line if line.endswith(b"\n") else line + b"\n")
    if sum(map(len, good)) != os.path.getsize(path):
        with open(path, "wb") as f:
            f.writelines(good)
    return records


# Seconds per problem on a 2-core CPU (avx512_bf16), qwen2.5-coder-0.5b-instruct in bf16, greedy, default token
# caps; only for the rough estimate printed before a run. direct and planner-coder: the default run on all 500 MBPP
# test problems (842 s + 2402 s); the others: README "What to expect" (50 problems, an older prompt set).
CPU_SECONDS_PER_PROBLEM = {"direct": 1.7, "cot": 3.0, "scot": 2.3, "planner-coder": 4.8, "planner-coder-plain": 4.8,
                           "content-free-plan": 1.9, "given-plan": 1.9, "other-plan": 4.8, "reflexion": 10.9, "mapcoder": 41.4}


def duration(seconds: float) -> str:
    """A rough duration for a human: "40 s", "12 min", "3.5 h"."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


# A CPU without native bf16 runs the 0.5B in fp32: 2.5-4x slower on the avx512_bf16 CPU where both were timed, and a
# 2-core AMD VM without it ran ~6x the bf16 figures above. our choice 5: a rough middle.
FP32_CPU_FACTOR = 5.0


def time_estimate(methods: list, problems: int, n: int, budgets=(256, 512), fp32=False) -> str:
    """One line: roughly how long the run takes on a 2-core CPU with the 0.5B model (GPUs: far less). budgets: the
    plan and code token budgets; outputs mostly end before them, so time grows with their square root (halving both
    cut a run by ~30%)."""
    s = sum(CPU_SECONDS_PER_PROBLEM.get(m, 5.0) for m in methods) * problems * (sum(budgets) / 768) ** 0.5
    s *= FP32_CPU_FACTOR if fp32 else 1.0
    return (f"estimate: ~{duration(s)} on a 2-core CPU with the 0.5B model in {'fp32' if fp32 else 'bf16'} at n=1 "
            "(more samples or larger models take longer, a GPU far less); resumable: rerun the same command to "
            "continue")


def parse_adapters(pairs) -> dict:
    """`--adapter ROLE=DIR` values (train.py's too) -> {role: DIR, or None for `ROLE=none`: the bare base}.
    Checks each DIR before the model loads, so bad input costs a second, not a minute."""
    adapters = {}
    for pair in pairs:
        role, sep, directory = pair.partition("=")
        if not sep or role not in ADAPTER_ROLES or not directory:
            raise UsageError(f"--adapter {pair}: expected ROLE=DIR with ROLE one of {', '.join(ADAPTER_ROLES)}")
        if role in adapters:
            raise UsageError(f"--adapter {pair}: {role} is given twice")
        if directory != "none" and not os.path.isfile(os.path.join(directory, "adapter_config.json")):
            raise UsageError(f"--adapter {pair}: no adapter_config.json in {directory}; pass a directory written "
                             "by grpo.save_adapter (adapter_config.json + adapter_model.safetensors)")
        adapters[role] = None if directory == "none" else directory
    return adapters


def check_models(model, planner_model=None) -> None:
    """--model and --planner-model (when given) can be loaded: one UsageError line naming the flag otherwise."""
    for flag, name in (("--model", model), ("--planner-model", planner_model)):
        try:
            if name:
                agents.check_model(name)
        except (FileNotFoundError, ValueError) as e:
            raise UsageError(f"{flag}: {e}") from None


def base_for(role, model, planner_model=None):
    """The base model a role runs on: planner_model (--planner-model) for the Planner when given, else `model`."""
    return planner_model if role == "planner" and planner_model is not None else model


def load_adapters(model, adapters: dict, planner_model=None) -> set:
    """Load each given adapter under its role's name onto its role's base (base_for); returns the roles now carrying
    one."""
    for role, directory in adapters.items():
        if directory:
            try:
                grpo.load_adapter(base_for(role, model, planner_model), role, directory)
            except (FileNotFoundError, ValueError, KeyError) as e:  # e.g. an adapter trained on another base
                raise UsageError(f"--adapter {role}={directory}: {e}") from None
    return {role for role, directory in adapters.items() if directory}


def make_agent(model, roles_with_adapter, planner_model=None):
    """agent(role) -> context manager yielding the model that plays the role, with that role's LoRA adapter when one
    is loaded, else the bare base. planner_model: a second base model for the Planner (--planner-model), else
    `model` plays every role."""

    def agent(role):
        base = base_for(role, model, planner_model)
        if role in roles_with_adapter:
            return grpo.use_adapter(base, role)
        return grpo.adapters_off(base)

    return agent


def load_model_or_fail(args):
    """agents.load_model with a missing / unreadable model turned into one UsageError line.

    load_model's own messages are already one line that says what to pass; we only prefix the flag.
    """
    try:
        return agents.load_model(args.model, device=args.device, dtype=args.dtype)
    except (FileNotFoundError, ValueError) as e:
        raise UsageError(f"--model: {e}") from None


def other_plan_donors(problems: list, chunk: list) -> list:
    """other-plan's fixed derangement: the problem at index i of the evaluated list gets the plan written for the one
    at i + 1 (the last gets the first's), whatever the chunking. chunk: [(index, problem)]."""
    return [problems[(i + 1) % len(problems)] for i, _ in chunk]


def attempt_and_judge(method, model, tokenizer, problems, agent, pool, *, n=1, temperature=0.0, seed=0,
                      max_new_tokens=512, plan_max_new_tokens=256, repair_rounds=2, mapcoder_k=agents.MAPCODER_K,
                      mapcoder_t=agents.MAPCODER_T, repeat=1, stop_on_failure=False, donors=None, plans=None,
                      show=lambda text: None):
    """Run `method` on the problems (n attempts each) and judge every program on its problem's hidden tests, all
    of them in one pool.run (it spreads them over the workers). Returns one list of sample_record dicts per problem,
    and the seconds spent generating and executing. train.py's held-out evaluation is this call, greedy, n = 1.

    repeat: runs of each passing program (the sandbox keeps the min CPU time and the median peak memory); our
        choice 1 by default because pass@k and APR do not need it (--timing-repeats when comparing cpu_ms).
    stop_on_failure: skip the tests after the first failing one (functional / stdio; pass@k stays exact).
    donors: other-plan only, the problem whose plan each problem's Coder gets (`other_plan_donors`).
    plans: given-plan only, each problem's n (plan, cut) pairs.
    """
    show(f"generating {len(problems)} problems x n={n}")
    t0 = time.perf_counter()
    attempts = agents.run_method(method, model, tokenizer, problems, n=n, temperature=temperature,
                                 max_new_tokens=max_new_tokens, plan_max_new_tokens=plan_max_new_tokens, seed=seed,
                                 agent=agent, pool=pool, repair_rounds=repair_rounds, mapcoder_k=mapcoder_k,
                                 mapcoder_t=mapcoder_t, donors=donors, plans=plans) if problems else []
    t1 = time.perf_counter()
    show(f"executing {sum(map(len, attempts))} programs")
    jobs = [agents.problem_job(p, a.program, p.hidden_tests, repeat=repeat, stop_on_failure=stop_on_failure)
            for p, atts in zip(problems, attempts) for a in atts]
    results = iter(pool.run(jobs) if jobs else [])
    records = [[sample_record(a, next(results)) for a in atts] for atts in attempts]
    return records, t1 - t0, time.perf_counter() - t1


# ---------------------------------------------------------------------------------------------------
# The script.


def parse_args(argv=None):
    p = OneLineParser(description=__doc__.split("\n\n")[0])
    # --- what to evaluate ---
    p.add_argument("--bench", default="mbpp", choices=sorted(data.LOADERS),
                   help="benchmark (default: %(default)s)")
    p.add_argument("--split", default="test",
                   help="benchmark split; MBPP: test, validation, train, prompt (default: %(default)s)")
    p.add_argument("--data", default=None, metavar="PATH",
                   help="dataset file, overriding the default location (env CORECODE_<BENCH>, then ../shared/data)")
    p.add_argument("--bench-option", action="append", default=[], metavar="KEY=VALUE",
                   help="a benchmark loader option, repeatable: time_factor=2 (multiply every time limit, e.g. "
                        "for Python on limits set for C++), time_limit_s=S (codecontests / livebench per-test "
                        "limit), release=YYYY-MM-DD (livebench), include_generated=false (codecontests), ... "
                        "(an unknown key lists the benchmark's options; README: Data)")
    p.add_argument("--limit", type=int, default=None, metavar="N",
                   help="evaluate only the first N problems of the split")
    p.add_argument("--method", nargs="+", default=list(DEFAULT_METHODS), choices=list(agents.METHODS) + ["all"],
                   metavar="METHOD",
                   help=f"methods to run on the same problems, from {', '.join(agents.METHODS)}, or 'all' "
                        f"(default: {' '.join(DEFAULT_METHODS)}: CoRe-Code with its CG and plan information). "
                        "content-free-plan: the Coder given one fixed plan that says nothing; other-plan: the Coder "
                        "given the plan of the next problem in the list; planner-coder-plain: the Planner asked for "
                        "the four parts by name, without the skeleton (a format control); given-plan: the Coder "
                        "given the plans of another run (--plans-from; 'all' includes it only then)")
    p.add_argument("--plans-from", default=None, metavar="FILE",
                   help="given-plan: a <row>.jsonl of an earlier run whose samples carry plans (e.g. "
                        "planner-coder-plain of a larger model, the same split, n and problems); this run's Coder "
                        "writes one program from each of them")
    # --- model and adapters ---
    p.add_argument("--model", default=os.environ.get("CORECODE_MODEL") or agents.DEFAULT_MODEL, metavar="DIR",
                   help=f"HF model directory or hub id of the shared base model (default: $CORECODE_MODEL, else "
                        f"{agents.DEFAULT_MODEL}, downloaded by transformers on first use)")
    p.add_argument("--adapter", action="append", default=[], metavar="ROLE=DIR",
                   help=f"a LoRA adapter dir (grpo.save_adapter / PEFT format) for one role, repeatable; ROLE is one "
                        f"of {', '.join(ADAPTER_ROLES)}; a role without one is the bare base model")
    p.add_argument("--planner-model", default=None, metavar="DIR",
                   help="a second base model (HF dir or hub id) that plays the Planner, e.g. a larger one for a "
                        "smaller --model Coder; --adapter planner=DIR is then an adapter of it. It must share "
                        "--model's tokenizer. CG and plan information stay against --model's Coder (default: "
                        "--model plays every role)")
    p.add_argument("--device", default=None, help="torch device (default: cuda when available, else cpu)")
    p.add_argument("--dtype", default="auto", choices=["auto", *agents.DTYPES],
                   help="weights dtype; auto = bf16 on CUDA and on CPUs that compute bf16 natively "
                        "(avx512_bf16 / AMX), else fp32 (default: %(default)s)")
    # --- sampling ---
    p.add_argument("-n", "--n", type=int, default=1,
                   help="samples per problem; pass@5 needs n >= 5 (default: %(default)s)")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="sampling temperature; 0 = greedy (default: %(default)s); -n > 1 needs a temperature > 0")
    p.add_argument("--max-new-tokens", type=int, default=512,
                   help="token cap of each code completion (default: %(default)s)")
    p.add_argument("--plan-max-new-tokens", type=int, default=256,
                   help="token cap of each plan; CoT / SCoT get both caps together (default: %(default)s)")
    p.add_argument("--repair-rounds", type=int, default=2,
                   help="feedback rounds of iterative methods, e.g. Reflexion (default: %(default)s)")
    p.add_argument("--mapcoder-k", type=int, default=agents.MAPCODER_K, metavar="K",
                   help="mapcoder: similar problems recalled, one plan each (default: %(default)s, as MapCoder)")
    p.add_argument("--mapcoder-t", type=int, default=agents.MAPCODER_T, metavar="T",
                   help="mapcoder: debugging rounds per plan on the public tests (default: %(default)s, as MapCoder)")
    p.add_argument("--ablate", action="store_true",
                   help="adapter ablation on the same problems: planner-coder (with --adapter planner=P --adapter "
                        "coder=C) runs as four rows planner-coder[planner+coder], [planner] (w/o Coder RL), [coder] "
                        "(w/o Planner RL), [base]; likewise planner-coder-plain, and mapcoder with retriever and "
                        "debugger adapters. Works with --method all; ablation rows have no CG")
    p.add_argument("--seed", type=int, default=0,
                   help="base seed; each chunk uses seed + index of its first problem (default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=8,
                   help="problems generated together, each with n samples (default: %(default)s)")
    # --- execution and output ---
    p.add_argument("--workers", type=int, default=None, help="sandbox worker processes (default: CPU count)")
    p.add_argument("--stop-on-failure", action="store_true",
                   help="functional / stdio tests: stop a program at its first failing test (pass@k exact, APR not "
                        "reported); saves most of the CPU of wrong programs on contest benchmarks. Default: all "
                        "tests run, so APR is exact")
    p.add_argument("--timing-repeats", type=int, default=1, metavar="R",
                   help="run each passing program R times; cpu_ms = min, peak_mb = median (default: %(default)s)")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="output dir (default: runs/eval/<bench>-<split>-<model>-n<N>-t<T>-tok<plan>-<code> under "
                        "the current dir, "
                        "plus -a<8 hex digits> when adapters are given: a hash of their content; settings.json "
                        "lists their paths and digests); re-running with the same settings resumes it")
    p.add_argument("--compare", nargs=2, metavar=("A", "B"), default=None,
                   help="only compare two results dirs (or two <row>.jsonl files) problem by problem and exit: per "
                        "row pass@1 of each, gained / lost problems and the exact McNemar p; loads no model")
    args = p.parse_args(argv)
    if min(args.n, args.batch_size, args.timing_repeats, args.mapcoder_k) < 1:
        p.error("-n, --batch-size, --timing-repeats and --mapcoder-k must be >= 1")
    if args.mapcoder_t < 0:
        p.error("--mapcoder-t must be >= 0")
    if args.temperature < 0:
        p.error(f"--temperature must be >= 0 (0 = greedy), got {args.temperature:g}")
    if args.n > 1 and args.temperature == 0:
        p.error(f"-n {args.n} with --temperature 0 would repeat one greedy answer {args.n} times: pass a temperature "
                "> 0 (e.g. 0.8) to sample")
    if "all" in args.method:
        args.method = ["all"]
    if args.plans_from and not {"given-plan", "all"} & set(args.method):
        p.error("--plans-from is read only by --method given-plan")
    if "given-plan" in args.method and not args.plans_from:
        p.error("--method given-plan needs --plans-from FILE (the <row>.jsonl of a run whose samples carry plans)")
    return args


def load_problems(args) -> list:
    """Step 1: the problems, loaded before the model so a missing data file fails in a second, not a minute."""
    try:
        options = data.parse_bench_options(args.bench, args.bench_option)
        problems = data.load(args.bench, path=args.data, split=args.split, limit=args.limit, **options)
    except FileNotFoundError as e:
        raise UsageError(str(e)) from None
    except ValueError as e:  # unknown split, malformed record: data.py's message is already one line
        raise UsageError(str(e)) from None
    if not problems:
        raise UsageError(f"no problems in {args.bench}/{args.split} (check --split / --data)")
    return problems


def file_digest(path: str) -> str:
    """A short hash of a file's content."""
    h = hashlib.sha1()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:8]


def load_given_plans(path: str, problems: list, n: int) -> dict:
    """given-plan's plans: {problem id: [(plan, cut)] * n} from the <row>.jsonl of an earlier run, for every problem
    evaluated here. One UsageError line when the file cannot give each of them n plans."""
    if not os.path.isfile(path):
        raise UsageError(f"--plans-from {path}: no such file; pass the <row>.jsonl of a run with plans, e.g. "
                         "runs/eval/X/planner-coder-plain.jsonl")
    by_id = {r["id"]: [(s.get("plan", ""), bool(s.get("plan_cut"))) for s in r["samples"]]
             for r in read_records(path)}
    if not any(plan for pairs in by_id.values() for plan, _ in pairs):
        raise UsageError(f"--plans-from {path}: its samples carry no plans (a row of a method that writes one, "
                         "e.g. planner-coder-plain)")
    missing = [p.id for p in problems if p.id not in by_id]
    if missing:
        raise UsageError(f"--plans-from {path}: no plans for {len(missing)} of the {len(problems)} problems (first: "
                         f"{', '.join(map(str, missing[:3]))}); evaluate the same split and --limit as that run")
    wrong = [p.id for p in problems if len(by_id[p.id]) != n]
    if wrong:
        raise UsageError(f"--plans-from {path}: problem {wrong[0]} has {len(by_id[wrong[0]])} plans, this run "
                         f"asks for n = {n}; pass the -n of that run")
    return {p.id: by_id[p.id] for p in problems}


def check_given_plans(path: str, given: dict) -> None:
    """On a resume of the given-plan row, refuse results made from other plans: the results are keyed on the plans'
    text (each sample stores the plan it was coded from), not on the --plans-from path."""
    for r in read_records(path):
        if r["id"] in given and [s.get("plan", "") for s in r["samples"]] != [plan for plan, _ in given[r["id"]]]:
            raise UsageError(f"{path} holds results for other plans (problem {r['id']}) than --plans-from gives; "
                             "pass a different --out or delete that file")


def writable_out_dir(out_dir: str) -> None:
    """The out dir must be writable before a minute goes into loading the model. Nothing is created here: a run that
    never starts (a bad --model, nothing to resume) leaves no directory behind; the run makes it when it first
    writes (os.makedirs at that point)."""
    existing = os.path.abspath(out_dir)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise UsageError(f"--out {out_dir}: {existing} is a file, not a directory; pass another --out")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError(f"--out {out_dir}: not writable; pass another --out")


def evaluate_row(name, method, todo, problems, args, model, tokenizer, agent, pool, path, given=None):
    """Step 5 for one row: generate + execute its remaining problems chunk by chunk. Each chunk's lines are appended
    and flushed at once, so a killed run loses at most the chunk in flight. Under torchrun a chunk is --batch-size
    problems per rank, each rank takes its contiguous share, and rank 0 writes the gathered lines in order.
    given: given-plan's plans per problem id (load_given_plans)."""
    rank, world = grpo.rank_and_world()
    # disable=None: a bar on a terminal, none in a log file (the summary table is printed at the end).
    bar = tqdm(total=len(problems), initial=len(problems) - len(todo), desc=name, unit="problem",
               disable=None if rank == 0 else True)
    for start in range(0, len(todo), args.batch_size * world):
        whole = todo[start:start + args.batch_size * world]
        chunk = grpo.shard(whole, rank, world)
        # Seeded by the chunk's first problem index: a resumed run reuses the seeds it would have had.
        records, gen_s, exec_s = attempt_and_judge(
            method, model, tokenizer, [p for _, p in chunk], agent, pool, n=args.n, temperature=args.temperature,
            seed=args.seed + chunk[0][0] if chunk else 0, max_new_tokens=args.max_new_tokens,
            plan_max_new_tokens=args.plan_max_new_tokens, repair_rounds=args.repair_rounds,
            mapcoder_k=args.mapcoder_k, mapcoder_t=args.mapcoder_t, repeat=args.timing_repeats,
            stop_on_failure=args.stop_on_failure, show=lambda text: bar.set_postfix_str(text, refresh=True),
            donors=other_plan_donors(problems, chunk) if method == "other-plan" else None,
            plans=[given[p.id] for _, p in chunk] if method == "given-plan" else None)
        # Per-problem share of the chunk's time (generation is batched across problems).
        k = max(1, len(chunk))
        share = dict(gen_s=gen_s / k, exec_s=exec_s / k, wall_s=(gen_s + exec_s) / k)
        lines = [json.dumps({"id": p.id, "method": name, "samples": samples,
                             "passed": sum(s["verdict"] == "passed" for s in samples), **share}) + "\n"
                 for (_, p), samples in zip(chunk, records)]
        lines = [line for part in grpo.gather(lines) for line in part]  # every rank's, in chunk order
        if rank == 0:
            with open(path, "a") as f:
                f.writelines(lines)
                f.flush()
                os.fsync(f.fileno())
        bar.update(len(whole))
        if rank == 0 and bar.disable:  # a log file gets one line per chunk instead of the bar
            done = len(problems) - len(todo) + start + len(whole)
            print(f"{name}: {done}/{len(problems)} problems, {sum(json.loads(line)['passed'] > 0 for line in lines)}"
                  f"/{len(lines)} of this chunk passed, {gen_s + exec_s:.0f} s", flush=True)
    bar.close()


def write_summary(out_dir, problems, args) -> str:
    """Step 6: the summary over this run's problems of every row in the out dir (so a planner-coder run next to an
    earlier direct run still reports CG); summary.json and the table. Returns the summary's path."""
    ids = {p.id for p in problems}
    records = {}
    for name in all_row_names():
        recs = [r for r in read_records(os.path.join(out_dir, f"{name}.jsonl")) if r["id"] in ids]
        if recs:
            records[name] = recs
    summary = summarize(records, args.n, exact_apr=not args.stop_on_failure)
    summary_path = os.path.join(out_dir, "summary.json")
    with open(summary_path, "w") as f:
        json.dump(summary, f, indent=2)
    print(format_table(summary, args.n))
    if format_pairs(summary):
        print(format_pairs(summary))
    return summary_path


def run(args) -> str:
    """Steps 1-6 of the evaluation; returns the path of summary.json (None on ranks > 0). Raises UsageError on bad
    inputs, before anything is written."""
    methods = list(agents.METHODS) if args.method == ["all"] else list(dict.fromkeys(args.method))
    if not args.plans_from:
        methods = [m for m in methods if m != "given-plan"]  # 'all' without plans to give
    args.adapters = parse_adapters(args.adapter)
    out_dir = args.out or default_out_dir(args)
    # 1. Everything that can be wrong is checked before anything is printed or written: the out dir, the settings of
    # the results already in it, the model (seconds: agents.check_model), the data.
    writable_out_dir(out_dir)
    settings_path = os.path.join(out_dir, "settings.json")
    check_settings(settings_path, result_settings(args))
    check_models(args.model, args.planner_model)
    if args.planner_model and not set(PLANNER_METHODS) & set(methods):
        raise UsageError(f"--planner-model: none of the methods writes a plan (those that do: "
                         f"{', '.join(PLANNER_METHODS)})")
    problems = load_problems(args)
    if "other-plan" in methods and len(problems) < 2:
        raise UsageError("other-plan swaps plans between problems: it needs at least 2 (raise --limit)")
    given = load_given_plans(args.plans_from, problems, args.n) if "given-plan" in methods else None
    if given:
        check_given_plans(os.path.join(out_dir, "given-plan.jsonl"), given)
    rank, world = grpo.rank_and_world()
    say = print if rank == 0 else (lambda *a, **k: None)  # under torchrun rank 0 speaks for all
    say(f"{len(problems)} {args.bench}/{args.split} problems; methods: {', '.join(methods)}; out: {out_dir}")
    fp32 = str(args.device).startswith("cpu") and agents.resolve_dtype(args.dtype, "cpu") == torch.float32
    say(time_estimate(methods, len(problems), args.n, (args.plan_max_new_tokens, args.max_new_tokens), fp32))

    # 2. The rows (one per method, or one per adapter combination of an ablated method: --ablate); results already in
    # the out dir were made with the same settings (resume). The adapters were checked by parse_adapters above.
    rows = result_rows(methods, args.ablate, {role for role, d in args.adapters.items() if d})

    # 3. What is left to do per row: problems whose line is already in <row>.jsonl are skipped.
    todo = {}
    for name, _, _ in rows:
        done = {r["id"] for r in read_records(os.path.join(out_dir, f"{name}.jsonl"))}
        todo[name] = [(i, p) for i, p in enumerate(problems) if p.id not in done]
        if len(todo[name]) < len(problems):
            say(f"{name}: skipped {len(problems) - len(todo[name])} done problems, {len(todo[name])} to go")

    # 4. Model + adapters, only when there is generation left to do. Nothing is written to the out dir before this
    # succeeds, so a mistyped --model cannot leave a settings.json behind that blocks the rerun.
    model = tokenizer = planner_model = None
    loaded = set()
    if any(todo.values()):
        model, tokenizer = load_model_or_fail(args)
        if args.planner_model:
            try:
                planner_model = agents.load_second_model(args.planner_model, tokenizer, args.device, args.dtype)
            except (FileNotFoundError, ValueError) as e:
                raise UsageError(f"--planner-model: {e}") from None
        loaded = load_adapters(model, args.adapters, planner_model)
        say(f"model {args.model}{f' (Planner: {args.planner_model})' if planner_model else ''} on "
            f"{next(model.parameters()).device} "
            f"{str(next(model.parameters()).dtype).replace('torch.', '')}; "
            f"{'greedy' if args.temperature == 0 else f'temperature {args.temperature:g}'}, n={args.n} "
            f"(all arguments: {os.path.join(out_dir, 'args.json')})")
    if rank == 0:
        os.makedirs(out_dir, exist_ok=True)
        write_settings(settings_path, result_settings(args))
        with open(os.path.join(out_dir, "args.json"), "w") as f:
            json.dump(vars(args), f, indent=2)

    # 5. Generate + execute, row by row; an ablation row's agent has every loaded adapter but those it switches off.
    with SandboxPool(args.workers) if any(todo.values()) else contextlib.nullcontext() as pool:
        for name, method, off in rows:
            agent = make_agent(model, loaded - off, planner_model) if model is not None else None
            evaluate_row(name, method, todo[name], problems, args, model, tokenizer, agent, pool,
                         os.path.join(out_dir, f"{name}.jsonl"), given=given)
    # 6. Summary (rank 0 writes it).
    return write_summary(out_dir, problems, args) if rank == 0 else None


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.compare:
        try:
            print(compare(*args.compare))
        except UsageError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        return 0
    # (0, 1, device) under plain python; under torchrun the process group, rank r on cuda:LOCAL_RANK (or the CPU).
    rank, world, args.device = grpo.dist_setup(args.device)
    where = f"rank {rank}: " if world > 1 else ""
    try:
        summary_path = run(args)
    except UsageError as e:
        print(f"error: {where}{e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        # Every finished chunk is on disk (appended and fsynced): the same command skips it and continues.
        out = args.out or (default_out_dir(args) if hasattr(args, "adapters") else "the out dir")
        print(f"\n{where}interrupted: finished chunks are saved in {out}; the same command continues where this one "
              "stopped", file=sys.stderr)
        return 130
    except Exception as e:
        if world == 1:
            raise
        # One line naming the rank; torchrun then stops the other ranks and exits non-zero.
        print(f"error: {where}{type(e).__name__}: {e}".splitlines()[0], file=sys.stderr)
        return 1
    finally:
        grpo.dist_teardown()
    if summary_path:
        print(f"summary: {summary_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
