"""Properties of `python sandbox.py PROG.py --test ...` (the CLI) and the rule behind its verdicts.

What it is: the CLI run as a user runs it (a subprocess of this interpreter, in the repository root),
one property per test: a program whose top level does not complete (CPU or wall limit, SystemExit of
any code) fails every test, including tests that never call it (`assert 1`); the summary under the
verdict line never says "All tests passed" when the verdict is not "passed"; usage failures are one
"error:" line on stderr with exit status 2; every flag has help text. A few tests check the same rule
through SandboxPool directly, on the paths the CLI does not take (functional jobs, setup arguments).
What it is not: the sandbox's isolation or its attacks (test_sandbox_adversarial.py).
"""
import os
import re
import subprocess
import sys

import pytest

import sandbox as sb

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cli(*args, timeout=60):
    """Run the CLI; returns the CompletedProcess (text)."""
    return subprocess.run([sys.executable, "sandbox.py", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def run_program(tmp_path, source, *tests, time_limit="1"):
    prog = tmp_path / "prog.py"
    prog.write_text(source)
    args = [str(prog), "--time-limit", time_limit]
    for t in tests:
        args += ["--test", t]
    return cli(*args)


def verdict_line(proc):
    """(verdict, passed, total) from the CLI's first stdout line."""
    m = re.match(r"(\w+) (\d+)/(\d+) ", proc.stdout)
    assert m, f"no verdict line in {proc.stdout!r} (stderr: {proc.stderr[-500:]!r})"
    return m.group(1), int(m.group(2)), int(m.group(3))


@pytest.fixture(scope="module")
def pool():
    with sb.SandboxPool(1) as p:
        yield p


# ------------------------------------------------------------------------------------------------------
# A program whose top level does not complete fails every test (through the CLI)
# ------------------------------------------------------------------------------------------------------
def test_cpu_limit_in_the_top_level_fails_a_test_that_does_not_call_the_program(tmp_path):
    # A whole-second limit: the CPU rlimit kill lands at about 1.0 s of CPU, often just below it, so
    # "over the CPU budget" alone would not catch it. Under load the 2.5 s wall limit may end it
    # first, or the kill may read as "killed"; either way the test does not pass.
    proc = run_program(tmp_path, "while True:\n    pass\n", "assert 1", time_limit="1")
    verdict, passed, total = verdict_line(proc)
    assert verdict != "passed" and (passed, total) == (0, 1)
    assert "All tests passed" not in proc.stdout and proc.returncode == 1


def test_wall_limit_in_the_top_level_fails_a_test_that_does_not_call_the_program(tmp_path):
    proc = run_program(tmp_path, "import time\ntime.sleep(100)\n", "assert 1", time_limit="0.2")
    assert verdict_line(proc) == ("timeout", 0, 1)
    assert "All tests passed" not in proc.stdout and proc.returncode == 1


def test_system_exit_3_fails_and_the_summary_agrees_with_the_verdict(tmp_path):
    proc = run_program(tmp_path, "raise SystemExit(3)\n", "assert 1")
    assert verdict_line(proc) == ("error", 0, 1)
    assert "All tests passed" not in proc.stdout and "SystemExit: 3" in proc.stdout
    assert proc.returncode == 1


def test_system_exit_0_before_the_tests_fails_every_test(tmp_path):
    proc = run_program(tmp_path, "import sys\nsys.exit(0)\ndef f(x):\n    return x + 1\n",
                       "assert 1", "assert f(1) == 2")
    assert verdict_line(proc) == ("error", 0, 2)
    assert "All tests passed" not in proc.stdout and proc.returncode == 1


def test_a_top_level_failure_without_tests_is_reported_as_a_failure(tmp_path):
    proc = run_program(tmp_path, "raise ValueError('boom')\n")
    assert verdict_line(proc) == ("error", 0, 0)
    assert "The program failed" in proc.stdout and "ValueError: boom" in proc.stdout


def test_a_program_that_completes_still_passes_a_test_that_does_not_call_it(tmp_path):
    proc = run_program(tmp_path, "def f(x):\n    return x + 1\n", "assert 1", "assert f(1) == 2")
    assert verdict_line(proc) == ("passed", 2, 2)
    assert "All tests passed." in proc.stdout and proc.returncode == 0


# ------------------------------------------------------------------------------------------------------
# The same rule on the paths the CLI does not take
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
# Usage failures and help
# ------------------------------------------------------------------------------------------------------
def test_a_missing_program_file_is_one_error_line_and_exit_2(tmp_path):
    proc = cli(str(tmp_path / "no-such-program.py"), "--test", "assert 1")
    lines = proc.stderr.splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error:")
    assert "no-such-program.py" in lines[0] and proc.stdout == ""


def test_a_non_positive_time_limit_is_a_usage_error(tmp_path):
    prog = tmp_path / "prog.py"
    prog.write_text("x = 1\n")
    proc = cli(str(prog), "--time-limit", "0", "--test", "assert 1")
    assert proc.returncode == 2 and "--time-limit" in proc.stderr and "Traceback" not in proc.stderr


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


def test_help_describes_every_flag_including_isolation_and_time_limit():
    proc = cli("--help")
    helps = option_help(proc.stdout)
    assert proc.returncode == 0
    assert {"--isolation", "--time-limit", "--test", "--probe", "--help"} <= set(helps)
    assert all(helps.values()), helps
    assert "namespaces" in helps["--isolation"] and "CPU seconds" in helps["--time-limit"]
