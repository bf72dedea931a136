"""Evaluate code-generation methods on a benchmark: problems -> samples -> sandbox verdicts -> metrics.

What it is: a script. It loads one base model (plus optional per-role LoRA adapters) as an agents.Team, runs one or
more methods (`agents.METHODS`: direct, CoT, SCoT, Planner->Coder, the plan controls, Reflexion, MapCoder) on the same
problems, executes every program on the problem's hidden tests in the sandbox, and writes to <out>/: args.json
(vars(args)), settings.json (what decides the results; a resume must match it), <row>.jsonl (one line per problem:
its n samples with program, verdict, pass rate, CPU ms, peak MB and timings, appended chunk by chunk, so a kill loses
one chunk; a row is a method, or with --ablate one adapter combination of it) and summary.json (per row: pass@1,
pass@5 when n >= 5, apr, cpu_ms, peak_mb, cg, plan_info, problems, samples, wall_s, and the sandbox's mode); then
prints one comparison table. Under torchrun each chunk is split over the ranks and rank 0 writes the same files a
single process would (README, "Many GPUs").

It also holds what both scripts share on the command line (train.py imports it): the flag table, the argparse
range types, the settings comparison of a resume, the team loader and the one error path (`cli`).

What it is not: a sampler, a sandbox or a metric library (agents.py, sandbox.py and rewards.py are); this file only
wires them together and keeps the books. train.py's held-out evaluation reuses `attempt_and_judge`.

References: the pass@k estimator of Chen et al. 2021; APR and Collaboration Gain as in the CoRe-Code paper.

Usage:
  python evaluate.py --bench mbpp         # direct, planner-coder and the plan controls: greedy, CG, plan information
  python evaluate.py --method planner-coder content-free-plan generic-plan restatement other-plan --split validation
  python evaluate.py --compare runs/eval/A runs/eval/B               # paired: gained / lost / McNemar p per row
  python evaluate.py --method planner-coder --adapter planner=P --adapter coder=C -n 5 --temperature 0.8
  python evaluate.py --method mapcoder --adapter retriever=R --adapter debugger=D --mapcoder-k 3 --mapcoder-t 5
  python evaluate.py --method planner-coder --ablate --adapter planner=P --adapter coder=C
      # rows planner-coder[planner+coder], [planner] (w/o Coder RL), [coder] (w/o Planner RL), [base]
"""
import argparse
import dataclasses
import hashlib
import itertools
import json
import os
import shlex
import signal
import sys
import time

from tqdm import tqdm

import agents
import data
import grpo
import rewards
import sandbox

# Roles that can carry a LoRA adapter (`--adapter ROLE=DIR`); a new agent is one more name.
ADAPTER_ROLES = ("planner", "coder", "retriever", "debugger")

# What `python evaluate.py --bench mbpp` runs: direct coding, Planner -> Coder and the plan controls on the same
# problems, so the summary carries CoRe-Code's Collaboration Gain and its plan information.
DEFAULT_METHODS = ("direct", "planner-coder", *agents.PLAN_CONTROLS)

# The Planner -> Coder methods, one per Planner prompt (agents.PLANNER_TEMPLATES): planner-coder with the skeleton,
# planner-coder-<name> with each other prompt.
PLANNER_CODER = tuple("planner-coder" + ("" if t == "skeleton" else f"-{t}") for t in agents.PLANNER_TEMPLATES)

# Collaboration Gain: a method with a helper agent -> the same Coder without it, on the same problems.
CG_BASELINE = {**dict.fromkeys(PLANNER_CODER, "direct"), "given-plan": "direct", "mapcoder": "direct"}

# Plan information: pass@1 with the Planner's own plans minus pass@1 with the strongest plan control present (the
# Coder given a text that is not a plan for the problem: agents.PLAN_CONTROLS, or another problem's plan), on the same
# problems. A Planner can raise planner-coder toward direct coding by saying less or by restating the problem; only
# plan information > 0 against every control shows plans that inform the Coder.
OWN_PLANS = (*PLANNER_CODER, "given-plan")
CONTROLS = (*agents.PLAN_CONTROLS, "other-plan")

# --ablate: the roles whose trained adapters a method's ablation switches on and off. Each combination is its own
# row, named method[roles on] ("[base]" = none of them), e.g. planner-coder[planner] = "w/o Coder RL". Roles not
# listed keep whatever adapter was given. Ablation rows get no CG: direct coding runs with the given Coder adapter,
# which is the right baseline only for some of the combinations.
ABLATE_ROLES = {**dict.fromkeys(PLANNER_CODER, ("planner", "coder")), "mapcoder": ("retriever", "debugger")}

# Settings that change what a results file measures. A resumed run must match them exactly; the rest
# (--limit, --method, --batch-size, --workers, --device, --out) may change between runs.
# our choice: --batch-size is not in the list although, when sampling, the batch layout shifts the
# random stream; results stay valid samples of the same distribution, which is what pass@k needs.
RESULT_SETTINGS = ("bench", "split", "data", "model", "dtype", "n", "temperature", "max_new_tokens",
                   "plan_max_new_tokens", "seed", "repair_rounds", "mapcoder_k", "mapcoder_t", "timing_repeats",
                   "adapters", "bench_option", "stop_on_failure", "planner_model")

# The methods in which the Planner writes (the ones --planner-model changes).
PLANNER_METHODS = (*PLANNER_CODER, "other-plan", "mapcoder")


# ---------------------------------------------------------------------------------------------------
# The command line both scripts share: one flag table, argparse types for ranges, one error path.

class UsageError(Exception):
    """A problem with the user's inputs; `cli` prints it as one `error: ...` line and exits 2."""


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """--help shows each default once: argparse's "(default: X)" only where the help text does not say it."""

    def _get_help_string(self, action):
        return action.help if "default" in (action.help or "") else super()._get_help_string(action)


class OneLineParser(argparse.ArgumentParser):
    """argparse with one error line (both scripts): the message and where to look, not ~20 lines of usage."""

    def __init__(self, **kw):
        super().__init__(formatter_class=HelpFormatter, **kw)

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


# The flags both scripts take, one entry each (name -> argparse keywords); a script may change a default.
SHARED_FLAGS = {
    # data
    "--bench": dict(default="mbpp", choices=sorted(data.LOADERS), help="benchmark"),
    "--data": dict(default=None, metavar="PATH",
                   help="dataset file (default: $CORECODE_<BENCH>, else data.py's default location; README, Data)"),
    "--bench-option": dict(action="append", default=[], metavar="KEY=VALUE",
                           help="a benchmark loader option, repeatable: time_factor=2 (multiply every time limit, "
                                "e.g. for Python on limits set for C++), time_limit_s=S (codecontests / livebench), "
                                "release=YYYY-MM-DD (livebench), include_generated=false (codecontests), ... (an "
                                "unknown key lists the benchmark's options)"),
    "--split": dict(default="test", help="benchmark split; MBPP: test, validation, train, prompt"),
    "--limit": dict(type=at_least(1), default=None, metavar="N", help="only the first N problems of the split"),
    # model
    "--model": dict(default=None, metavar="DIR",  # add_shared_flags reads $CORECODE_MODEL when the parser is made
                    help=f"HF model directory or hub id of the shared base model (default: $CORECODE_MODEL, else "
                         f"{agents.DEFAULT_MODEL}, downloaded by transformers on first use)"),
    "--planner-model": dict(default=None, metavar="DIR",
                            help="a second base model (HF dir or hub id, sharing --model's tokenizer) that plays the "
                                 "Planner, e.g. a larger one for a smaller --model Coder; --adapter planner=DIR is "
                                 "then an adapter of it, and its bare weights the trained Planner's KL reference. CG "
                                 "and plan information stay against --model's Coder (default: --model plays every "
                                 "role)"),
    "--adapter": dict(action="append", default=[], metavar="ROLE=DIR",
                      help=f"a LoRA adapter dir (PEFT format) for one role, repeatable; ROLE is one of "
                           f"{', '.join(ADAPTER_ROLES)}, ROLE=none for the bare base; a role without one is the bare "
                           "base model"),
    "--device": dict(default=None, help="torch device: cuda, cpu, cuda:1 ... (default: cuda when available)"),
    "--dtype": dict(default="auto", choices=["auto", *agents.DTYPES],
                    help="weights dtype; auto = bf16 on CUDA and on CPUs that compute bf16 natively (avx512_bf16 / "
                         "AMX), else fp32 (default: auto)"),
    # roles
    "--max-new-tokens": dict(type=at_least(1), default=512, help="token cap of each code-writing completion"),
    "--plan-max-new-tokens": dict(type=at_least(1), default=256,
                                  help="token cap of each plan; CoT / SCoT get both caps together"),
    "--mapcoder-k": dict(type=at_least(1), default=agents.MAPCODER_K, metavar="K",
                         help="MapCoder: similar problems recalled, one plan each (default: 3, as MapCoder)"),
    "--mapcoder-t": dict(type=at_least(0), default=agents.MAPCODER_T, metavar="T",
                         help="MapCoder: debugging rounds per plan on the public tests (default: 5, as MapCoder)"),
    # execution and output
    "--seed": dict(type=int, default=0, help="base seed of sampling"),
    "--workers": dict(type=at_least(1), default=None, help="sandbox worker processes (default: CPU count)"),
    "--stop-on-failure": dict(action="store_true",
                              help="functional / stdio tests: stop a program at its first failing test (pass@k "
                                   "exact; the pass rate then counts the tests passed before it; saves most of the "
                                   "CPU of wrong programs on contest benchmarks). Default: all tests run"),
    "--timing-repeats": dict(type=at_least(1), default=1, metavar="R",
                             help="runs of each passing program: CPU time = min, peak memory = median"),
    "--allow-unisolated": dict(action="store_true",
                               help="run generated code although the sandbox cannot isolate runs from your files "
                                    "(refused by default; `python sandbox.py --probe` says what is missing)"),
    "--allow-uncounted": dict(action="store_true",
                              help="use CPU or memory figures the sandbox cannot count in full (no cgroup: it counts "
                                   "per process, and memfds, pipes or a second process escape it): a time or memory "
                                   "reward term (train.py), or the memory limits of CodeContests / Codeforces "
                                   "problems, which then hold per process only (refused by default; `python "
                                   "sandbox.py --probe` says what is missing)"),
    "--out": dict(default=None, metavar="DIR", help="output directory"),
}


def add_shared_flags(p, **defaults):
    """Add SHARED_FLAGS to parser p; defaults: {flag's dest: value} that this script sets otherwise."""
    defaults.setdefault("model", os.environ.get("CORECODE_MODEL") or agents.DEFAULT_MODEL)
    for name, kw in SHARED_FLAGS.items():
        dest = name[2:].replace("-", "_")
        p.add_argument(name, **(dict(kw, default=defaults[dest]) if dest in defaults else kw))


def stop_on_sigterm(signum, frame):
    """SIGTERM (kill, timeout, a job scheduler, a closed terminal) stops a run as Ctrl-C does: what is saved is kept
    and the closing line says how to continue; the exit status is then 143 (128 + 15), Ctrl-C's 130."""
    raise KeyboardInterrupt(signum)


def cli(run, args, interrupted):
    """Run `run(args)` as both scripts do: stdout line-buffered (a log file gets each line as it is printed); a
    UsageError is one `error:` line and exit status 2; Ctrl-C or SIGTERM says what is saved and how to continue
    (interrupted() -> text), 130 or 143; under torchrun another exception is one line naming the rank, 1."""
    sys.stdout.reconfigure(line_buffering=True)
    # tqdm makes its write lock on first use; Ctrl-C inside that leaves tqdm half set up and the next write raises
    # AttributeError instead of the KeyboardInterrupt. Made here, before any work, no stop can land in it.
    tqdm.get_lock()
    signal.signal(signal.SIGTERM, stop_on_sigterm)
    rank, world, args.device = grpo.dist_setup(args.device)
    where = f"rank {rank}: " if world > 1 else ""
    try:
        run(args)
        return 0
    except UsageError as e:
        print(f"error: {where}{e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        print(f"\n{where}interrupted: {interrupted()}", file=sys.stderr)
        return 143 if e.args == (signal.SIGTERM,) else 130
    except Exception as e:
        if world == 1:
            raise
        print(f"error: {where}{type(e).__name__}: {e}".splitlines()[0], file=sys.stderr)
        return 1
    finally:
        grpo.dist_teardown()


# our choice: off a terminal (a log file) a long phase prints where it is at most once a minute: a redirected log shows
# progress without a flood of bar redraws.
PROGRESS_EVERY_S = 60.0


def log_progress(prefix, every_s=PROGRESS_EVERY_S):
    """show(text) for a log file: prints `prefix() text (elapsed)` and the time since the last call, at most once
    every `every_s` seconds; the first call prints at once."""
    t0, last = time.time(), [-every_s]

    def show(text):
        if time.time() - t0 - last[0] >= every_s:
            last[0] = time.time() - t0
            print(f"{prefix()}{text} ({duration(last[0])} in)")
    return show


def duration(seconds):
    """A time span in the reader's units: 45s, 12m, 3h05m."""
    seconds = int(seconds)
    return f"{seconds}s" if seconds < 90 else f"{seconds // 60}m" if seconds < 5400 else \
        f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def digest(path: str) -> str:
    """A short hash of a file's content, or of a directory's adapter files (adapter_*): results are keyed on what an
    adapter or a plans file is, not on where it lies, so one overwritten in place is never mistaken for the old one."""
    files = [path] if os.path.isfile(path) else \
        [os.path.join(path, n) for n in sorted(os.listdir(path)) if n.startswith("adapter_")]
    h = hashlib.sha1()
    for name in files:
        with open(name, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()[:16]


def settings_of(args, keys) -> dict:
    """The settings that decide what a run computes: `keys` of args, paths made absolute so cwd does not matter, and
    one `<role>_adapter` + `<role>_adapter_digest` pair per role (adapters keyed by content)."""
    s = {k: getattr(args, k) for k in keys if k != "adapters"}
    s.update({f"{r}_adapter": args.adapters.get(r) for r in ADAPTER_ROLES})
    s.update({f"{r}_adapter_digest": digest(d) for r, d in args.adapters.items() if d})
    if getattr(args, "plans_from", None) and os.path.isfile(args.plans_from):
        s["plans_digest"] = digest(args.plans_from)  # given-plan's results come from these plans
    for k, v in s.items():
        if k in ("data", "model", "planner_model") or k.endswith("_adapter"):
            s[k] = os.path.abspath(v) if v and os.path.exists(v) else v
    return json.loads(json.dumps(s))  # tuples -> lists, as the file stores them


def check_settings(path: str, now: dict, what: str) -> None:
    """The settings in `path` (JSON) against `now`, field by field: one UsageError line listing every difference."""
    if not os.path.exists(path):
        return
    with open(path) as f:
        old = json.load(f)
    diff = [f"{k}: {old.get(k)!r} -> {v!r}" for k, v in now.items() if old.get(k) != v]
    if diff:
        raise UsageError(f"{os.path.dirname(path) or '.'} holds {what} made with other settings ({'; '.join(diff)}); "
                         "keep them or pass a different --out")


def parse_adapters(pairs) -> dict:
    """`--adapter ROLE=DIR` values -> {role: DIR, or None for `ROLE=none`: the bare base}. Checks each DIR before the
    model loads, so bad input costs a second, not a minute."""
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


def check_models(args) -> None:
    """--model and --planner-model can be loaded (seconds: agents.check_model): one UsageError line otherwise."""
    for flag, name in (("--model", args.model), ("--planner-model", args.planner_model)):
        try:
            if name:
                agents.check_model(name)
        except (FileNotFoundError, ValueError) as e:
            raise UsageError(f"{flag}: {e}") from None


def load_team(args, pool=None):
    """The team of both scripts: --model (and --planner-model) loaded, each given adapter (args.adapters) loaded onto
    its role's base, the token caps and MapCoder's settings. One UsageError line for anything that cannot load."""
    try:
        model, tokenizer = agents.load_model(args.model, device=args.device, dtype=args.dtype)
        planner = agents.load_second_model(args.planner_model, tokenizer, args.device, args.dtype) \
            if args.planner_model else None
    except (FileNotFoundError, ValueError) as e:
        raise UsageError(f"--model: {e}") from None
    team = agents.Team(model, tokenizer, frozenset(r for r, d in args.adapters.items() if d), planner,
                       args.max_new_tokens, args.plan_max_new_tokens, pool, getattr(args, "repair_rounds", 2),
                       args.mapcoder_k, args.mapcoder_t)
    for role in team.adapters:
        try:
            grpo.load_adapter(planner if role == "planner" and planner is not None else model, role,
                              args.adapters[role])
        except (FileNotFoundError, ValueError, KeyError) as e:  # e.g. an adapter trained on another base
            raise UsageError(f"--adapter {role}={args.adapters[role]}: {e}") from None
    return team


# The benchmarks whose problems carry a memory limit that is part of the verdict (elsewhere the limit only guards the
# machine): the sandbox must hold it for the whole run (sandbox.refusal), or --allow-uncounted says to judge anyway.
MEMORY_LIMITED = ("codecontests", "codeforces")


def open_pool(args, need_cpu=False, need_memory=False):
    """The sandbox pool, with its mode checked: runs that could read the user's files are refused unless
    --allow-unisolated, a time or memory reward term it cannot count in full, or a benchmark's memory limits it cannot
    hold for the whole run (MEMORY_LIMITED), unless --allow-uncounted (one line saying what is missing and how to
    get it). The benchmark's file is hidden from every run (the project and the
    installed packages always are): a program that reads it could run the reference solution."""
    try:
        protect = [data.resolve_path(args.bench, args.data)]
    except FileNotFoundError as e:
        raise UsageError(str(e)) from None
    pool = sandbox.SandboxPool(args.workers, protect=protect)
    why = sandbox.refusal(pool.mode, need_cpu=need_cpu, need_memory=need_memory or args.bench in MEMORY_LIMITED,
                          allow_unisolated=args.allow_unisolated, allow_uncounted=args.allow_uncounted)
    if why:
        pool.close()
        raise UsageError(why)
    return pool


# ---------------------------------------------------------------------------------------------------
# Records and metrics (no model, no sandbox): unit-tested on hand-made records.


def sample_record(attempt, result) -> dict:
    """One attempt + its sandbox result -> the JSON-ready dict stored per sample."""
    return {
        "program": attempt.program, "raw": attempt.raw, "plan": attempt.plan, "plan_cut": attempt.plan_cut,
        "rounds": attempt.rounds, "verdict": result.verdict, "passed": result.passed, "total": result.total,
        "pass_rate": result.pass_rate, "cpu_ms": 1000.0 * result.cpu_s,
        "peak_mb": result.peak_bytes / 2**20,  # MB here means MiB (2**20 bytes), as ru_maxrss-based tools print
        "wall_ms": 1000.0 * result.wall_s,
        # Short excerpt only: enough to see why a sample failed without bloating the file. The program-level
        # error (crash at import, timeout) first, else the first failing test's message.
        "error": (result.error or next((t.error for t in result.tests if t.error and t.verdict != "passed"),
                                       ""))[-500:],
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


def strongest(passed: dict, candidates: list) -> str:
    """The control that passes the most of the problems `passed` ({row: {id: passed}}) rows share; None when none of
    `candidates` is there. Ties go to the first candidate."""
    present = [c for c in candidates if c in passed]
    if not present:
        return None
    common = set.intersection(*(set(passed[c]) for c in present))
    return max(present, key=lambda c: sum(passed[c][k] for k in common))


def summarize(records: dict, n: int, exact_apr: bool = True) -> dict:
    """{row: [per-problem records]} -> {row: metrics}, plus `cg` (vs direct) and `plan_info` (vs the strongest plan
    control present, `plan_info_vs`) where their baseline is there, each with its paired counts (`cg_gained`,
    `cg_lost`, `cg_p`; likewise `plan_info_*`), computed on the problems both rows have, so a partial run of one of
    them never compares different problem sets. exact_apr=False (tests skipped after a failure, --stop-on-failure):
    APR is None, since skipped tests would count as failed."""
    summary = {m: method_metrics(recs, n) for m, recs in records.items()}
    if not exact_apr:
        for m in summary.values():
            m["apr"] = None
    passed = {m: first_passed(recs) for m, recs in records.items()}
    control = strongest(passed, CONTROLS)
    baselines = [("cg", CG_BASELINE)] + [("plan_info", {m: control for m in OWN_PLANS})] * bool(control)
    for key, against in baselines:
        for method, baseline in against.items():
            common = {r["id"] for r in records.get(method, [])} & {r["id"] for r in records.get(baseline, [])}
            if not common:
                continue
            with_helper = method_metrics([r for r in records[method] if r["id"] in common], n)["pass@1"]
            without = method_metrics([r for r in records[baseline] if r["id"] in common], n)["pass@1"]
            pair = paired(passed[method], passed[baseline])
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


def align(lines: list) -> list:
    """Rows of cells -> text lines: the first column left-aligned, the others right-aligned (figures line up on the
    decimal point), a rule under the header."""
    widths = [max(len(r[i]) for r in lines) for i in range(len(lines[0]))]
    out = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))) for r in lines]
    return out[:1] + ["-" * len(out[0])] + out[1:]


def compare(path_a: str, path_b: str) -> str:
    """`--compare A B`: for every row that both hold (or the two given row files), pass@1 of each on their common
    problems and the paired counts: gained = solved in A only, lost = solved in B only, exact McNemar p. A table."""
    a, b = row_files(path_a), row_files(path_b)
    pairs = [(k, k) for k in a if k in b] if len(a) > 1 or len(b) > 1 else [(k, j) for k in a for j in b]
    if not pairs:
        raise UsageError(f"--compare: {path_a} and {path_b} hold no row in common (rows: {sorted(a)} / {sorted(b)})")
    lines = [("row", "problems", "A pass@1%", "B pass@1%", "A-B%", "gained", "lost", "p")]
    for ka, kb in pairs:
        pair = paired(first_passed(read_records(a[ka])), first_passed(read_records(b[kb])))
        if pair["problems"]:
            pa, pb = (100.0 * pair[k] / pair["problems"] for k in ("a_passed", "b_passed"))
            lines.append((ka if ka == kb else f"{ka} vs {kb}", str(pair["problems"]), f"{pa:.1f}", f"{pb:.1f}",
                          f"{pa - pb:+.1f}", f"+{pair['gained']}", f"-{pair['lost']}", f"{pair['p']:.3g}"))
    if len(lines) == 1:
        raise UsageError(f"--compare: no problem in common between {path_a} and {path_b}")
    return "\n".join(align(lines) + [
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
        rows.append([method, str(m["problems"]), cell(m["pass@1"], 100)] + ([cell(m.get("pass@5"), 100)] if n >= 5
                                                                           else [])
                    + [cell(m["apr"], 100), cell(m["cpu_ms"], fmt="{:.2f}"), cell(m["peak_mb"], fmt="{:.2f}"),
                       cell(m.get("cg"), 100, "{:+.1f}"), cell(m.get("plan_info"), 100, "{:+.1f}"),
                       cell(m.get("plan_cut_frac"), 100), cell(m["wall_s"])])
    return "\n".join(align(rows))


def format_pairs(summary: dict) -> str:
    """One line per paired difference in the summary (CG, plan information): points, gained / lost problems, p."""
    labels = (("cg", "CG"), ("plan_info", "plan information"))
    return "\n".join(f"{label} of {method} (vs {m[key + '_vs']}): {100 * m[key]:+.1f} points, +{m[key + '_gained']} / "
                     f"-{m[key + '_lost']} problems, exact McNemar p = {m[key + '_p']:.3g}"
                     for method, m in summary.items() for key, label in labels if key in m)


def read_records(path: str) -> list:
    """Per-problem records of one row's file. A line cut short by a kill is dropped (and the file rewritten without
    it) so that appending continues on a clean line boundary."""
    if not os.path.exists(path):
        return []
    records, good = [], []
    with open(path, "rb") as f:  # bytes, not text: the size check below must compare like with like
        for line in f:
            try:
                records.append(json.loads(line))
            except (json.JSONDecodeError, UnicodeDecodeError):
                continue  # only the last line can be partial (whole lines are appended); it is redone
            good.append(line if line.endswith(b"\n") else line + b"\n")
    if sum(map(len, good)) != os.path.getsize(path):
        with open(path, "wb") as f:
            f.writelines(good)
    return records


# ---------------------------------------------------------------------------------------------------
# One chunk of one row: generate, then judge every program in the sandbox.


def other_plan_donors(problems: list, chunk: list) -> list:
    """other-plan's fixed derangement: the problem at index i of the evaluated list gets the plan written for the one
    at i + 1 (the last gets the first's), whatever the chunking. chunk: [(index, problem)]."""
    return [problems[(i + 1) % len(problems)] for i, _ in chunk]


def attempt_and_judge(team, method, problems, *, n=1, temperature=0.0, seed=0, repeat=1, stop_on_failure=False,
                      donors=None, plans=None, show=lambda text: None):
    """Run `method` on the problems (n attempts each, agents.run_method) and judge every program on its problem's
    hidden tests, all of them in one pool.run (it spreads them over the workers). Returns one list of sample_record
    dicts per problem, and the seconds spent generating and executing. train.py's held-out evaluation is this call,
    greedy, n = 1.

    repeat: runs of each passing program (the sandbox keeps the min CPU time and the median peak memory); 1 by
        default because pass@k and APR do not need it (--timing-repeats when comparing cpu_ms).
    stop_on_failure: skip the tests after the first failing one (functional / stdio; pass@k stays exact).
    donors: other-plan's donor per problem (`other_plan_donors`). plans: given-plan's n (plan, cut) pairs per problem.
    """
    show(f"generating {len(problems)} problems x n={n}")
    t0 = time.perf_counter()
    attempts = agents.run_method(team, method, problems, n=n, temperature=temperature, seed=seed, donors=donors,
                                 plans=plans, show=show) if problems else []
    t1 = time.perf_counter()
    show(f"executing {sum(map(len, attempts))} programs")
    jobs = [agents.problem_job(p, a.program, p.hidden_tests, repeat=repeat, stop_on_failure=stop_on_failure)
            for p, atts in zip(problems, attempts) for a in atts]
    results = iter(team.pool.run(jobs) if jobs else [])
    records = [[sample_record(a, next(results)) for a in atts] for atts in attempts]
    return records, t1 - t0, time.perf_counter() - t1


def evaluate_row(team, name, method, todo, problems, args, path, given=None, later=0):
    """Generate + execute one row's remaining problems chunk by chunk. Each chunk's lines are appended and flushed at
    once, so a killed run loses at most the chunk in flight. Under torchrun a chunk is --batch-size problems per
    rank, each rank takes its contiguous share, and rank 0 writes the gathered lines in order. given: given-plan's
    plans per problem id (load_given_plans). later: the problems the rows after this one have left, for the run's
    estimated time left (at this row's pace so far)."""
    rank, world = grpo.rank_and_world()
    # disable=None: a bar on a terminal, none in a log file (a line per chunk there instead, with the time left, and
    # where the chunk in flight is at most once a minute).
    bar = tqdm(total=len(problems), initial=len(problems) - len(todo), desc=name, unit="problem",
               disable=None if rank == 0 else True)
    show = log_progress(lambda: f"{name}: ") if rank == 0 and bar.disable else \
        (lambda text: bar.set_postfix_str(text, refresh=True))
    t_row = time.time()
    for start in range(0, len(todo), args.batch_size * world):
        whole = todo[start:start + args.batch_size * world]
        chunk = grpo.shard(whole, rank, world)
        # Seeded by the chunk's first problem index: a resumed run reuses the seeds it would have had.
        records, gen_s, exec_s = attempt_and_judge(
            team, method, [p for _, p in chunk], n=args.n, temperature=args.temperature,
            seed=args.seed + chunk[0][0] if chunk else 0, repeat=args.timing_repeats,
            stop_on_failure=args.stop_on_failure, show=show,
            donors=other_plan_donors(problems, chunk) if method == "other-plan" else None,
            plans=[given[p.id] for _, p in chunk] if method == "given-plan" else None)
        k = max(1, len(chunk))  # per-problem share of the chunk's time (generation is batched across problems)
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
        if rank == 0 and bar.disable:
            done, pace = len(problems) - len(todo) + start + len(whole), (time.time() - t_row) / (start + len(whole))
            passed = sum(json.loads(line)["passed"] > 0 for line in lines)
            print(f"{name}: {done}/{len(problems)} problems, {passed}/{len(lines)} of this chunk passed, "
                  f"{gen_s + exec_s:.0f} s | ~{duration(pace * (len(problems) - done))} left in this row, "
                  f"~{duration(pace * (len(problems) - done + later))} in the run at this row's pace")
    bar.close()


# ---------------------------------------------------------------------------------------------------
# The script: arguments, inputs checked before anything loads, rows, summary.


def parse_args(argv=None):
    p = OneLineParser(description=__doc__.split("\n\n")[0])
    add_shared_flags(p)
    p.add_argument("--method", nargs="+", default=list(DEFAULT_METHODS), choices=list(agents.METHODS) + ["all"],
                   metavar="METHOD",
                   help=f"methods to run on the same problems, from {', '.join(agents.METHODS)}, or 'all' (default: "
                        f"{' '.join(DEFAULT_METHODS)}: CoRe-Code with its CG and plan information). direct: the "
                        "Coder alone given the problem, then its restatement (the strongest single-agent prompt "
                        "measured); direct-once the problem alone, direct-reread the Re2 prompt; statement-plan and "
                        "example-plan the restatement's two parts alone, as the plan. The plan "
                        "controls give the Coder a text instead of a plan: content-free-plan one fixed plan that "
                        "says nothing, generic-plan one fixed plan of jargon that passes the format gate, "
                        "restatement the problem's statement and first example, other-plan the plan of the next "
                        "problem in the list. planner-coder-plain: the Planner asked for the four parts by name, "
                        "without the skeleton (a format control); planner-coder-restate, -conditions, -worked: its "
                        "answer starts with the restatement, it adds the steps, only the Conditions and Loops, or "
                        "works the example through (Planners that start from the control); given-plan: "
                        "the Coder given the plans of another run (--plans-from; 'all' includes it only then)")
    p.add_argument("--plans-from", default=None, metavar="FILE",
                   help="given-plan: a <row>.jsonl of an earlier run whose samples carry plans (e.g. "
                        "planner-coder-plain of a larger model, the same split, n and problems)")
    p.add_argument("-n", "--n", type=at_least(1), default=1, help="samples per problem; pass@5 needs n >= 5")
    p.add_argument("--temperature", type=at_least(0.0, float), default=0.0,
                   help="sampling temperature; 0 = greedy; -n > 1 needs a temperature > 0")
    p.add_argument("--repair-rounds", type=at_least(0), default=2, help="Reflexion's feedback rounds")
    p.add_argument("--ablate", action="store_true",
                   help="adapter ablation on the same problems: planner-coder (with --adapter planner=P --adapter "
                        "coder=C) runs as four rows planner-coder[planner+coder], [planner] (w/o Coder RL), [coder] "
                        "(w/o Planner RL), [base]; likewise planner-coder-plain, and mapcoder with retriever and "
                        "debugger adapters. Ablation rows have no CG")
    p.add_argument("--batch-size", type=at_least(1), default=8, help="problems generated together, n samples each")
    p.add_argument("--compare", nargs=2, metavar=("A", "B"), default=None,
                   help="only compare two results dirs (or two <row>.jsonl files) problem by problem and exit: per "
                        "row pass@1 of each, gained / lost problems and the exact McNemar p; loads no model")
    args = p.parse_args(argv)
    if args.n > 1 and args.temperature == 0:
        p.error(f"-n {args.n} with --temperature 0 would repeat one greedy answer {args.n} times: pass a temperature "
                "> 0 (e.g. 0.8) to sample")
    if args.plans_from and not {"given-plan", "all"} & set(args.method):
        p.error("--plans-from is read only by --method given-plan")
    if "given-plan" in args.method and not args.plans_from:
        p.error("--method given-plan needs --plans-from FILE (the <row>.jsonl of a run whose samples carry plans)")
    args.method = list(agents.METHODS) if "all" in args.method else list(dict.fromkeys(args.method))
    if not args.plans_from:
        args.method = [m for m in args.method if m != "given-plan"]  # 'all' without plans to give
    return args


def default_out_dir(args) -> str:
    """runs/eval/<bench>-<split>-<model basename>-n<N>-t<T>-tok<plan cap>-<code cap>[-a<hash of the adapters'
    content>][-p<hash of the given plans>]: the settings a user changes most, so that changing one starts a new
    directory rather than an error."""
    model = os.path.basename(os.path.normpath(args.model))
    if args.planner_model:
        model += "-planner-" + os.path.basename(os.path.normpath(args.planner_model))
    name = (f"{args.bench}-{args.split}-{model}-n{args.n}-t{args.temperature:g}"
            f"-tok{args.plan_max_new_tokens}-{args.max_new_tokens}")
    adapters = [f"{role}={digest(d)}" for role, d in sorted(args.adapters.items()) if d]
    if adapters:  # adapter dirs are often just "planner" / "coder": their content keeps runs apart
        name += "-a" + hashlib.sha1("\n".join(adapters).encode()).hexdigest()[:8]
    if args.plans_from and os.path.isfile(args.plans_from):
        name += "-p" + digest(args.plans_from)[:8]
    return os.path.join("runs", "eval", name)


def load_problems(args) -> list:
    """The problems, loaded before the model so a missing data file fails in a second, not a minute."""
    try:
        options = data.parse_bench_options(args.bench, args.bench_option)
        problems = data.load(args.bench, path=args.data, split=args.split, limit=args.limit, **options)
    except (FileNotFoundError, ValueError) as e:  # data.py's message is already one line
        raise UsageError(str(e)) from None
    if not problems:
        raise UsageError(f"no problems in {args.bench}/{args.split} (check --split / --data)")
    return problems


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
    wrong = [p.id for p in problems if len(by_id.get(p.id, [])) != n]
    if wrong:
        raise UsageError(f"--plans-from {path}: problem {wrong[0]} has {len(by_id.get(wrong[0], []))} plans, this "
                         f"run asks for n = {n} (evaluate the same split, --limit and -n as that run)")
    return {p.id: by_id[p.id] for p in problems}


def writable_out_dir(out_dir: str) -> None:
    """The out dir must be writable before a minute goes into loading the model. Nothing is created here: a run that
    never starts (a bad --model, nothing to resume) leaves no directory behind."""
    existing = os.path.abspath(out_dir)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise UsageError(f"--out {out_dir}: {existing} is a file, not a directory; pass another --out")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError(f"--out {out_dir}: not writable; pass another --out")


def check_inputs(args) -> tuple:
    """Everything that can be wrong, checked before anything is printed or written: the adapters, the out dir and the
    settings of the results already in it, the model, the data, the given plans. Returns (out dir, problems,
    given plans or None)."""
    args.adapters = parse_adapters(args.adapter)
    out_dir = args.out or default_out_dir(args)
    writable_out_dir(out_dir)
    check_settings(os.path.join(out_dir, "settings.json"), settings_of(args, RESULT_SETTINGS), "results")
    check_models(args)
    if args.planner_model and not set(PLANNER_METHODS) & set(args.method):
        raise UsageError(f"--planner-model: none of the methods writes a plan (those that do: "
                         f"{', '.join(PLANNER_METHODS)})")
    problems = load_problems(args)
    if "other-plan" in args.method and len(problems) < 2:
        raise UsageError("other-plan swaps plans between problems: it needs at least 2 (raise --limit)")
    given = load_given_plans(args.plans_from, problems, args.n) if "given-plan" in args.method else None
    return out_dir, problems, given


def write_summary(out_dir, problems, args, mode) -> str:
    """The summary over this run's problems of every row in the out dir (so a planner-coder run next to an earlier
    direct run still reports CG) and the sandbox's mode: summary.json and the table. Returns the summary's path."""
    ids = {p.id for p in problems}
    records = {}
    for name in all_row_names():
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
    """Check the inputs, then per row generate + execute what is left (rows already in the out dir were made with
    the same settings: a resume), then the summary. Returns summary.json's path (None on ranks > 0)."""
    out_dir, problems, given = check_inputs(args)
    rank, _ = grpo.rank_and_world()
    say = print if rank == 0 else (lambda *a, **k: None)  # under torchrun rank 0 speaks for all
    say(f"{len(problems)} {args.bench}/{args.split} problems; methods: {', '.join(args.method)}; out: {out_dir}")
    # The rows (one per method, or one per adapter combination of an ablated method: --ablate), each with the
    # problems not yet in its <row>.jsonl.
    rows = result_rows(args.method, args.ablate, {role for role, d in args.adapters.items() if d})
    todo = {}
    for name, _, _ in rows:
        done = {r["id"] for r in read_records(os.path.join(out_dir, f"{name}.jsonl"))}
        todo[name] = [(i, p) for i, p in enumerate(problems) if p.id not in done]
        if len(todo[name]) < len(problems):
            say(f"{name}: skipped {len(problems) - len(todo[name])} done problems, {len(todo[name])} to go")
    with open_pool(args) as pool:  # started even with nothing left to run: the summary records its mode
        say(sandbox.mode_line(pool.mode))
        # The model, only when there is generation left to do; nothing is written to the out dir before it loads,
        # so a mistyped --model cannot leave a settings.json behind that blocks the rerun.
        team = load_team(args, pool) if any(todo.values()) else None
        if team is not None:
            say(f"model {args.model}{f' (Planner: {args.planner_model})' if args.planner_model else ''} on "
                f"{next(team.model.parameters()).device} {str(next(team.model.parameters()).dtype)[6:]}; "
                f"{'greedy' if args.temperature == 0 else f'temperature {args.temperature:g}'}, n={args.n} "
                f"(all arguments: {os.path.join(out_dir, 'args.json')})")
        if rank == 0:
            os.makedirs(out_dir, exist_ok=True)
            if not os.path.exists(os.path.join(out_dir, "settings.json")):
                with open(os.path.join(out_dir, "settings.json"), "w") as f:
                    # the sandbox's mode too (whether a memory limit holds for the whole run); not compared on resume
                    json.dump({**settings_of(args, RESULT_SETTINGS), "sandbox": pool.mode}, f, indent=2)
            with open(os.path.join(out_dir, "args.json"), "w") as f:
                json.dump(vars(args), f, indent=2)
        left = sum(map(len, todo.values()))
        say(f"work: {left} problem-rows to run ({len(problems)} problems x {len(rows)} rows, n={args.n}, programs <= "
            f"{args.max_new_tokens} tokens, plans <= {args.plan_max_new_tokens}); the time left follows each chunk")
        for name, method, off in rows:  # an ablation row acts with every loaded adapter but those it switches off
            row_team = dataclasses.replace(team, adapters=team.adapters - off) if team else None
            left -= len(todo[name])
            evaluate_row(row_team, name, method, todo[name], problems, args, os.path.join(out_dir, f"{name}.jsonl"),
                         given, later=left)
        return write_summary(out_dir, problems, args, pool.mode) if rank == 0 else None


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.compare:
        try:
            print(compare(*args.compare))
        except UsageError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        return 0
    out = lambda: args.out or (default_out_dir(args) if hasattr(args, "adapters") else "the out dir")
    summary = []
    rc = cli(lambda a: summary.append(evaluate(a)), args,
             lambda: f"finished chunks are saved in {out()}; the same command continues where this one stopped: "
                     f"python evaluate.py {shlex.join(sys.argv[1:] if argv is None else argv)}")
    if rc == 0 and summary[0]:
        print(f"summary: {summary[0]}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
