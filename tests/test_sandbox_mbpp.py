"""MBPP through sandbox.py: equivalence to plain python3, and wrong solutions that must fail.

What it is: (1) every MBPP canonical solution that passes when run in plain python3 (code + setup +
all asserts in a fresh process, the reference computed here, in a separate interpreter that forks per
task) passes in the sandbox, and none that fails there passes in the sandbox; (2) wrong solutions made
from the canonical ones (off by one, wrong type, returns None, an always-equal object) all fail.
What it is not: a check of the MBPP data itself (see ../shared/data/README.md: 971/974 pass).
"""
import ast
import json
import subprocess
import sys
import warnings

import pytest

import sandbox as sb

# The reference: plain python3, one fresh forked process per task, exec(code + setup + tests). Bounded by CPU time
# as the sandbox is (job_for: 10 s), so a slow task is judged alike on a busy machine; the wall-clock alarm only
# stops a task that sleeps.
REFERENCE = r'''
import json, os, resource, signal, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
out = {}
for row in rows:
    pid = os.fork()
    if pid == 0:
        os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
        resource.setrlimit(resource.RLIMIT_CPU, (10, 10))
        signal.alarm(120)
        try:
            exec(row["code"] + "\n" + row["test_setup_code"] + "\n" + "\n".join(row["test_list"] + row["challenge_test_list"]), {"__name__": "__main__"})
        except BaseException:
            os._exit(1)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    out[row["task_id"]] = os.waitstatus_to_exitcode(status) == 0
print(json.dumps(out))
'''


def entry_point(row):
    """The function under test: the first function the program defines that the first assert calls."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SyntaxWarning)       # MBPP code has regexes with "\d" escapes
        warnings.simplefilter("ignore", DeprecationWarning)
        defs = {n.name for n in ast.parse(row["code"]).body if isinstance(n, ast.FunctionDef)}
    for node in ast.walk(ast.parse(row["test_list"][0])):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in defs:
            return node.func.id
    return ""


@pytest.fixture(scope="module")
def rows(mbpp_path):
    with open(mbpp_path) as fh:
        return [json.loads(line) for line in fh]


@pytest.fixture(scope="module")
def reference(mbpp_path):
    proc = subprocess.run([sys.executable, "-I", "-c", REFERENCE, mbpp_path], capture_output=True, text=True,
                          timeout=1800)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return {int(k): v for k, v in json.loads(proc.stdout).items()}


@pytest.fixture(scope="module")
def pool():
    with sb.SandboxPool() as p:
        yield p


def job_for(row, program=None):
    return sb.Job(program=row["code"] if program is None else program, kind="assert",
                  cases=row["test_list"] + row["challenge_test_list"], setup=row["test_setup_code"],
                  fn_name=entry_point(row), time_limit_s=10.0)


def test_canonical_solutions_match_plain_python(rows, reference, pool):
    results = pool.run([job_for(r) for r in rows])
    ours = {r["task_id"]: res.verdict == "passed" for r, res in zip(rows, results)}
    missing = sorted(t for t in ours if reference[t] and not ours[t])
    extra = sorted(t for t in ours if ours[t] and not reference[t])
    details = {r["task_id"]: [(t.verdict, t.got[:80], t.error[:120]) for t in res.tests if t.verdict != "passed"][:1]
               for r, res in zip(rows, results) if r["task_id"] in missing}
    assert not missing, f"pass in python3 but not in the sandbox: {details}"
    assert not extra, f"pass in the sandbox but not in python3: {extra}"
    assert sum(reference.values()) >= 970      # the data README: 971/974 on CPython 3.11


# Wrong solutions built around the canonical one (`_orig`), so every MBPP signature is kept.
WRONG = {
    "off_by_one": "r = _orig(*a, **k)\n    return r + 1 if type(r) in (int, float, bool) else (r[:-1] if r else None)",
    "wrong_type": "return (_orig(*a, **k),)",
    "returns_none": "return None",
    "always_equal": "class _Eq:\n        def __eq__(self, other):\n            return True\n        __hash__ = object.__hash__\n"
                    "    return _Eq()",
}


def wrong_program(row, variant):
    # The original runs in a namespace of its own, so its recursive calls do not go through the wrapper;
    # it also runs in the program's namespace, where the setup code may need its classes (Node).
    name = entry_point(row)
    return (f"{row['code']}\n_ns = {{}}\nexec({row['code']!r}, _ns)\n_orig = _ns[{name!r}]\n"
            f"def {name}(*a, **k):\n    {WRONG[variant]}\n")


def test_wrong_solutions_all_fail(rows, reference, pool):
    # Every 4th passing task (about 240), four wrong variants each; tasks whose answers can be None are
    # skipped for "returns_none" (returning None would be right there).
    picked = [r for r in rows[::4] if reference[r["task_id"]] and entry_point(r)]
    jobs, labels = [], []
    for row in picked:
        for variant in WRONG:
            if variant == "returns_none" and any("None" in t for t in row["test_list"]):
                continue
            jobs.append(job_for(row, wrong_program(row, variant)))
            labels.append((row["task_id"], variant))
    results = pool.run(jobs)
    passed = [label for label, res in zip(labels, results) if res.verdict == "passed"]
    assert len(jobs) > 800
    assert not passed, f"wrong solutions reported passed: {passed}"
    always_equal = [res for (tid, v), res in zip(labels, results) if v == "always_equal"]
    assert all(res.passed == 0 and "type-strict" in res.tests[0].error for res in always_equal)
