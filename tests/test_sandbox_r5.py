"""Round 5 of the sandbox review: one test per class of finding, in each mode it applies to.

What it is: a program's output that crashed the judge (and lost the batch), memory a run left charged to its worker
after it ended (descriptor loops only the kernel's unix garbage collector frees), and a memory limit that held per
process only where there is no cgroup (declared now, and refused unless the caller opts in). Modes are reached in
child processes (isolation="none", an ordinary user without a delegated cgroup), never by changing the host.
What it is not: the earlier rounds (test_sandbox_r4.py, test_sandbox_adversarial.py) or the judge's own logic.
"""
import itertools
import json
import os
import subprocess
import sys
import time

import pytest

import sandbox as sb
import test_sandbox_r4 as r4

ROOT = r4.ROOT


@pytest.fixture(scope="module")
def pool1():
    with sb.SandboxPool(1) as pool:
        yield pool


@pytest.fixture(scope="module", params=["auto", "none"])
def any_pool(request):
    with sb.SandboxPool(1, isolation=request.param) as pool:
        yield pool


def stdio(program, expected="", **kw):
    return sb.Job(program, "stdio", [{"input": "", "output": expected}], **kw)


# --- 0. Judging is total: whatever a program prints, a verdict -----------------------------------------------
def test_a_huge_exponent_where_an_integer_is_expected_fails_that_test_not_the_batch(pool1):
    good = sb.Job("print(int(input()) + 1)", "stdio", [{"input": "1", "output": "2"}])
    bad = stdio("print('1e99999999999999999999')", "2")
    results = pool1.run([good, bad])                        # before: decimal.InvalidOperation, both results lost
    assert [r.verdict for r in results] == ["passed", "failed"], [(r.verdict, r.error) for r in results]


def _hostile_spellings():
    """Number spellings no judge reads as the expected token: huge exponents (the digits of Decimal's limits and
    past them), NaN and infinities, full-width and other non-ASCII digits, doubled signs and other non-numbers."""
    out = []
    for digits, sign, mantissa in itertools.product((7, 18, 19, 20, 21, 40), ("", "+", "-"), ("1", "0.5", "5")):
        out.append(f"{mantissa}e{sign}{'9' * digits}")
    out += ["nan", "NaN", "-nan", "+nan", "inf", "-inf", "+inf", "Infinity", "-Infinity", "infinity", "1e", "e5",
            ".", "+", "-", "--5", "+-5", "5-", "0x5", "5_0", "1__0", "\uff15", "\uff15.\uff10", "\u0665", "\u0665.0",
            "\u0e55", "\u00b9", "\u2155", "5\u0301", "\uff0b5", "\u22125", "1e\uff15", "sNaN", "1e5e5"]
    return out


EXPECTED = ["5", "0", "50", "121932631112635269", "12345678901234567890", "5.0", "1e5", "nan", "abc"]


@pytest.mark.parametrize("got", _hostile_spellings())
def test_hostile_number_spellings_are_wrong_answers_never_exceptions(got):
    verdicts = [sb.stdio_equal(got + "\n", e + "\n") for e in EXPECTED if e != got]
    assert verdicts == [False] * len(verdicts), list(zip(EXPECTED, verdicts))


def test_full_width_digits_are_not_the_expected_number():
    assert not sb.stdio_equal("\uff11.\uff15\n", "1.5\n")          # before: float() read them, and it passed
    assert not sb.stdio_equal("\uff15\n", "5\n")


def test_legitimate_spellings_keep_their_verdicts():
    assert sb.stdio_equal("5.0\n", "5\n") and sb.stdio_equal("1.21932631112635269e17\n", "121932631112635269\n")
    assert sb.stdio_equal("1e-7\n", "0.0\n") and not sb.stdio_equal("1e999999\n", "5\n")


def test_a_judge_that_fails_on_one_output_fails_that_test_only(pool1, monkeypatch):
    real = sb.stdio_equal

    def judge(got, expected):
        if "boom" in got:
            raise ArithmeticError("no rule for this output")
        return real(got, expected)
    monkeypatch.setattr(sb, "stdio_equal", judge)
    job = sb.Job("print(input())", "stdio", [{"input": "1", "output": "1"}, {"input": "boom", "output": "1"}])
    r = pool1.run([job, stdio("print(1)", "1")])
    assert [t.verdict for t in r[0].tests] == ["passed", "error"] and r[1].verdict == "passed", r
    assert "judging failed" in r[0].tests[1].error and "ArithmeticError" in r[0].tests[1].error
