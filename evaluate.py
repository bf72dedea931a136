"""Evaluate code-generation methods on a benchmark: problems -> programs -> sandbox verdicts ->
metrics.

What it is: a script. It loads one base model (plus optional per-role LoRA adapters) as an
agents.Team, runs one or more methods (METHODS: direct, CoT, SCoT, Planner -> Coder, the plan
controls, Reflexion, MapCoder) on the same problems, executes every program on the problem's hidden
tests in the sandbox, and writes to the run directory (--out):
  args.json      vars(args)
  settings.json  what decides the results (a resumed run must match it) and the sandbox's mode
  <method>.jsonl one line per problem: its n samples with program, verdict, pass rate, CPU ms,
                 peak MB; appended chunk by chunk, so a stop loses at most the chunk in flight
  summary.json   per method: pass@1, pass@5 (n >= 5), apr, cpu_ms, peak_mb, cg, plan_info, ...
and prints one comparison table. train.py's held-out evaluation is `held_out_eval` below.

What it is not: a sampler, a sandbox or a metric library (agents.py, sandbox.py and rewards.py are);
this file wires them together and keeps the books. Its last section is the command-line plumbing
that train.py shares (the flags both scripts take, the one error path).

References: the pass@k estimator of Chen et al. 2021; APR and Collaboration Gain as in the CoRe-Code
paper; Reflexion (Shinn et al. 2023); MapCoder (Islam et al. 2024); Structured CoT (Li et al. 2023).

Usage:
  python evaluate.py --bench mbpp   # direct, planner-coder, the plan controls: CG, plan info
  python evaluate.py --method planner-coder restatement other-plan --split validation
  python evaluate.py --compare runs/eval/A runs/eval/B   # paired: gained / lost / McNemar p
  python evaluate.py --method planner-coder --adapter planner=P --adapter coder=C -n 5 \
      --temperature 0.8
  python evaluate.py --method mapcoder --adapter retriever=R --adapter debugger=D
"""
import argparse
import contextlib
import dataclasses
import hashlib
import json
import os
import shlex
import signal
import sys
import time
from dataclasses import dataclass

import torch
from tqdm import tqdm

import agents
import data
import grpo
import rewards
import sandbox

# -------------------------------------------------------------------------------------------------
# The methods. Each is a chain of roles (agents.run_chain); the plan controls give the Coder a text
# instead of a Planner's plan; Reflexion and MapCoder loop over public-test feedback.


@dataclass(frozen=True)
class Method:
    chain: tuple = ("coder",)   # the roles, in order
    # where the Coder's plan comes from: "control", "other", "given" or "" (none)
    plan: str = ""
    template: str = ""          # CoT / SCoT: agents.REASONING_PROMPTS' key
    loop: object = None         # Reflexion / MapCoder: the function that runs the whole method


METHODS = {
    "direct": Method(),
    "cot": Method(chain=("reasoner",), template="cot"),
    "scot": Method(chain=("reasoner",), template="scot"),
    "planner-coder": Method(chain=("planner", "coder")),
    "content-free-plan": Method(plan="control"),
    "generic-plan": Method(plan="control"),
    "restatement": Method(plan="control"),
    "other-plan": Method(plan="other"),
    "given-plan": Method(plan="given"),
    # The ceiling: plans written from the reference solution, stripped of code (agents.py's
    # reference planner; MBPP). Its <row>.jsonl is what given-plan --plans-from reads.
    "reference-plan": Method(chain=("reference-planner", "coder")),
    "reflexion": Method(loop=agents.reflexion),
    "mapcoder": Method(loop=agents.mapcoder),
}

# The plan controls: the Coder given a text that is not the Planner's own plan for the problem
# (`control_plan`), and other-plan (another problem's plan). Plan information = pass@1 with the
# Planner's own plans minus pass@1 with the strongest control present, on the same problems. A
# Planner can raise planner-coder toward direct coding by saying less or by restating the problem;
# only plan information > 0 shows plans that inform the Coder.
PLAN_CONTROLS = ("content-free-plan", "generic-plan", "restatement")
CONTROLS = (*PLAN_CONTROLS, "other-plan")
OWN_PLANS = ("planner-coder", "given-plan", "reference-plan")

# The generic control: one fixed plan of planning jargon that passes the format gate (gate label
# "ok") but names nothing of any problem. A text rule cannot tell it from a plan (its words are not
# in agents.GENERIC_WORDS), so this control, not the gate, catches a Planner that learned to write
# it. our choice of wording: the kind of plan the gate let through in an audit ("Input/Output:
# inputs -> output. Steps: 1. Return the result").
GENERIC_PLAN = (
    "Input/Output: parse the arguments into their native structures; emit the final aggregated "
    "answer.\n"
    "Steps: 1. Normalise the inputs into a canonical representation. 2. Traverse the structure "
    "while maintaining an accumulator of intermediate state. 3. Apply the core transformation to "
    "each element. 4. Combine the partial results into the answer.\n"
    "Conditions: guard boundary indices, empty collections and degenerate sizes.\n"
    "Loops: a single pass over the elements, terminating at exhaustion."
)


def control_plan(method, problem):
    """The text a plan control gives the Coder as its plan."""
    if method == "content-free-plan":
        return agents.CONTENT_FREE_PLAN
    if method == "generic-plan":
        return GENERIC_PLAN
    return agents.restatement_plan(problem)


# What `python evaluate.py --bench mbpp` runs: direct coding, Planner -> Coder and the plan controls
# on the same problems, so the summary carries CoRe-Code's Collaboration Gain and its plan
# information.
DEFAULT_METHODS = ("direct", "planner-coder", *PLAN_CONTROLS)

# Collaboration Gain: a method with a helper agent -> the same Coder without it, on the same
# problems.
CG_BASELINE = {"planner-coder": "direct", "given-plan": "direct", "reference-plan": "direct",
               "mapcoder": "direct"}



def run_method(team, method, problems, n=1, temperature=0.0, seed=0, donors=None, plans=None,
               show=lambda text: None):
    """Run one method on problems: n agents.Attempts per problem, in problem order (temperature 0:
    greedy).
    seed: one torch.Generator shared by all roles, so a run is reproducible. donors: other-plan's
    plan source per problem (default: the next problem). plans: given-plan's n (plan, truncated)
    pairs per problem. show(text): where sampling is. The caller chunks the problems (--batch-size)
    to bound memory."""
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; choose one of {sorted(METHODS)}")
    spec = METHODS[method]
    generator = torch.Generator(device=next(team.model.parameters()).device).manual_seed(seed)
    start = {"k": team.mapcoder_k}  # what the prompts read
    if spec.template:
        start["template"] = spec.template
    probs = list(problems)
    ctxs = [dict(start) for _ in problems]
    k = n  # samples of the chain's first role per context
    if spec.plan:
        probs, ctxs, k = _plan_contexts(team, method, problems, n, temperature, generator, donors,
                                        plans)
        ctxs = [dict(start, **c) for c in ctxs]
    if spec.loop is not None:
        leaves = spec.loop(team, probs, ctxs, n, temperature, generator)
    else:
        chain = [(role, k if j == 0 else 1, temperature) for j, role in enumerate(spec.chain)]
        _, leaves, _ = agents.run_chain(team, chain, probs, ctxs, generator, show)
    attempts = [agents.attempt(c) for c in leaves]
    return [attempts[i * n:(i + 1) * n] for i in range(len(problems))]


def _plan_contexts(team, method, problems, n, temperature, generator, donors, plans):
    """The starting contexts (and problems, repeated per plan) of a method that gives the Coder its
    plan: a control's text, the Planner's plans for donors[i] (other-plan), or given plans[i]
    (given-plan)."""
    source = METHODS[method].plan
    if source == "control":
        return list(problems), [{"plan": control_plan(method, p)} for p in problems], n
    if source == "other":
        donors = donors if donors is not None else problems[1:] + problems[:1]
        if len(problems) < 2 or len(donors) != len(problems) or any(
                d.id == p.id for d, p in zip(donors, problems)):
            raise ValueError("other-plan: donors must be one other problem per problem (at least 2 "
                             "problems)")
        chain = (("planner", n, temperature),)
        _, ctxs, _ = agents.run_chain(team, chain, donors, [{} for _ in donors], generator)
        plans = [[(c["plan"], c["plan_truncated"]) for c in ctxs[i * n:(i + 1) * n]]
                 for i in range(len(problems))]
    if plans is None or len(plans) != len(problems) or any(len(ps) != n for ps in plans):
        raise ValueError("given-plan needs n plans per problem (evaluate.py --plans-from FILE)")
    problems_per_plan = [p for p, ps in zip(problems, plans) for _ in ps]
    ctxs = [{"plan": plan, "plan_truncated": truncated} for ps in plans for plan, truncated in ps]
    return problems_per_plan, ctxs, 1


# Settings that change what a results file measures. A resumed run must match them exactly; the rest
# (--limit, --method, --batch-size, --workers, --device, --out) may change between runs. our choice:
# --batch-size is not in the list although, when sampling, the batch layout shifts the random
# stream; results stay valid samples of the same distribution, which is what pass@k needs.
RESULT_SETTINGS = ("bench", "split", "data", "model", "dtype", "n", "temperature", "max_new_tokens",
                   "plan_max_new_tokens", "seed", "repair_rounds", "mapcoder_k", "mapcoder_t",
                   "timing_repeats", "adapters", "bench_option", "stop_on_failure")

# -------------------------------------------------------------------------------------------------
# Records and metrics (no model, no sandbox): unit-tested on hand-made records.


def sample_record(attempt, result) -> dict:
    """One attempt + its sandbox result -> the JSON-ready dict stored per sample."""
    # Short excerpt only: enough to see why a sample failed without bloating the file. The
    # program-level error (crash at import, timeout) first, else the first failing test's message.
    failing = (t.error for t in result.tests if t.error and t.verdict != "passed")
    error = result.error or next(failing, "")
    return {
        "program": attempt.program, "raw": attempt.raw, "plan": attempt.plan,
        "plan_truncated": attempt.plan_truncated, "rounds": attempt.rounds,
        "plan_stripped": attempt.plan_stripped, "plan_leaks": attempt.plan_leaks,
        "verdict": result.verdict, "passed": result.passed, "total": result.total,
        "pass_rate": result.pass_rate, "cpu_ms": 1000.0 * result.cpu_s,
        "peak_mb": result.peak_bytes / 2**20,  # MiB, as ru_maxrss-based tools print
        "wall_ms": 1000.0 * result.wall_s, "error": error[-500:],
    }


def method_metrics(records: list, n: int) -> dict:
    """Metrics of one method over its (non-empty list of) per-problem records (each with `samples`).

    pass@k is the unbiased estimator per problem (c passing out of its samples), averaged over
    problems; pass@5 only when n >= 5 (with fewer samples the estimator is undefined). APR is the
    mean fraction of hidden tests passed, per problem over its samples, then over problems. cpu_ms /
    peak_mb average over passing samples only, since a crashing program is trivially fast and small;
    None when nothing passes. wall_s sums the per-problem share of generation + execution time, so
    it stays meaningful across resumed runs.
    """
    out = {"problems": len(records), "samples": sum(len(r["samples"]) for r in records)}
    # A sample is correct when the sandbox says "passed" (all hidden tests), not when some rate
    # rounds up.
    correct = [[s["verdict"] == "passed" for s in r["samples"]] for r in records]
    out["pass@1"] = rewards.mean_pass_at_k(correct, 1)
    if n >= 5:
        out["pass@5"] = rewards.mean_pass_at_k(correct, 5)
    # Nested per problem: rewards.apr averages each problem's samples first, so problems weigh the
    # same.
    out["apr"] = rewards.apr([[s["pass_rate"] for s in r["samples"]] for r in records])
    passing = [s for r in records for s in r["samples"] if s["verdict"] == "passed"]
    out["cpu_ms"] = sum(s["cpu_ms"] for s in passing) / len(passing) if passing else None
    out["peak_mb"] = sum(s["peak_mb"] for s in passing) / len(passing) if passing else None
    out["wall_s"] = sum(r.get("wall_s", 0.0) for r in records)
    # Methods that write a plan: its format (agents.plan_stats), so a trained Planner's plans are
    # compared with the untrained one's on the same problems, including how many ran into
    # --plan-max-new-tokens.
    samples = [s for r in records for s in r["samples"] if s.get("plan")]
    truncated = [bool(s.get("plan_truncated")) for s in samples]
    out.update(agents.plan_stats([s["plan"] for s in samples], truncated))
    stripped = [s.get("plan_stripped", 0) for s in samples]
    if any(stripped) or any(s.get("plan_leaks") for s in samples):  # reference plans
        out.update(plans_stripped=sum(map(bool, stripped)), lines_stripped=sum(stripped),
                   plans_leaking=sum(bool(s.get("plan_leaks")) for s in samples))
    return out


def first_passed(records: list) -> dict:
    """{problem id: did its first sample pass} (greedy: its only sample) -- the paired outcome of a
    problem."""
    return {r["id"]: r["samples"][0]["verdict"] == "passed" for r in records if r["samples"]}


def paired(a: dict, b: dict) -> dict:
    """A paired comparison of two {problem id: passed} maps on the problems both have: gained =
    solved by a only, lost = solved by b only, p = exact McNemar (rewards.mcnemar_exact). With n > 1
    the first sample of each problem stands for it (our choice: pass@1's paired test needs one
    outcome per problem)."""
    common = sorted(set(a) & set(b))
    gained = sum(1 for k in common if a[k] and not b[k])
    lost = sum(1 for k in common if b[k] and not a[k])
    return {"problems": len(common), "a_passed": sum(a[k] for k in common),
            "b_passed": sum(b[k] for k in common), "gained": gained, "lost": lost,
            "p": rewards.mcnemar_exact(gained, lost)}


def strongest(passed: dict, candidates: list) -> str:
    """The control that passes the most of the problems `passed` ({row: {id: passed}}) rows share;
    None when none of `candidates` is there. Ties go to the first candidate."""
    present = [c for c in candidates if c in passed]
    if not present:
        return None
    common = set.intersection(*(set(passed[c]) for c in present))
    return max(present, key=lambda c: sum(passed[c][k] for k in common))


def summarize(records: dict, n: int, exact_apr: bool = True) -> dict:
    """{row: [per-problem records]} -> {row: metrics}, plus `cg` (vs direct) and `plan_info` (vs the
    strongest plan control present, `plan_info_vs`) where their baseline is there, each with its
    paired counts (`cg_gained`, `cg_lost`, `cg_p`; likewise `plan_info_*`), computed on the problems
    both rows have, so a partial run of one of them never compares different problem sets.
    exact_apr=False (tests skipped after a failure, --stop-on-failure): APR is None, since skipped
    tests would count as failed."""
    summary = {m: method_metrics(recs, n) for m, recs in records.items()}
    if not exact_apr:
        for m in summary.values():
            m["apr"] = None
    passed = {m: first_passed(recs) for m, recs in records.items()}
    control = strongest(passed, CONTROLS)
    baselines = [("cg", CG_BASELINE)]
    if control:
        baselines.append(("plan_info", {m: control for m in OWN_PLANS}))
    for key, against in baselines:
        for method, baseline in against.items():
            ids = {r["id"] for r in records.get(baseline, [])}
            common = {r["id"] for r in records.get(method, [])} & ids
            if not common:
                continue
            pass1 = {m: method_metrics([r for r in records[m] if r["id"] in common], n)["pass@1"]
                     for m in (method, baseline)}
            pair = paired(passed[method], passed[baseline])
            gain = rewards.collaboration_gain(pass1[method], pass1[baseline])
            summary[method].update({key: gain, f"{key}_vs": baseline,
                                    f"{key}_gained": pair["gained"], f"{key}_lost": pair["lost"],
                                    f"{key}_p": pair["p"]})
    return summary


def row_files(path: str) -> dict:
    """--compare's input: a results dir -> {row name: its .jsonl}, or one row's .jsonl file -> {its
    name: it}."""
    if os.path.isfile(path) and path.endswith(".jsonl"):
        return {os.path.basename(path)[:-len(".jsonl")]: path}
    if not os.path.isdir(path):
        raise UsageError(f"--compare {path}: not a results dir or a <row>.jsonl file")
    rows = {name: os.path.join(path, f"{name}.jsonl") for name in METHODS}
    return {name: f for name, f in rows.items() if os.path.exists(f)}


def align(lines: list) -> list:
    """Rows of cells -> text lines: the first column left-aligned, the others right-aligned (figures
    line up on the decimal point), a rule under the header."""
    widths = [max(len(r[i]) for r in lines) for i in range(len(lines[0]))]
    out = []
    for row in lines:
        cells = [row[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(row[1:], widths[1:])]
        out.append("  ".join(cells))
    return out[:1] + ["-" * len(out[0])] + out[1:]


def compare(path_a: str, path_b: str) -> str:
    """`--compare A B`: for every row that both hold (or the two given row files), pass@1 of each on
    their common problems and the paired counts: gained = solved in A only, lost = solved in B only,
    exact McNemar p. A table."""
    a, b = row_files(path_a), row_files(path_b)
    if len(a) > 1 or len(b) > 1:
        pairs = [(k, k) for k in a if k in b]
    else:  # two row files: compare them whatever their names
        pairs = [(k, j) for k in a for j in b]
    if not pairs:
        raise UsageError(f"--compare: {path_a} and {path_b} hold no row in common (rows: "
                         f"{sorted(a)} / {sorted(b)})")
    lines = [("row", "problems", "A pass@1%", "B pass@1%", "A-B%", "gained", "lost", "p")]
    for ka, kb in pairs:
        pair = paired(first_passed(read_records(a[ka])), first_passed(read_records(b[kb])))
        if pair["problems"]:
            pa = 100.0 * pair["a_passed"] / pair["problems"]
            pb = 100.0 * pair["b_passed"] / pair["problems"]
            name = ka if ka == kb else f"{ka} vs {kb}"
            lines.append((name, str(pair["problems"]), f"{pa:.1f}", f"{pb:.1f}", f"{pa - pb:+.1f}",
                          f"+{pair['gained']}", f"-{pair['lost']}", f"{pair['p']:.3g}"))
    if len(lines) == 1:
        raise UsageError(f"--compare: no problem in common between {path_a} and {path_b}")
    return "\n".join(align(lines) + ["gained = solved in A only, lost = solved in B only (first "
                                      "sample per problem); p = exact McNemar"])


def format_table(summary: dict, n: int) -> str:
    """Plain-text, aligned comparison table; rates in percent, '-' where a value does not apply."""
    cols = ["method", "problems", "pass@1%"] + (["pass@5%"] if n >= 5 else []) + \
        ["apr%", "cpu_ms", "peak_mb", "cg%", "info%", "truncated%", "wall_s"]

    def cell(v, scale=1.0, fmt="{:.1f}"):
        return "-" if v is None else fmt.format(scale * v)

    rows = [cols]
    for method, m in summary.items():
        row = [method, str(m["problems"]), cell(m["pass@1"], 100)]
        if n >= 5:
            row.append(cell(m.get("pass@5"), 100))
        row += [cell(m["apr"], 100), cell(m["cpu_ms"], fmt="{:.2f}"),
                cell(m["peak_mb"], fmt="{:.2f}"),
                cell(m.get("cg"), 100, "{:+.1f}"), cell(m.get("plan_info"), 100, "{:+.1f}"),
                cell(m.get("plan_truncated_frac"), 100), cell(m["wall_s"])]
        rows.append(row)
    return "\n".join(align(rows))


def format_pairs(summary: dict) -> str:
    """One line per paired difference in the summary (CG, plan information): points, gained / lost
    problems, p."""
    labels = (("cg", "CG"), ("plan_info", "plan information"))
    lines = []
    for method, m in summary.items():
        for key, label in labels:
            if key in m:
                lines.append(f"{label} of {method} (vs {m[key + '_vs']}): {100 * m[key]:+.1f} "
                             f"points, +{m[key + '_gained']} / -{m[key + '_lost']} problems, exact "
                             f"McNemar p = {m[key + '_p']:.3g}")
    return "\n".join(lines)


def read_records(path: str) -> list:
    """Per-problem records of one row's file. A line left unfinished by a kill is dropped (and the
    file rewritten without it) so that appending continues on a clean line boundary."""
    if not os.path.exists(path):
        return []
    records, good = [], []
    with open(path, "rb") as f:  # bytes, not text: the size check below must compare like with like
        for line in f:
            try:
                records.append(json.loads(line))
            except (json.JSONDecodeError, UnicodeDecodeError):
                # only the last line can be partial (whole lines are appended); it is redone
                continue
            good.append(line if line.endswith(b"\n") else line + b"\n")
    if sum(map(len, good)) != os.path.getsize(path):
        with open(path, "wb") as f:
            f.writelines(good)
    return records


# -------------------------------------------------------------------------------------------------
# One chunk of one row: generate, then judge every program in the sandbox.


def other_plan_donors(problems: list, chunk: list) -> list:
    """other-plan's fixed derangement: the problem at index i of the evaluated list gets the plan
    written for the one at i + 1 (the last gets the first's), whatever the chunking. chunk: [(index,
    problem)]."""
    return [problems[(i + 1) % len(problems)] for i, _ in chunk]


def attempt_and_judge(team, method, problems, *, n=1, temperature=0.0, seed=0, repeat=1,
                      stop_on_failure=False, donors=None, plans=None, show=lambda text: None):
    """Run `method` on the problems (n attempts each, run_method) and judge every program on its
    problem's hidden tests, all of them in one pool.run (it spreads them over the workers). Returns
    one list of sample_record dicts per problem, and the seconds spent generating and executing.
    train.py's held-out evaluation is this call, greedy, n = 1.

    repeat: runs of each passing program (the sandbox keeps the min CPU time and the median peak
        memory); 1 by default because pass@k and APR do not need it (--timing-repeats when comparing
        cpu_ms).
    stop_on_failure: skip the tests after the first failing one (functional / stdio; pass@k stays
        exact).
    donors: other-plan's donor per problem (`other_plan_donors`). plans: given-plan's n (plan,
        truncated) pairs per problem.
    """
    show(f"generating {len(problems)} problems x n={n}")
    t0 = time.perf_counter()
    attempts = []
    if problems:
        attempts = run_method(team, method, problems, n=n, temperature=temperature, seed=seed,
                              donors=donors, plans=plans, show=show)
    t1 = time.perf_counter()
    show(f"executing {sum(map(len, attempts))} programs")
    jobs = [agents.problem_job(p, a.program, p.hidden_tests, repeat=repeat,
                               stop_on_failure=stop_on_failure)
            for p, atts in zip(problems, attempts) for a in atts]
    results = iter(team.pool.run(jobs) if jobs else [])
    records = [[sample_record(a, next(results)) for a in atts] for atts in attempts]
    return records, t1 - t0, time.perf_counter() - t1


def evaluate_row(team, method, todo, problems, args, path, given=None, later=0):
    """Generate + execute one method's remaining problems (todo: [(index, problem)]) chunk by chunk.
    Each chunk's lines are appended and flushed at once, so a stopped run loses at most the chunk in
    flight. given: given-plan's plans per problem id. later: the problems the methods after this one
    have left, for the run's estimated time left (at this method's pace so far)."""
    # disable=None: a bar on a terminal, none in a log file (a line per chunk there instead, with
    # the time left, and where the chunk in flight is at most once a minute).
    bar = tqdm(total=len(problems), initial=len(problems) - len(todo), desc=method, unit="problem",
               disable=None)
    show = progress(bar, lambda: f"{method}: ")
    t_row = time.time()
    for start in range(0, len(todo), args.batch_size):
        chunk = todo[start:start + args.batch_size]
        # Seeded by the chunk's first problem index: a resumed run reuses the seeds it would have.
        records, gen_s, exec_s = attempt_and_judge(
            team, method, [p for _, p in chunk], n=args.n, temperature=args.temperature,
            seed=args.seed + chunk[0][0], repeat=args.timing_repeats,
            stop_on_failure=args.stop_on_failure, show=show,
            donors=other_plan_donors(problems, chunk) if method == "other-plan" else None,
            plans=[given[p.id] for _, p in chunk] if method == "given-plan" else None)
        k = len(chunk)  # each problem's share of the chunk's time (generation is batched)
        share = dict(gen_s=gen_s / k, exec_s=exec_s / k, wall_s=(gen_s + exec_s) / k)
        lines = []
        for (_, p), samples in zip(chunk, records):
            passed = sum(s["verdict"] == "passed" for s in samples)
            lines.append(json.dumps({"id": p.id, "method": method, "samples": samples,
                                     "passed": passed, **share}) + "\n")
        with open(path, "a") as f:
            f.writelines(lines)
            f.flush()
            os.fsync(f.fileno())
        bar.update(len(chunk))
        if bar.disable:
            done = len(problems) - len(todo) + start + len(chunk)
            pace = (time.time() - t_row) / (start + len(chunk))  # seconds a problem so far
            passed = sum(json.loads(line)["passed"] > 0 for line in lines)
            print(f"{method}: {done}/{len(problems)} problems, {passed}/{len(lines)} of this chunk "
                  f"passed, {gen_s + exec_s:.0f} s | ~{duration(pace * (len(problems) - done))} "
                  f"left in this method, ~{duration(pace * (len(problems) - done + later))} in the "
                  "run at this pace")
    bar.close()


# -------------------------------------------------------------------------------------------------
# The held-out evaluation train.py runs at step 0, every --eval-every steps and at the end: greedy
# pass@1 of the trained role's method, of direct coding (CG) and of the plan controls (plan
# information).


def held_out_eval(team, method, problems, path, *, step0_path=None, coder_frozen=False, seed=0,
                  batch_size=16, show=lambda text: None):
    """Greedy pass@1 of `method`, of direct coding and (for a method with its own plans) of the plan
    controls on the held-out problems, summarized as evaluate.py's own rows are (`summarize`: CG,
    plan information against the strongest control with its paired counts, the plans' format),
    and paired with the method's rows in step0_path (exact McNemar on the same problems). The rows
    go to `path` (JSON lines). coder_frozen: direct coding and the plan controls, whose programs
    only the frozen Coder writes, are read back from step0_path instead of run again. Returns
    (metrics, one line)."""
    controls = PLAN_CONTROLS if method in OWN_PLANS else ()
    at_start = _read_held_out(step0_path) if step0_path else {}
    records, t0 = {}, time.time()
    for m in dict.fromkeys((method, "direct", *controls)):
        old = at_start.get(m, [])
        if coder_frozen and m != method and len(old) == len(problems):
            records[m] = [dict(r, cached_from_step=0) for r in old]
        else:
            records[m] = _held_out_records(team, m, problems, seed, batch_size, show)
    s = summarize(records, n=1)
    out = {eval_key(m): s[m]["pass@1"] for m in records}
    out.update({"eval_" + k: v for k, v in s[method].items()
                if k.startswith("plan_") and not k.startswith("plan_info")})
    if "cg" in s[method]:
        out["eval_cg"] = s[method]["cg"]
    if "plan_info" in s[method]:
        out.update(eval_plan_info=s[method]["plan_info"], eval_info_vs=s[method]["plan_info_vs"],
                   eval_info_gained=s[method]["plan_info_gained"],
                   eval_info_lost=s[method]["plan_info_lost"], eval_info_p=s[method]["plan_info_p"])
    if at_start.get(method):  # gained = solved now only, lost = solved at step 0 only
        pair = paired(first_passed(records[method]), first_passed(at_start[method]))
        out.update(eval_gained=pair["gained"], eval_lost=pair["lost"], eval_mcnemar_p=pair["p"])
    out["t_eval"] = time.time() - t0
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path + ".tmp", "w") as f:
        f.writelines(json.dumps(r) + "\n" for rows in records.values() for r in rows)
    os.replace(path + ".tmp", path)
    return out, held_out_line(out, method)


def eval_key(method):
    """The metrics key of a method's held-out pass@1: eval_pass1_planner_coder, eval_pass1_direct,
    ..."""
    return "eval_pass1_" + method.replace("-", "_")


def held_out_line(m, method):
    """The held-out evaluation in words: pass@1 of the method and of direct coding, CG, plan
    information against the strongest control with its paired counts, and the paired comparison with
    step 0."""
    line = f" eval {method} {m[eval_key(method)]:.3f}"
    if "eval_cg" in m:
        line += f" direct {m['eval_pass1_direct']:.3f} CG {m['eval_cg']:+.3f}"
    if "eval_plan_info" in m:
        line += (f" plan info {m['eval_plan_info']:+.3f} vs {m['eval_info_vs']} "
                 f"(+{m['eval_info_gained']} -{m['eval_info_lost']} p={m['eval_info_p']:.3g})")
    if "eval_mcnemar_p" in m:
        line += f" vs step 0: +{m['eval_gained']} -{m['eval_lost']} p={m['eval_mcnemar_p']:.3g}"
    return line


def _held_out_records(team, method, problems, seed, batch_size, show):
    """One method's per-problem records (the rows' format), batch_size problems at a time."""
    records = []
    for a in range(0, len(problems), batch_size):
        chunk = problems[a:a + batch_size]
        samples, _, _ = attempt_and_judge(team, method, chunk, seed=seed,
                                          show=lambda text: show(f"held-out {method}: {text}"))
        records += [{"id": p.id, "method": method, "samples": s} for p, s in zip(chunk, samples)]
    return records


def _read_held_out(path):
    """{method: [per-problem records]} of a held-out evaluation ({} when there is none)."""
    records = {}
    if os.path.exists(path):
        with open(path) as f:
            for r in (json.loads(line) for line in f if line.strip()):
                records.setdefault(r["method"], []).append(r)
    return records


# -------------------------------------------------------------------------------------------------
# The script: arguments, inputs checked before anything loads, rows, summary.


def parse_args(argv=None):
    p = parser(__doc__.split("\n\n")[0])
    p.add_argument("--method", nargs="+", default=list(DEFAULT_METHODS), choices=[*METHODS, "all"],
                   metavar="METHOD",
                   help=f"methods run on the same problems: {', '.join(METHODS)}, or all (default: "
                        f"{' '.join(DEFAULT_METHODS)}; README, Evaluate, says what each one is)")
    p.add_argument("--plans-from", default=None, metavar="FILE",
                   help="given-plan: the <row>.jsonl of an earlier run whose samples carry plans")
    p.add_argument("-n", "--n", type=at_least(1), default=1, help="samples per problem; pass@5 "
                                                                  "needs n >= 5")
    p.add_argument("--temperature", type=at_least(0.0, float), default=0.0,
                   help="sampling temperature; 0 = greedy; -n > 1 needs a temperature > 0")
    p.add_argument("--repair-rounds", type=at_least(0), default=2, help="Reflexion's feedback "
                                                                        "rounds")
    p.add_argument("--batch-size", type=at_least(1), default=8, help="problems generated together")
    p.add_argument("--mapcoder-k", type=at_least(1), default=agents.MAPCODER_K, metavar="K",
                   help="MapCoder: similar problems recalled, one plan each (default: 3, as "
                        "MapCoder)")
    p.add_argument("--mapcoder-t", type=at_least(0), default=agents.MAPCODER_T, metavar="T",
                   help="MapCoder: debugging rounds per plan on the public tests (default: 5, as "
                        "MapCoder)")
    p.add_argument("--timing-repeats", type=at_least(1), default=1, metavar="R",
                   help="executions of each passing program: CPU time = min, peak memory = median")
    p.add_argument("--stop-on-failure", action="store_true",
                   help="functional / stdio tests: stop a program at its first failing test "
                        "(pass@k exact, APR not); saves most of the CPU of wrong programs on "
                        "contest benchmarks")
    p.add_argument("--compare", nargs=2, metavar=("A", "B"), default=None,
                   help="compare two run directories (or <row>.jsonl files) problem by problem and "
                        "exit: per row pass@1 of each, gained / lost problems, exact McNemar p; no "
                        "model")
    args = p.parse_args(argv)
    if args.n > 1 and args.temperature == 0:
        p.error(f"-n {args.n} with --temperature 0 would repeat one greedy answer {args.n} times: "
                f"pass a temperature > 0 (e.g. 0.8) to sample")
    if args.plans_from and not {"given-plan", "all"} & set(args.method):
        p.error("--plans-from is read only by --method given-plan")
    if "given-plan" in args.method and not args.plans_from:
        p.error("--method given-plan needs --plans-from FILE (the <row>.jsonl of a run whose "
                "samples carry plans)")
    if "all" in args.method:  # the evaluation methods: reference-plan reads the solution
        args.method = [m for m in METHODS if m != "reference-plan"]
    args.method = list(dict.fromkeys(args.method))
    if not args.plans_from:
        args.method = [m for m in args.method if m != "given-plan"]  # 'all' without plans to give
    return args


def default_out_dir(args) -> str:
    """runs/eval/<bench>-<split>-<model>-n<N>-t<T>-tok<plan limit>-<code limit>[-a<hash of the
    adapters' content>][-p<hash of the given plans>]: the settings a user changes most, so that
    changing one starts a new run directory rather than an error."""
    model = os.path.basename(os.path.normpath(args.model))
    name = (f"{args.bench}-{args.split}-{model}-n{args.n}-t{args.temperature:g}"
            f"-tok{args.plan_max_new_tokens}-{args.max_new_tokens}")
    adapters = [f"{role}={digest(d)}" for role, d in sorted(args.adapters.items()) if d]
    if adapters:  # adapter dirs are often just "planner" / "coder": their content keeps runs apart
        name += "-a" + hashlib.sha1("\n".join(adapters).encode()).hexdigest()[:8]
    if args.plans_from and os.path.isfile(args.plans_from):
        name += "-p" + digest(args.plans_from)[:8]
    return os.path.join("runs", "eval", name)


def load_problems(args) -> list:
    """The problems, loaded before the model so a missing data file fails in a second, not a
    minute."""
    try:
        problems = data.load(args.bench, path=args.data, split=args.split, limit=args.limit,
                             **args.bench_kwargs)
    except (FileNotFoundError, ValueError) as e:  # data.py's message is already one line
        raise UsageError(str(e)) from None
    if not problems:
        raise UsageError(f"no problems in {args.bench}/{args.split} (check --split / --data)")
    return problems


def load_given_plans(path: str, problems: list, n: int) -> dict:
    """given-plan's plans: {problem id: [(plan, truncated)] * n} from the <row>.jsonl of an earlier
    run, for every problem evaluated here. One UsageError line when the file cannot give each of
    them n plans."""
    if not os.path.isfile(path):
        raise UsageError(f"--plans-from {path}: no such file; pass the <row>.jsonl of a run with "
                         f"plans, e.g. runs/eval/X/planner-coder.jsonl")
    by_id = {}
    for r in read_records(path):
        by_id[r["id"]] = [(s.get("plan", ""), bool(s.get("plan_truncated"))) for s in r["samples"]]
    if not any(plan for pairs in by_id.values() for plan, _ in pairs):
        raise UsageError(f"--plans-from {path}: its samples carry no plans (a row of a method that "
                         f"writes one, e.g. planner-coder)")
    wrong = [p.id for p in problems if len(by_id.get(p.id, [])) != n]
    if wrong:
        raise UsageError(f"--plans-from {path}: problem {wrong[0]} has "
                         f"{len(by_id.get(wrong[0], []))} plans, this run asks for n = {n} "
                         f"(evaluate the same split, --limit and -n)")
    return {p.id: by_id[p.id] for p in problems}


def check_evaluation(args) -> tuple:
    """Everything that can be wrong, checked before anything is printed or written: the adapters,
    the model, the run directory and the settings of the results already in it, the data, the given
    plans. Returns (run directory, problems, given plans or None)."""
    args.adapters = parse_adapters(args.adapter)  # the default run directory names their content
    out_dir = args.out or default_out_dir(args)
    check_inputs(args, out_dir, RESULT_SETTINGS, "results")
    problems = load_problems(args)
    if "other-plan" in args.method and len(problems) < 2:
        raise UsageError("other-plan swaps plans between problems: it needs at least 2 (raise "
                         "--limit)")
    unreferenced = [p.id for p in problems if not p.reference.strip()]
    if "reference-plan" in args.method and unreferenced:
        raise UsageError(f"reference-plan writes plans from the reference solution, and "
                         f"{unreferenced[0]} has none ({args.bench} ships none: use mbpp)")
    given = None
    if "given-plan" in args.method:
        given = load_given_plans(args.plans_from, problems, args.n)
    return out_dir, problems, given


def write_summary(out_dir, problems, args, mode) -> str:
    """The summary over this run's problems of every row in the run directory (so a planner-coder
    run next to an earlier direct run still reports CG) and the sandbox's mode: summary.json and the
    table."""
    ids = {p.id for p in problems}
    records = {}
    for name in METHODS:
        recs = [r for r in read_records(os.path.join(out_dir, f"{name}.jsonl")) if r["id"] in ids]
        if recs:
            records[name] = recs
    summary = summarize(records, args.n, exact_apr=not args.stop_on_failure)
    path = os.path.join(out_dir, "summary.json")
    with open(path, "w") as f:
        json.dump({**summary, "sandbox": mode}, f, indent=2)
    print(format_table(summary, args.n))
    if format_pairs(summary):
        print(format_pairs(summary))
    return path


def evaluate(args) -> str:
    """Check the inputs, then per method generate + execute what is left (rows already in the run
    directory were made with the same settings: a resume), then the summary. Returns summary.json's
    path."""
    out_dir, problems, given = check_evaluation(args)
    print(f"{len(problems)} {args.bench}/{args.split} problems; methods: {', '.join(args.method)}; "
          f"run directory: {out_dir}")
    todo = {}  # per method, the problems not yet in its <row>.jsonl
    for method in args.method:
        done = {r["id"] for r in read_records(os.path.join(out_dir, f"{method}.jsonl"))}
        todo[method] = [(i, p) for i, p in enumerate(problems) if p.id not in done]
        if len(todo[method]) < len(problems):
            print(f"{method}: skipped {len(problems) - len(todo[method])} done problems, "
                  f"{len(todo[method])} to go")
    # The pool starts even with nothing left to run: the summary records its mode.
    with open_pool(args) as pool:
        print(sandbox.mode_line(pool.mode))
        # The model, only when there is generation left to do; nothing is written to the run
        # directory before it loads, so a mistyped --model cannot leave a settings.json behind.
        team = load_team(args, pool) if any(todo.values()) else None
        if team is not None:
            print(model_line(args, team))
        write_run_files(out_dir, args, RESULT_SETTINGS, pool.mode)
        left = sum(map(len, todo.values()))
        print(f"work: {left} problem-rows to run ({len(problems)} problems x {len(todo)} methods, "
              f"n={args.n}, programs <= {args.max_new_tokens} tokens, plans <= "
              f"{args.plan_max_new_tokens}); the time left follows each chunk")
        for method, rows in todo.items():
            left -= len(rows)
            path = os.path.join(out_dir, f"{method}.jsonl")
            evaluate_row(team, method, rows, problems, args, path, given, later=left)
        return write_summary(out_dir, problems, args, pool.mode)


def model_line(args, team):
    """What generates: the model, its device and dtype, greedy or the
    temperature."""
    weights = next(team.model.parameters())
    how = "greedy" if args.temperature == 0 else f"temperature {args.temperature:g}"
    return (f"model {args.model} on {weights.device} {str(weights.dtype)[6:]}; {how}, n={args.n} "
            f"(all arguments: {os.path.join(args.out or default_out_dir(args), 'args.json')})")


def stopped_line(args, argv):
    """What a stopped evaluation kept and how to continue it."""
    again = f"python evaluate.py {shlex.join(sys.argv[1:] if argv is None else argv)}"
    out_dir = args.out or (default_out_dir(args) if hasattr(args, "adapters") else None)
    rows = [n for n in METHODS if out_dir and os.path.exists(os.path.join(out_dir, f"{n}.jsonl"))]
    if not rows:
        return f"no chunk had finished: nothing saved; start again with: {again}"
    return (f"finished chunks are saved in {out_dir} ({', '.join(rows)}); the same command "
            f"continues where this one stopped: {again}")


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.compare:
        try:
            print(compare(*args.compare))
        except UsageError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        return 0
    summary = []
    rc = cli(lambda a: summary.append(evaluate(a)), args, lambda: stopped_line(args, argv))
    if rc == 0 and summary[0]:
        print(f"summary: {summary[0]}")
    return rc


# -------------------------------------------------------------------------------------------------
# The command line both scripts share (train.py imports it): the flags both take, argparse types for
# ranges, the checks of inputs made before anything slow, the team and the sandbox pool, one error
# path.


class UsageError(Exception):
    """A problem with the user's inputs; `cli` prints it as one `error: ...` line and exits 2."""


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """--help shows each default once: argparse's "(default: X)" only where the help does not say
    it, and never "(default: None)"."""

    def _get_help_string(self, action):
        silent = action.default is None or action.default is False or action.default == []
        if silent or "default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


class OneLineParser(argparse.ArgumentParser):
    """argparse with one error line: the message and where to look, not ~20 lines of usage."""

    def error(self, message):
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


def at_least(lo, kind=int):
    """An argparse type: a `kind` number >= lo, else argparse's one error line naming the flag."""

    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if value < lo:
            raise argparse.ArgumentTypeError(f"must be >= {lo:g}, got {text}")
        return value

    return parse


# Roles that can carry a LoRA adapter (`--adapter ROLE=DIR`); a new agent is one more name.
ADAPTER_ROLES = ("planner", "coder", "retriever", "debugger")


def parser(description, **defaults):
    """The argument parser of either script with the flags both take; defaults: {dest: value} that
    this script sets otherwise (train.py: split="train")."""
    p = OneLineParser(description=description, formatter_class=HelpFormatter)
    model = os.environ.get("CORECODE_MODEL") or agents.DEFAULT_MODEL
    d = {"split": "test", "model": model, **defaults}
    # data
    p.add_argument("--bench", default="mbpp", choices=sorted(data.LOADERS), help="benchmark")
    p.add_argument("--data", default=None, metavar="PATH",
                   help="dataset file (default: $CORECODE_<BENCH>, else data.py's default path)")
    p.add_argument("--bench-option", action="append", default=[], metavar="KEY=VALUE",
                   help="a benchmark loader option, repeatable, e.g. time_factor=2")
    p.add_argument("--split", default=d["split"], help="split (MBPP: test, validation, train)")
    p.add_argument("--limit", type=at_least(1), metavar="N", help="only the first N problems")
    # models
    p.add_argument("--model", default=d["model"], metavar="DIR",
                   help=f"model directory or hub id (default: $CORECODE_MODEL or "
                        f"{agents.DEFAULT_MODEL})")
    p.add_argument("--adapter", action="append", default=[], metavar="ROLE=DIR",
                   help=f"a role's LoRA adapter ({', '.join(ADAPTER_ROLES)}), repeatable; "
                        "DIR none: the bare base")
    p.add_argument("--device", help="torch device (default: cuda when available, else cpu)")
    p.add_argument("--dtype", default="auto", choices=["auto", *agents.DTYPES],
                   help="auto = bf16 on CUDA and on CPUs with native bf16, else fp32")
    p.add_argument("--max-new-tokens", type=at_least(1), default=512, metavar="N",
                   help="token limit of each program")
    p.add_argument("--plan-max-new-tokens", type=at_least(1), default=256, metavar="N",
                   help="token limit of each plan (CoT / SCoT: both limits together)")
    # execution and output
    p.add_argument("--seed", type=int, default=0, help="base seed of sampling")
    p.add_argument("--workers", type=at_least(1), help="sandbox workers (default: the CPU count)")
    p.add_argument("--allow-unisolated", action="store_true",
                   help="execute generated code although the sandbox cannot isolate it")
    p.add_argument("--allow-uncounted", action="store_true",
                   help="use CPU / memory figures the sandbox cannot count in full (no cgroup)")
    p.add_argument("--out", metavar="DIR", help="the run directory")
    return p


def check_inputs(args, out_dir, keys, what):
    """The checks both scripts make before anything slow, each one UsageError line: the adapters
    (args.adapters: {role: DIR or None}), the benchmark options (args.bench_kwargs), the models, and
    the run directory: writable, and holding no `what` made with other settings (`keys` of args).
    Returns the settings. Nothing is created: a run that never starts leaves no directory behind."""
    args.adapters = parse_adapters(args.adapter)
    try:
        args.bench_kwargs = data.parse_bench_options(args.bench, args.bench_option)
    except ValueError as e:
        raise UsageError(str(e)) from None
    try:
        agents.check_model(args.model)
    except (FileNotFoundError, ValueError) as e:
        raise UsageError(f"--model: {e}") from None
    existing = os.path.abspath(out_dir)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise UsageError(f"--out {out_dir}: {existing} is a file, not a directory; pass another "
                         f"--out")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError(f"--out {out_dir}: not writable; pass another --out")
    settings = settings_of(args, keys)
    path = os.path.join(out_dir, "settings.json")
    if what and os.path.exists(path):
        with open(path) as f:
            old = json.load(f)
        diff = [f"{k}: {old.get(k)!r} -> {v!r}" for k, v in settings.items() if old.get(k) != v]
        if diff:
            raise UsageError(f"{out_dir} holds {what} made with other settings "
                             f"({'; '.join(diff)}); keep them or pass a different --out")
    return settings


def write_run_files(out_dir, args, keys, mode):
    """args.json (every argument) and, for a new run, settings.json (what decides its results, and
    the sandbox's mode: recorded, not compared, since the pool checks it when it starts)."""
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "settings.json")
    if not os.path.exists(path):
        with open(path, "w") as f:
            json.dump({**settings_of(args, keys), "sandbox": mode}, f, indent=1)
    with open(os.path.join(out_dir, "args.json"), "w") as f:
        json.dump(vars(args), f, indent=1)


def digest(path: str) -> str:
    """A short hash of a file's content, or of a directory's adapter files (adapter_*): results are
    keyed on what an adapter or a plans file is, not on where it lies."""
    if os.path.isfile(path):
        files = [path]
    else:
        names = sorted(n for n in os.listdir(path) if n.startswith("adapter_"))
        files = [os.path.join(path, n) for n in names]
    h = hashlib.sha1()
    for name in files:
        with open(name, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()[:16]


def settings_of(args, keys) -> dict:
    """The settings that decide what a run computes: `keys` of args, paths made absolute so the
    working directory does not matter, and one `<role>_adapter` + `<role>_adapter_digest` pair per
    role."""
    s = {k: getattr(args, k) for k in keys if k != "adapters"}
    s.update({f"{r}_adapter": args.adapters.get(r) for r in ADAPTER_ROLES})
    s.update({f"{r}_adapter_digest": digest(d) for r, d in args.adapters.items() if d})
    plans = getattr(args, "plans_from", None)
    if plans and os.path.isfile(plans):
        s["plans_digest"] = digest(plans)  # given-plan's results come from these plans
    for k, v in s.items():
        if k in ("data", "model") or k.endswith("_adapter"):
            s[k] = os.path.abspath(v) if v and os.path.exists(v) else v
    return json.loads(json.dumps(s))  # tuples -> lists, as the file stores them


def parse_adapters(pairs) -> dict:
    """`--adapter ROLE=DIR` values -> {role: DIR, or None for `ROLE=none`: the bare base}. Checks
    each DIR before the model loads, so bad input costs a second, not a minute."""
    adapters = {}
    for pair in pairs:
        role, sep, directory = pair.partition("=")
        if not sep or role not in ADAPTER_ROLES or not directory:
            raise UsageError(f"--adapter {pair}: expected ROLE=DIR with ROLE one of "
                             f"{', '.join(ADAPTER_ROLES)}")
        if role in adapters:
            raise UsageError(f"--adapter {pair}: {role} is given twice")
        config = os.path.join(directory, "adapter_config.json")
        if directory != "none" and not os.path.isfile(config):
            raise UsageError(f"--adapter {pair}: no adapter_config.json in {directory}; pass a "
                             f"directory written by grpo.save_adapter (adapter_config.json + "
                             f"adapter_model.safetensors)")
        adapters[role] = None if directory == "none" else directory
    return adapters


def load_team(args, pool=None):
    """--model loaded, each given adapter (args.adapters) loaded onto it, the token limits and
    MapCoder's
    settings: an agents.Team. One UsageError line for what cannot load."""
    try:
        model, tokenizer = agents.load_model(args.model, device=args.device, dtype=args.dtype)
    except (FileNotFoundError, ValueError) as e:
        raise UsageError(f"--model: {e}") from None
    team = agents.Team(model, tokenizer, frozenset(r for r, d in args.adapters.items() if d),
                       args.max_new_tokens, args.plan_max_new_tokens, pool,
                       getattr(args, "repair_rounds", 2),
                       getattr(args, "mapcoder_k", agents.MAPCODER_K),
                       getattr(args, "mapcoder_t", agents.MAPCODER_T))
    for role in team.adapters:
        try:
            grpo.load_adapter(model, role, args.adapters[role])
        # e.g. an adapter trained on another base
        except (FileNotFoundError, ValueError, KeyError) as e:
            raise UsageError(f"--adapter {role}={args.adapters[role]}: {e}") from None
    return team


# The benchmarks whose problems carry a memory limit that is part of the verdict (elsewhere the
# limit only guards the machine): the sandbox must hold it for the whole execution
# (sandbox.refusal), or --allow-uncounted says to judge anyway.
MEMORY_LIMITED = ("codecontests", "codeforces")


def open_pool(args, need_cpu=False, need_memory=False):
    """The sandbox pool, with its mode checked (sandbox.refusal): executions that could read the
    user's files are refused unless --allow-unisolated; a time or memory reward term the sandbox
    cannot count in full, or a benchmark's memory limits it cannot hold (MEMORY_LIMITED), unless
    --allow-uncounted. The benchmark's file is hidden from every execution (a program that read it
    could run the reference solution); the project and the installed packages always are."""
    try:
        protect = [data.resolve_path(args.bench, args.data)]
    except FileNotFoundError as e:
        raise UsageError(str(e)) from None
    pool = sandbox.SandboxPool(args.workers, protect=protect)
    why = sandbox.refusal(pool.mode, need_cpu=need_cpu,
                          need_memory=need_memory or args.bench in MEMORY_LIMITED,
                          allow_unisolated=args.allow_unisolated,
                          allow_uncounted=args.allow_uncounted)
    if why:
        pool.close()
        raise UsageError(why)
    return pool


@contextlib.contextmanager
def open_team(args, need_cpu=False, need_memory=False):
    """The sandbox pool (open_pool) and the team (load_team) with it, for as long as a run lasts;
    the pool's workers are shut down however the run ends."""
    with open_pool(args, need_cpu=need_cpu, need_memory=need_memory) as pool:
        yield load_team(args, pool)


def stop_on_sigterm(signum, frame):
    """SIGTERM (kill, timeout, a job scheduler, a closed terminal) stops a run as Ctrl-C does: what
    is saved is kept and the closing line says how to continue; the exit status is then 143,
    Ctrl-C's 130."""
    raise KeyboardInterrupt(signum)


def cli(run, args, interrupted):
    """Run `run(args)` as both scripts do: stdout line-buffered (a log file gets each line as it is
    printed); a UsageError is one `error:` line and exit status 2; Ctrl-C or SIGTERM says what is
    saved and how to continue (interrupted() -> text), 130 or 143."""
    sys.stdout.reconfigure(line_buffering=True)
    # tqdm makes its write lock on first use; a Ctrl-C inside that would leave tqdm half set up and
    # the next write raise AttributeError instead. Made here, before any work, no stop can land in
    # it.
    tqdm.get_lock()
    signal.signal(signal.SIGTERM, stop_on_sigterm)
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        run(args)
        return 0
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        print(f"\ninterrupted: {interrupted()}", file=sys.stderr)
        return 143 if e.args == (signal.SIGTERM,) else 130


# our choice: off a terminal (a log file) a long phase prints where it is at most once a minute: a
# redirected log shows progress without a flood of bar redraws.
PROGRESS_EVERY_S = 60.0


def progress(bar, prefix, every_s=PROGRESS_EVERY_S):
    """show(text) for a long phase: on a terminal the text goes on the tqdm bar; in a log file (the
    bar disabled) a line `prefix() text (elapsed)` at most once every `every_s` seconds, the first
    at once."""
    t0, last = time.time(), [-every_s]

    def show(text):
        if not bar.disable:
            bar.set_postfix_str(text, refresh=True)
        elif time.time() - t0 - last[0] >= every_s:
            last[0] = time.time() - t0
            print(f"{prefix()}{text} ({duration(last[0])} in)")
    return show


def duration(seconds):
    """A time span in the reader's units: 45s, 12m, 3h05m."""
    seconds = int(seconds)
    if seconds < 90:
        return f"{seconds}s"
    if seconds < 5400:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


if __name__ == "__main__":
    sys.exit(main())
