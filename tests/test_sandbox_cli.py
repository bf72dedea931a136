"""The rule behind a program's verdict, and the CLI (`python sandbox.py --probe`).

What it is: one property per test: a program whose top level does not complete (CPU or wall limit, SystemExit of
any code) fails every test, including tests that never call it (`assert 1`), on every path (assert, functional,
setup arguments); feedback() never says "All tests passed" when the verdict is not "passed"; the CLI's flags all
have help text and a usage error is argparse's (exit status 2).
What it is not: the sandbox's isolation or its attacks (test_sandbox_adversarial.py).
"""
import os
import re
import subprocess
import sys

import pytest

import agents
import sandbox as sb

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cli(*args, timeout=60):
    """Run the CLI; returns the CompletedProcess (text)."""
    return subprocess.run([sys.executable, "sandbox.py", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def run_program(pool, source, *tests, time_limit=1.0):
    return pool.run([sb.Job(program=source, kind="assert", cases=list(tests), time_limit_s=time_limit)])[0]


@pytest.fixture(scope="module")
def pool():
    with sb.SandboxPool(1) as p:
        yield p


# ------------------------------------------------------------------------------------------------------
# A program whose top level does not complete fails every test
# ------------------------------------------------------------------------------------------------------
def test_cpu_limit_in_the_top_level_fails_a_test_that_does_not_call_the_program(pool):
    # A whole-second limit: the CPU rlimit kill lands at about 1.0 s of CPU, often just below it, so
    # "over the CPU budget" alone would not catch it. Under load the 2.5 s wall limit may end it
    # first, or the kill may read as "killed"; either way the test does not pass.
    r = run_program(pool, "while True:\n    pass\n", "assert 1", time_limit=1.0)
    assert r.verdict != "passed" and (r.passed, r.total) == (0, 1)
    assert "All tests passed" not in agents.feedback(sb.Job("", "assert", ["assert 1"]), r)


def test_wall_limit_in_the_top_level_fails_a_test_that_does_not_call_the_program(pool):
    r = run_program(pool, "import time\ntime.sleep(100)\n", "assert 1", time_limit=0.2)
    assert (r.verdict, r.passed, r.total) == ("timeout", 0, 1)


def test_system_exit_3_fails_and_the_feedback_agrees_with_the_verdict(pool):
    job = sb.Job(program="raise SystemExit(3)\n", kind="assert", cases=["assert 1"])
    r = pool.run([job])[0]
    assert (r.verdict, r.passed, r.total) == ("error", 0, 1)
    text = agents.feedback(job, r)
    assert "All tests passed" not in text and "SystemExit: 3" in text


def test_system_exit_0_before_the_tests_fails_every_test(pool):
    r = run_program(pool, "import sys\nsys.exit(0)\ndef f(x):\n    return x + 1\n", "assert 1", "assert f(1) == 2")
    assert (r.verdict, r.passed, r.total) == ("error", 0, 2)


def test_a_top_level_failure_without_tests_is_reported_as_a_failure(pool):
    job = sb.Job(program="raise ValueError('boom')\n", kind="assert", cases=[])
    r = pool.run([job])[0]
    assert (r.verdict, r.passed, r.total) == ("error", 0, 0)
    text = agents.feedback(job, r)
    assert "The program failed" in text and "ValueError: boom" in text


def test_a_program_that_completes_still_passes_a_test_that_does_not_call_it(pool):
    job = sb.Job(program="def f(x):\n    return x + 1\n", kind="assert", cases=["assert 1", "assert f(1) == 2"])
    r = pool.run([job])[0]
    assert (r.verdict, r.passed, r.total) == ("passed", 2, 2)
    assert agents.feedback(job, r) == "All tests passed."


# ------------------------------------------------------------------------------------------------------
# The same rule on the other paths (functional jobs, setup arguments)
# ------------------------------------------------------------------------------------------------------
def test_os_exit_0_in_the_top_level_fails_a_test_that_does_not_call_the_program(pool):
    r = pool.run([sb.Job(program="import os\nos._exit(0)\n", kind="assert", cases=["assert 1"])])[0]
    assert r.passed == 0 and r.tests[0].verdict == "error" and "ended before" in r.tests[0].error


def test_asserts_with_setup_arguments_fail_when_the_top_level_raises(pool):
    # The setup-data argument travels with the request; `assert 1` never asks for a value.
    cases = ["assert 1", "assert f(_corecode_x) == 2"]
    r = pool.run([sb.Job(program="def f(x):\n    return x + 1\nraise SystemExit(3)\n", kind="assert",
                         cases=cases, setup="_corecode_x = 1\n", fn_name="f")])[0]
    assert [t.verdict for t in r.tests] == ["error", "error"] and "SystemExit: 3" in r.tests[0].error


def test_functional_value_lines_written_before_an_exit_do_not_pass(pool):
    # The program writes the right answer on the result channel itself, then leaves before "ready".
    program = "import os\nos.write(3, b'{\"k\": 0, \"v\": \"3\"}\\n')\nos._exit(0)\n"
    r = pool.run([sb.Job(program=program, kind="functional", cases=[{"input": "1\n2", "output": "3"}],
                         fn_name="add")])[0]
    assert r.passed == 0 and r.verdict == "error"


def test_a_failing_setup_fails_a_test_that_does_not_call_the_program(pool):
    r = pool.run([sb.Job(program="x = 1\n", kind="assert", cases=["assert 1"], setup="raise KeyError('k')")])[0]
    assert r.passed == 0 and "the test setup raised KeyError" in r.tests[0].error


# ------------------------------------------------------------------------------------------------------
# The CLI (--probe) and its help
# ------------------------------------------------------------------------------------------------------
def option_help(text):
    """{flag: help text} from argparse's --help output: an entry is "  -x, --long ARG  help", the help
    possibly starting on the next, deeper-indented line."""
    section = re.split(r"\n(?:options|optional arguments):\n", text, maxsplit=1)[1].split("\n\n", 1)[0]
    helps, flag = {}, None
    for line in section.splitlines():
        if line.startswith("  -"):
            invocation, help_text = (re.split(r"\s{2,}", line.strip(), maxsplit=1) + [""])[:2]
            flag = max(re.findall(r"--?[\w-]+", invocation), key=len)
            helps[flag] = help_text.strip()
        elif flag and line.startswith("   "):
            helps[flag] = (helps[flag] + " " + line.strip()).strip()
    return helps


def test_help_describes_every_flag():
    proc = cli("--help")
    helps = option_help(proc.stdout)
    assert proc.returncode == 0
    assert {"--isolation", "--probe", "--help"} <= set(helps)
    assert all(helps.values()), helps
    assert "namespaces" in helps["--isolation"]


def test_an_unknown_flag_is_a_usage_error():
    proc = cli("prog.py", "--test", "assert 1")
    assert proc.returncode == 2 and "unrecognized arguments" in proc.stderr and "Traceback" not in proc.stderr
