"""Tests of the role prompts, plan cleaning, code extraction and the multi-agent pipelines.

The pipelines run on the tiny random model, so their outputs are garbage: those tests check plumbing
(shapes, which prompts reach the sampler, what never reaches it). Extraction is tested on hand-written
completions in the shapes instruct models really produce.
"""
import ast

import pytest

import agents as roles
import evaluate
from evaluate import run_method
from data import Problem


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return roles.load_model(tiny_model_dir, device="cpu", dtype="float32")


HIDDEN = "assert add_nums(100, 200) == 300  # HIDDEN-ONLY"


def assert_problem(i=0):
    return Problem(
        id=f"mbpp/{i}", bench="mbpp", statement=f"Write a function to add two numbers (variant {i}).",
        kind="assert", public_tests=["assert add_nums(1, 2) == 3"],
        hidden_tests=["assert add_nums(1, 2) == 3", HIDDEN], entry_point="add_nums",
    )


def stdio_problem():
    return Problem(
        id="codecontests/sum", bench="codecontests", statement="Read two integers and print their sum.",
        kind="stdio", public_tests=[{"input": "1 2\n", "output": "3\n"}],
        hidden_tests=[{"input": "5 7\n", "output": "12\n"}],
    )


# ---------------------------------------------------------------------------------------------------
# Prompts


def test_problem_text_shows_public_tests_not_hidden():
    text = roles.problem_text(assert_problem())
    assert "Write a function to add two numbers" in text
    assert "Your code should pass this test:\nassert add_nums(1, 2) == 3" in text
    assert "HIDDEN-ONLY" not in text


def test_problem_text_stdio_examples_and_starter_code():
    p = stdio_problem()
    p.starter_code = "import sys\n"
    text = roles.problem_text(p)
    assert "Example 1\nInput:\n1 2\nOutput:\n3" in text
    assert "```python\nimport sys\n```" in text
    assert "12" not in text  # the hidden case's output


def test_problem_text_code_statement_shown_once_fenced():
    sig = 'def add_nums(a, b):\n    """Add two numbers."""\n'
    p = assert_problem()
    p.statement, p.starter_code = sig, sig
    text = roles.problem_text(p)
    assert text.count("Add two numbers.") == 1 and text.startswith("Complete the following Python code:\n```python\ndef add_nums")


def test_problem_text_functional_renders_calls():
    p = Problem(id="lb/x", bench="livebench", statement="Return a+b.", kind="functional",
                public_tests=[{"input": "1\n[2, 3]", "output": "[3, 4]"}], hidden_tests=[], entry_point="f")
    assert "f(1, [2, 3]) == [3, 4]" in roles.problem_text(p)


def test_planner_prompt_has_chat_template_problem_and_four_sections(tiny):
    _, tok = tiny
    prompt = roles.planner_prompt(tok, assert_problem())
    assert prompt.startswith("<|im_start|>system\n") and "<|im_start|>assistant\n" in prompt
    assert "Write a function to add two numbers" in prompt and "assert add_nums(1, 2) == 3" in prompt
    assert all(part in prompt for part in roles.PLAN_PARTS)


def test_the_planner_answer_is_prefilled_with_the_restatement_up_to_the_conditions_label(tiny):
    _, tok = tiny
    p = assert_problem()
    prompt = roles.planner_prompt(tok, p)
    prefill = roles.restatement_plan(p) + roles.PLANNER_PREFILL_END
    assert prompt.endswith("<|im_start|>assistant\n" + prefill)


def test_coder_prompt_contains_problem_plan_and_format(tiny):
    _, tok = tiny
    plan = "Input/Output: two ints. Steps: 1. add. Conditions: none. Loops: none."
    prompt = roles.coder_prompt(tok, assert_problem(), plan)
    assert plan in prompt and "Write a function to add two numbers" in prompt
    assert "`add_nums`" in prompt and "no example usage" in prompt


@pytest.mark.parametrize("template", [roles.DIRECT_PROMPT, *roles.REASONING_PROMPTS.values()])
def test_single_answer_prompts_contain_problem(tiny, template):
    _, tok = tiny
    prompt = roles.direct_prompt(tok, stdio_problem(), template)
    assert "Read two integers and print their sum." in prompt and "standard input" in prompt
    assert prompt.endswith("<|im_start|>assistant\n")


def test_repair_prompt_contains_code_and_feedback(tiny):
    _, tok = tiny
    prompt = roles.repair_prompt(tok, assert_problem(), "def add_nums(a, b):\n    return a - b",
                                 "input: add_nums(1, 2)\nexpected: 3\ngot: -1")
    assert "return a - b" in prompt and "expected: 3" in prompt and "HIDDEN-ONLY" not in prompt


# ---------------------------------------------------------------------------------------------------
# Plan cleaning

PLAN = (
    "Input/Output: a list of ints; return the max.\n"
    "Steps: 1. Set best to the first item. 2. Update best. 3. Return best.\n"
    "Conditions: an empty list is invalid.\n"
    "Loops: one pass over the list."
)


def test_clean_plan_cuts_code_after_loops():
    raw = PLAN[len("Input/Output:"):] + "\n\n```python\ndef f(xs):\n    return max(xs)\n```\nDone."
    assert roles.clean_plan(raw) == PLAN


def test_clean_plan_cuts_prose_after_loops_but_keeps_blank_lines_between_parts():
    raw = PLAN.replace("\nSteps", "\n\nSteps")[len("Input/Output:"):] + "\n\nHere is the code:\nimport os"
    assert roles.clean_plan(raw) == PLAN.replace("\nSteps", "\n\nSteps")


def test_clean_plan_cuts_an_extra_label_after_loops():
    assert roles.clean_plan(PLAN[len("Input/Output:"):] + "\nRules: the function checks it.") == PLAN


def test_clean_plan_unfenced_def_is_cut():
    raw = " two ints.\nSteps: add them.\ndef add(a, b):\n    return a + b\n"
    assert roles.clean_plan(raw) == "Input/Output: two ints.\nSteps: add them."


def test_clean_plan_unwraps_a_prose_fence():
    raw = "\n```text\nInput/Output: x\nSteps: y\nConditions: z\nLoops: w\n```\n"
    assert roles.clean_plan(raw, prefix="") == "Input/Output: x\nSteps: y\nConditions: z\nLoops: w"


def test_clean_plan_keeps_numbered_bold_loops_part():
    raw = " x\n2. **Steps**: y\n3. **Conditions**: z\n4. **Loops**:\n   - over items\n   - stop at end\n\nThis plan works."
    assert roles.clean_plan(raw).endswith("4. **Loops**:\n   - over items\n   - stop at end")


# ---------------------------------------------------------------------------------------------------
# Code extraction: completions shaped like real instruct-model outputs

SOL = "def add_nums(a, b):\n    return a + b"

EXTRACT_CASES = {
    "prose, fence, trailing explanation": (
        f"Here is the function:\n\n```python\n{SOL}\n```\n\nThis adds the numbers.", "assert", SOL),
    "solution block then usage block": (
        f"```python\n{SOL}\n```\nExample usage:\n```python\nprint(add_nums(1, 2))  # 3\n```", "assert", SOL),
    "py tag": (f"```py\n{SOL}\n```", "assert", SOL),
    "fence without language": (f"```\n{SOL}\n```", "assert", SOL),
    "unterminated fence cut mid statement": (
        f"```python\n{SOL}\n\ndef helper(x):\n    return (x +", "assert", SOL),
    "usage with input() and print": (
        f"```python\n{SOL}\n\na = int(input())\nb = int(input())\nprint(add_nums(a, b))\n```", "assert", SOL),
    "main guard and asserts dropped": (
        f"```python\n{SOL}\n\nassert add_nums(1, 2) == 3\n\nif __name__ == '__main__':\n    print(add_nums(2, 2))\n```",
        "assert", SOL),
    "markdown-indented code in prose": (
        "The solution is:\n\n    def add_nums(a, b):\n        return a + b\n\nThat is all.", "assert", SOL),
    "imports, constants, decorators kept; demo comment dropped": (
        "```python\nimport functools\nMOD = 10**9 + 7\n\n@functools.lru_cache(None)\ndef add_nums(a, b):\n"
        "    return (a + b) % MOD\n\n# Example usage:\nresult = add_nums(1, 2)\nprint(result)\n```",
        "assert",
        "import functools\nMOD = 10**9 + 7\n\n@functools.lru_cache(None)\ndef add_nums(a, b):\n    return (a + b) % MOD"),
    "two defining blocks: the last wins": (
        "```python\ndef add_nums(a, b):\n    return a - b\n```\nOops, fixed:\n```python\n" + SOL + "\n```",
        "assert", SOL),
    "sample input block next to code": (
        f"Input:\n```\n1 2\n```\nCode:\n```python\n{SOL}\n```", "assert", SOL),
    "fence glued to the last line": (f"```python\n{SOL}```\nDone.", "assert", SOL),
    "fence inside a numbered list": (
        "1. Define it:\n   ```python\n   def add_nums(a, b):\n       return a + b\n   ```\n2. Done.", "assert", SOL),
    "unfenced code with trailing prose": (f"{SOL}\n\nThis function returns the sum.", "assert", SOL),
    "stdio keeps everything": (
        "```python\na, b = map(int, input().split())\nprint(a + b)\n```", "stdio",
        "a, b = map(int, input().split())\nprint(a + b)"),
    "stdio keeps the main guard": (
        "```python\ndef main():\n    print(sum(map(int, input().split())))\n\nif __name__ == '__main__':\n    main()\n```",
        "stdio",
        "def main():\n    print(sum(map(int, input().split())))\n\nif __name__ == '__main__':\n    main()"),
    "functional class Solution usage dropped": (
        "```python\nclass Solution:\n    def add_nums(self, a, b):\n        return a + b\n\n"
        "print(Solution().add_nums(1, 2))\n```", "functional",
        "class Solution:\n    def add_nums(self, a, b):\n        return a + b"),
    "semicolon line rebuilt from the AST": (
        f"```python\n{SOL}\nx = add_nums(1, 2); print(x)\n```", "assert", SOL),
    "plan text with no code": (PLAN, "assert", ""),
    "bash block only": ("Run:\n```bash\npip install numpy\n```", "assert", ""),
    "garbage": ("ĠĠ)) ]: the quick:: brown ((( fox", "assert", ""),
    "empty": ("", "assert", ""),
}


@pytest.mark.parametrize("name", list(EXTRACT_CASES))
def test_extract_code(name):
    text, kind, expected = EXTRACT_CASES[name]
    got = roles.extract_code(text, kind, "add_nums")
    assert got == expected
    if got:
        ast.parse(got)  # whatever comes back runs through the parser


def test_extract_code_without_entry_point_prefers_longest_block_with_def():
    text = "```python\nx = 1\n```\n```python\ndef f(a):\n    return a\n\ndef g(a):\n    return f(a) + 1\n```\n```python\nprint(g(1))\n```"
    assert roles.extract_code(text, "assert") == "def f(a):\n    return a\n\ndef g(a):\n    return f(a) + 1"


def test_extract_code_keeps_precomputation_that_calls_a_helper():
    text = "```python\ndef sieve(n):\n    return [2, 3]\n\nPRIMES = sieve(10)\n\ndef add_nums(a, b):\n    return a + b\n```"
    assert "PRIMES = sieve(10)" in roles.extract_code(text, "assert", "add_nums")


def test_extract_code_terminated_syntax_error_is_kept_for_feedback():
    text = "```python\ndef add_nums(a, b)\n    return a + b\n```"
    assert roles.extract_code(text, "assert", "add_nums") == "def add_nums(a, b)\n    return a + b"


def test_extract_code_parse_work_is_bounded_on_long_prose(monkeypatch):
    calls = []
    real_parse = ast.parse
    monkeypatch.setattr(ast, "parse", lambda src, *a, **k: calls.append(1) or real_parse(src, *a, **k))
    assert roles.extract_code("The value x = 5 is nice here\n" * 300, "stdio") == ""
    assert len(calls) <= 10 * 64 + 10  # 10 start lines x 64 tries, not one search per line


def test_reasoning_before_code_is_the_prose_before_the_first_fence():
    text = f"Input/Output: two ints.\nSequence: add them.\n\n```python\n{SOL}\n```\nDone."
    assert roles.reasoning_before_code(text) == "Input/Output: two ints.\nSequence: add them."


def test_extract_code_non_string_is_empty():
    assert roles.extract_code(None) == ""


# ---------------------------------------------------------------------------------------------------
# Pipelines (tiny random model: plumbing only)

TOKENS = dict(max_new_tokens=6, plan_max_new_tokens=6)


def team(tiny, **kw):
    """The tiny model in every role, with small token caps."""
    return roles.Team(*tiny, **{**TOKENS, **kw})


@pytest.mark.parametrize("method", ["direct", "cot", "scot", "planner-coder", "content-free-plan",
                                    "generic-plan", "restatement", "other-plan"])
def test_method_returns_n_attempts_per_problem(tiny, method):
    model, tok = tiny
    problems = [assert_problem(0), stdio_problem(), assert_problem(2)]
    out = run_method(team(tiny), method, problems, n=2, temperature=1.0)
    assert len(out) == 3 and all(len(a) == 2 for a in out)
    assert all(isinstance(x.program, str) and isinstance(x.raw, str) and isinstance(x.plan, str) for a in out for x in a)


def _record_sample(monkeypatch):
    """Wrap the sampler: record (prompts, group_size, stop) of every call."""
    calls = []
    real = roles.sample

    def spy(model, tokenizer, prompts, group_size=1, **kw):
        calls.append((list(prompts), group_size, kw.get("stop")))
        return real(model, tokenizer, prompts, group_size=group_size, **kw)

    monkeypatch.setattr(roles, "sample", spy)
    return calls


def test_planner_coder_one_sample_call_per_stage_and_plans_reach_coder(tiny, monkeypatch):
    model, tok = tiny
    calls = _record_sample(monkeypatch)
    roles_seen = []

    real = roles.acting
    monkeypatch.setattr(roles, "acting", lambda team, role: roles_seen.append(role) or real(team, role))
    problems = [assert_problem(0), assert_problem(1)]
    out = run_method(team(tiny), "planner-coder", problems, n=3, temperature=1.0)
    assert roles_seen == ["planner", "coder"] and len(calls) == 2
    (plan_prompts, g, stop), (code_prompts, g2, _) = calls
    assert len(plan_prompts) == 2 and g == 3 and tuple(stop) == roles.PLANNER_STOP
    assert len(code_prompts) == 6 and g2 == 1  # one program per thought, problem-major
    for k, prompt in enumerate(code_prompts):
        attempt = out[k // 3][k % 3]
        assert f"(variant {k // 3})" in prompt and attempt.plan.startswith(roles.PLAN_PREFIX)
        assert attempt.plan in prompt


def test_content_free_plan_gives_every_problem_the_same_fixed_plan_without_a_planner(tiny, monkeypatch):
    model, tok = tiny
    calls = _record_sample(monkeypatch)
    out = run_method(team(tiny), "content-free-plan", [assert_problem(0), assert_problem(1)], n=1,
                           temperature=0.0)
    # One Coder call, no Planner call (no plan stop strings).
    assert len(calls) == 1 and not calls[0][2]
    assert [a.plan for (a,) in out] == [roles.CONTENT_FREE_PLAN] * 2
    assert all(roles.CONTENT_FREE_PLAN in prompt for prompt in calls[0][0])


def test_other_plan_codes_each_problem_from_its_donors_plan(tiny, monkeypatch):
    model, tok = tiny
    calls = _record_sample(monkeypatch)
    problems = [assert_problem(0), assert_problem(1), assert_problem(2)]
    out = run_method(team(tiny), "other-plan", problems, n=1, temperature=0.0,
                     donors=problems[1:] + problems[:1])
    plan_prompts, code_prompts = calls[0][0], calls[1][0]
    # The Planner wrote for the donors (1, 2, 0); the Coder of problem i saw problem i's statement and donor i's plan.
    assert [f"(variant {k})" in p for k, p in zip((1, 2, 0), plan_prompts)] == [True] * 3
    assert all(f"(variant {i})" in code_prompts[i] and out[i][0].plan in code_prompts[i] for i in range(3))


def test_other_plan_refuses_a_problem_as_its_own_donor(tiny):
    model, tok = tiny
    with pytest.raises(ValueError, match="one other problem"):
        run_method(team(tiny), "other-plan", [assert_problem(0)], donors=[assert_problem(0)])
    with pytest.raises(ValueError, match="at least 2"):
        run_method(team(tiny), "other-plan", [assert_problem(0)])


def test_given_plan_codes_each_problem_from_its_given_plans_without_a_planner(tiny, monkeypatch):
    model, tok = tiny
    calls = _record_sample(monkeypatch)
    problems = [assert_problem(0), assert_problem(1)]
    given = [[("Plan A0", False), ("Plan A1", True)], [("Plan B0", False), ("Plan B1", False)]]
    out = run_method(team(tiny), "given-plan", problems, n=2, temperature=1.0, plans=given)
    # One Coder call, no Planner call (no plan stop strings).
    assert len(calls) == 1 and not calls[0][2]
    assert [[(a.plan, a.plan_truncated) for a in atts] for atts in out] == given
    # Problem-major: problem i's prompts hold its own statement and its own plans.
    assert all(f"(variant {k // 2})" in prompt and given[k // 2][k % 2][0] in prompt
               for k, prompt in enumerate(calls[0][0]))


def test_given_plan_refuses_plans_that_are_not_n_per_problem(tiny):
    model, tok = tiny
    with pytest.raises(ValueError, match="n plans per problem"):
        run_method(team(tiny), "given-plan", [assert_problem(0)], n=2, plans=[[("Plan", False)]])
    with pytest.raises(ValueError, match="n plans per problem"):
        run_method(team(tiny), "given-plan", [assert_problem(0)], n=1)


def test_a_plan_that_runs_into_its_token_limit_is_marked_truncated(tiny):
    model, tok = tiny
    # The tiny random model never stops within 6 tokens (no EOS, no stop string): every plan is
    # truncated.
    (a,), = run_method(team(tiny), "planner-coder", [assert_problem(0)], n=1, temperature=0.0)
    assert a.plan_truncated
    (b,), = run_method(team(tiny), "content-free-plan", [assert_problem(0)], n=1, temperature=0.0)
    assert not b.plan_truncated


def test_same_seed_same_attempts(tiny):
    model, tok = tiny
    run = lambda seed: [a.raw for atts in run_method(team(tiny), "cot", [assert_problem()], n=2,
                                                           temperature=1.0, seed=seed) for a in atts]
    assert run(1) == run(1)


def test_unknown_method_is_a_clear_error(tiny):
    model, tok = tiny
    with pytest.raises(ValueError, match="unknown method"):
        run_method(team(tiny), "magic", [assert_problem()])


def test_reflexion_repairs_only_failing_attempts_from_public_feedback(tiny, monkeypatch):
    model, tok = tiny
    calls = _record_sample(monkeypatch)
    checked = []

    def fake_check(problems, programs, pool):
        # Problem 0 always fails its public test, problem 1 passes: only problem 0 is repaired.
        checked.append([p.id for p in problems])
        return [(p.id == "mbpp/1", f"public feedback for {p.id}") for p in problems]

    monkeypatch.setattr(roles, "check_public", fake_check)
    problems = [assert_problem(0), assert_problem(1)]
    out = run_method(team(tiny, pool=object(), repair_rounds=2), "reflexion", problems, n=2,
                     temperature=1.0)
    assert checked == [["mbpp/0", "mbpp/0", "mbpp/1", "mbpp/1"], ["mbpp/0", "mbpp/0"]]
    assert [len(c[0]) for c in calls] == [2, 2, 2]  # direct for both, then two repair rounds for problem 0's two attempts
    assert all("public feedback for mbpp/0" in prompt for prompt in calls[1][0] + calls[2][0])
    assert [a.rounds for a in out[0]] == [2, 2] and [a.rounds for a in out[1]] == [0, 0]
    assert not any("HIDDEN-ONLY" in prompt for c in calls for prompt in c[0])


def test_check_public_runs_only_public_tests(monkeypatch):
    sandbox = pytest.importorskip("sandbox")
    seen = []

    class Pool:
        def run(self, jobs):
            seen.extend(jobs)
            return [sandbox.ProgramResult(verdict="failed", tests=[sandbox.TestResult("failed", got="-1")],
                                          passed=0, total=1, cpu_s=0.0, wall_s=0.0, peak_bytes=0) for _ in jobs]

    p = assert_problem()
    out = roles.check_public([p, p], ["def add_nums(a, b):\n    return a - b", ""], Pool())
    assert len(seen) == 1 and seen[0].cases == p.public_tests and seen[0].fn_name == "add_nums"
    assert out[0][0] is False and out[1] == (False, roles.NO_CODE_FEEDBACK)


def test_reflexion_with_real_sandbox_never_leaks_hidden_tests(tiny, monkeypatch):
    sandbox = pytest.importorskip("sandbox")
    model, tok = tiny
    calls = _record_sample(monkeypatch)
    # The tiny model writes no working code, so every attempt fails its public test and gets repaired.
    with sandbox.SandboxPool(1) as pool:
        out = run_method(team(tiny, pool=pool, repair_rounds=1), "reflexion",
                         [assert_problem(), stdio_problem()], n=1, temperature=1.0)
    assert len(calls) == 2 and len(calls[1][0]) == 2 and all(a[0].rounds == 1 for a in out)
    prompts = [p for c in calls for p in c[0]]
    assert not any("HIDDEN-ONLY" in p or "5 7" in p for p in prompts)


# ---------------------------------------------------------------------------------------------------
# Real model (slow; skipped when absent)

@pytest.mark.slow
def test_real_model_plans_follow_the_format_and_code_parses(mbpp_path):
    from tiny_model import real_model_dir

    real, where = real_model_dir(build=True)
    if real is None:
        pytest.skip(where)
    import data

    model, tok = roles.load_model(real)
    problems = data.load("mbpp", mbpp_path, split="validation", limit=2)
    big = roles.Team(model, tok, max_new_tokens=256, plan_max_new_tokens=200)
    out = run_method(big, "planner-coder", problems, n=1, temperature=0.0)
    for (a,) in out:
        assert list(roles.plan_parts(a.plan)) == [s.lower() for s in roles.PLAN_PARTS] and "```" not in a.plan
        assert a.program and ast.parse(a.program)


# ---- the plan format check behind the Planner stage's format gate


@pytest.mark.parametrize("plan,copied", [
    ("Input/Output: <the inputs, in order, with names and types>; a list.", ["<the inputs, in order, with names and types>"]),
    ("Steps: 1. <first step>. 2. <next step>. 3. <...>", ["<first step>", "<next step>", "<...>"]),
    ("Conditions: if a < b and c > d, swap; x <= y; returns List<int>.", []),
    ("Conditions: when x<y and z>w hold", ["<y and z>"]),  # the rule's known false positive, documented
])
def test_plan_placeholders_finds_copied_skeleton_text(plan, copied):
    assert roles.plan_placeholders(plan) == copied


def test_gate_label_needs_input_output_and_steps_and_no_placeholder():
    good = ("Input/Output: a list of ints; their sum.\nSteps: 1. Start the total at zero.\n2. Add each number to it.\n"
            "Conditions: an empty list gives zero.\nLoops: over the list once.")
    assert roles.gate_label(good) == "ok"
    absent_loops = good.replace("\nLoops: over the list once.", "")
    assert roles.gate_label(absent_loops) == "ok"  # absent = none
    no_steps = "Input/Output: a list of ints; their sum.\nConditions: an empty list gives zero.\nLoops: over the list."
    assert roles.gate_label(no_steps) == "missing parts"
    no_io = good.replace("Input/Output: a list of ints; their sum.\n", "")
    assert roles.gate_label(no_io) == "missing parts"
    assert roles.gate_label(good.replace("Add each number to it", "<next step>")) == "placeholder"
    # A plan after the pre-filled label alone (MapCoder's Planner's form) passes when filled in.
    filled = roles.clean_plan(" a list; the sum.\nSteps: 1. Add the numbers up.\n"
                              "2. Return the total sum.\nConditions: none.\nLoops: once.")
    assert roles.gate_label(filled) == "ok"


@pytest.mark.parametrize("plan", [
    # What a Planner gated on labels alone learned to write (run planner-r1, step 24): labels without content.
    "Input/Output: (number)\nSteps: 1. 2. 3. 4.\nConditions: (number > 1)\nLoops: (number > 1)",
    "Input/Output: (5, 6, 7, 4, 9), \"FDF\"\nSteps: [5, 'FDF', 6, 'FDF']\nConditions: None\nLoops: None",
    "Input/Output: a list.\nSteps: 1. Sort it now please.\n2. Return the last one.\nConditions: 4 > 0\nLoops: x",
])
def test_gate_label_refuses_labels_without_content(plan):
    assert roles.gate_label(plan) not in ("ok", "truncated")


# Plans that say nothing about their problem: well formed, every part filled, and useless to the Coder. The first three
# passed the previous gate and earned the full reward when the Coder, coding alone, passed.
CONTENT_FREE = [
    roles.CONTENT_FREE_PLAN,
    "Input/Output: the input values; the result.\nSteps: 1. Read the input values given. 2. Compute the required "
    "result value. 3. Return the computed result value.\nConditions: handle the edge cases.\nLoops: iterate as needed.",
    "Input/Output: inputs; output.\nSteps: 1. Take the input. 2. Process the input. 3. Return the output.\n"
    "Conditions: None\nLoops: None",
    "Input/Output: The input is the input and the output is the output.\nSteps: 1. First do the first step of the task. "
    "2. Then do the next step of the task. 3. Finally return what the task wants.\nConditions: There are conditions to "
    "handle.\nLoops: There are loops to run.",
    "Input/Output: the function's parameters; the expected output.\nSteps: 1. Understand the problem. 2. Implement the "
    "solution. 3. Return the answer.\nConditions: check for edge cases and invalid inputs.\nLoops: loop over the data "
    "when necessary.",
    "Input/Output: given input; required output.\nSteps: 1. Initialize the variables. 2. Perform the required operations "
    "on the input. 3. Return the final result.\nConditions: if the input is empty, return the default value.\n"
    "Loops: iterate over the elements until done.",
    "Input/Output: the input as described; the output as described.\nSteps: 1. Solve the problem step by step. 2. Return "
    "the solution.\nConditions: as required by the problem.\nLoops: as required by the problem.",
    "Input/Output: a value; a value.\nSteps: 1. Get the value. 2. Compute the value. 3. Output the value.\n"
    "Conditions: None.\nLoops: None.",
    "Input/Output: the given inputs; the correct result.\nSteps: 1. Analyze the inputs carefully. 2. Apply the "
    "appropriate logic to them. 3. Return the correct result.\nConditions: handle all special cases properly.\n"
    "Loops: use loops where appropriate.",
    "Input/Output: parameters of the function; its return value.\nSteps: 1. Check the input. 2. Calculate the result "
    "using the input. 3. Return the result.\nConditions: if the input is invalid, handle it.\nLoops: iterate over the "
    "input if needed.",
    # Conditions and Loops may be left out (they read as "none"), which makes saying nothing no easier.
    "Input/Output: the input values; the output value.\nSteps: 1. Read the input values given. 2. Compute the "
    "required result value. 3. Return the computed result value.",
]

# Real plans, including terse ones, a one-step formula and I/O written as example values (the previous gate failed
# these three kinds).
INFORMATIVE = [
    "Input/Output: a list of ints nums; their sum.\nSteps: 1. Start the total at zero. 2. Add each number to it.\n"
    "Conditions: an empty list gives zero.\nLoops: over the list once.",
    "Input/Output: n; the nth pentagonal number.\nSteps: 1. Return n * (3 * n - 1) // 2.\nConditions: None.\n"
    "Loops: None.",
    "Input/Output: [1, 2, 3] -> 6; [] -> 0.\nSteps: 1. Sum all the elements of the list with a running total.\n"
    "Conditions: empty list returns 0.\nLoops: one pass over the list.",
    "Input/Output: s (str); s with every vowel removed.\nSteps: 1. Build a new string from the characters of s that are "
    "not in 'aeiouAEIOU'.\nConditions: uppercase vowels count too.\nLoops: over the characters of s.",
    "Input/Output: two sorted lists a, b; one merged sorted list.\nSteps: 1. Keep an index into each list. 2. Append "
    "the smaller head and advance that index. 3. Append what is left of either list.\nConditions: one list may be "
    "empty.\nLoops: while both indices are inside their lists.",
    "Input/Output: n (int); True if n is prime, else False.\nSteps: 1. If n < 2 return False. 2. Try every divisor d "
    "from 2 while d * d <= n. 3. Return False when one divides n, else True.\nConditions: n < 2 is not prime.\n"
    "Loops: over d up to the square root of n.",
    "Input/Output: text (str); the longest word.\nSteps: 1. Split the text on spaces. 2. Return max(words, key=len).\n"
    "Conditions: ties keep the first word.\nLoops: none.",
    "Input/Output: (10, 20) -> 30.\nSteps: 1. Add the two numbers.\nConditions: none.\nLoops: none.",
    "Input/Output: a string; True if it is a palindrome.\nSteps: 1. Compare the string with its reverse.\n"
    "Conditions: None.\nLoops: None.",
    "Input/Output: a tuple; a dict.\nSteps: 1. Convert the tuple to a dictionary.\nConditions: None.\nLoops: None.",
    # The untrained 1.5B's way: no Loops part where there is no loop (absent reads as "none").
    "Input/Output: n (int); the nth pentagonal number (int).\nSteps: 1. Return n * (3 * n - 1) // 2.",
    "Input/Output: a list of tuples; the tuple with the largest second element.\nSteps: 1. Return max(tuples, key="
    "lambda t: t[1]).\nConditions: the list is not empty.",
]


@pytest.mark.parametrize("plan", CONTENT_FREE)
def test_the_format_gate_refuses_a_content_free_plan(plan):
    assert roles.gate_label(plan) == "content-free"


@pytest.mark.parametrize("plan", INFORMATIVE)
def test_the_format_gate_passes_an_informative_plan(plan):
    assert roles.gate_label(plan) == "ok"


def test_a_plan_that_repeats_a_part_is_refused():
    # A plan that finishes its four parts and starts again until the cap would otherwise read as finished.
    once = ("Input/Output: a list of ints; their sum.\nSteps: 1. Add each number to a running total.\n"
            "Conditions: an empty list gives 0.\nLoops: over the list once.")
    assert roles.gate_label(once) == "ok"
    assert roles.gate_label(once + "\n" + once, truncated=True) == "repeated part"


@pytest.mark.parametrize("steps", ["1. Proceed.", "1. Add each number to a running total. 2. Proceed."])
def test_a_one_word_step_is_refused(steps):
    # "Proceed" passed the step rule as three two-letter words before the rule matched whole words.
    plan = f"Input/Output: a list of ints; their sum.\nSteps: {steps}"
    assert roles.gate_label(plan) == "empty step"


def test_arrows_asides_and_apostrophes_are_not_content():
    plan = "Input/Output: inputs -> output.\nSteps: 1. Return the result (as required). 2. Return it's value."
    assert roles.gate_label(plan) == "content-free"
    formula = "Input/Output: n; an int.\nSteps: 1. Return n * (n + 1) // 2."
    assert roles.gate_label(formula) == "ok"  # a formula is content


def test_a_plan_that_only_restates_the_problem_is_refused():
    p = assert_problem()
    restated = roles.restatement_plan(p)
    assert p.statement in restated and p.public_tests[0] in restated
    assert roles.gate_label(restated) == "ok"  # without the problem no text rule can tell
    assert roles.gate_label(restated, problem=p) == "restatement"
    own = "Input/Output: two ints; their sum.\nSteps: 1. Return a + b with the plus operator."
    assert roles.gate_label(own, problem=p) == "ok"


def test_the_generic_plan_passes_the_gate_so_only_its_control_catches_it():
    assert roles.gate_label(evaluate.GENERIC_PLAN, problem=assert_problem()) == "ok"


def test_a_truncated_plan_is_its_own_case_not_malformed():
    whole = INFORMATIVE[4]
    cut = whole[:whole.index("\nConditions")]  # ran out of tokens after Steps
    # Scored by its programs, less a penalty.
    assert roles.gate_label(cut, truncated=True) == "truncated"
    # The same text ended on its own: Conditions and Loops are optional.
    assert roles.gate_label(cut) == "ok"
    assert roles.gate_label(whole, truncated=True) == "ok"
    # Cut before it said anything: still not a plan.
    early = "Input/Output: two sorted lists a, b; one"
    assert roles.gate_label(early, truncated=True) == "missing parts"
    free = CONTENT_FREE[1][:CONTENT_FREE[1].index("\nConditions")]
    assert roles.gate_label(free, truncated=True) == "content-free"


def test_plan_parts_splits_on_the_labels():
    parts = roles.plan_parts("Input/Output: a; b\nSteps: 1. do x\n2. do y\n**Conditions**: c\n4. Loops: d")
    assert parts == {"input/output": "a; b", "steps": "1. do x\n2. do y", "conditions": "c", "loops": "d"}


# ---------------------------------------------------------------------------------------------------
# The direct prompt, the plan controls and the Planner's pre-fill


def _coder_prompt_of(tiny, monkeypatch, method):
    calls = _record_sample(monkeypatch)
    run_method(team(tiny), method, [assert_problem()], n=1, temperature=0.0)
    (prompts, _, _), = calls
    return prompts[0]


def test_the_direct_prompt_holds_the_restatement_without_a_plan_framing(tiny, monkeypatch):
    prompt = _coder_prompt_of(tiny, monkeypatch, "direct")
    assert prompt == roles.direct_prompt(tiny[1], assert_problem())
    assert roles.restatement_plan(assert_problem()) in prompt and "Here is a plan" not in prompt


@pytest.mark.parametrize("method", evaluate.PLAN_CONTROLS)
def test_each_plan_control_gives_the_coder_its_text_as_the_plan(tiny, monkeypatch, method):
    prompt = _coder_prompt_of(tiny, monkeypatch, method)
    p = assert_problem()
    assert prompt == roles.coder_prompt(tiny[1], p, evaluate.control_plan(method, p))


def test_the_restatement_control_is_the_planners_prefill_without_a_planner():
    p = assert_problem()
    restatement = evaluate.control_plan("restatement", p)
    assert roles.plan_prefix(p) == restatement + roles.PLANNER_PREFILL_END


def test_a_planner_coder_plan_starts_with_the_prefilled_restatement(tiny):
    p = assert_problem()
    (attempt,), = run_method(team(tiny), "planner-coder", [p], n=1, temperature=0.0)
    assert attempt.plan.startswith(roles.plan_prefix(p))


def test_a_plan_passes_the_gate_only_when_the_planner_adds_content_to_the_prefill():
    p = assert_problem()
    prefix = roles.plan_prefix(p)
    added = roles.clean_plan(" negative numbers work the same; return a plus b with the built-in "
                             "sum.\nLoops: none.", prefix)
    bare = roles.clean_plan(" none.\nLoops: none.", prefix)
    assert roles.gate_label(added, problem=p) == "ok"
    assert roles.gate_label(bare, problem=p) == "restatement"


@pytest.mark.parametrize("role, limits", [
    ("planner", "plan"), ("coder", "code"), ("reasoner", "plan+code"), ("repair", "code"),
    ("retriever", "code"), ("debugger", "code")])
def test_each_role_gets_its_token_limit(tiny, role, limits):
    t = team(tiny, max_new_tokens=7, plan_max_new_tokens=5)
    expected = sum({"plan": 5, "code": 7}[part] for part in limits.split("+"))
    assert roles.token_limit(t, roles.ROLES[role].limit) == expected


# ---- Reference plans: written from the reference solution, stripped of the program ------------------

REFERENCE = "def add_evens(nums):\n    total = 0\n    for x in nums:\n        if x % 2 == 0:\n            total += x\n    return total\n"


def reference_problem():
    return Problem(id="mbpp/9001", bench="mbpp", statement="Write a function to add the even numbers of a list.",
                   kind="assert", public_tests=["assert add_evens([1, 2, 4]) == 6"],
                   hidden_tests=["assert add_evens([1, 2, 4]) == 6"], entry_point="add_evens", reference=REFERENCE)


def test_is_statement_tells_code_from_plan_words():
    code = ["total = 0", "for x in nums:", "for x in nums", "return total", "total += x", "nums.sort()"]
    words = ["Sum the even numbers.", "n", "None", "If the list is empty, return 0.", "", "Return the total."]
    assert all(roles.is_statement(t) for t in code)
    assert not any(roles.is_statement(t) for t in words)


def test_a_reference_plan_loses_its_code_lines_spans_blocks_and_copied_lines():
    text = ("Input/Output: a list of integers; their even sum.\n"
            "Steps: 1. Start a running sum at zero.\n"
            "2. total = 0\n"                                      # a statement, numbered
            "3. Add each even number: `total += x`, keep `nums` as given.\n"  # a statement span, a word span
            "4. check if x % 2 == 0: then add it\n"               # copies a reference line
            "```python\nreturn total\n```\n"                      # a code block
            "Conditions: an empty list gives 0.\n"
            "Loops: one pass over the list.")
    plan, removed = roles.strip_reference_plan(text, REFERENCE)
    assert plan == ("Input/Output: a list of integers; their even sum.\n"
                    "Steps: 1. Start a running sum at zero.\n"
                    "3. Add each even number: , keep `nums` as given.\n"
                    "Conditions: an empty list gives 0.\n"
                    "Loops: one pass over the list.")
    assert removed == 4  # the statement line, the span, the copied line, the block's one line


def test_reference_leaks_are_the_solutions_names_the_problem_does_not_show():
    problem = reference_problem()
    plan = "Steps: 1. Keep a total. 2. For each x in nums add it when even (add_evens, sum)."
    # add_evens is shown by the problem's test, sum is a builtin, x is one letter; nums and total
    # are the solution's own names
    assert roles.reference_leaks(plan, problem) == ["nums", "total"]
    assert roles.reference_leaks("Steps: 1. Keep a running sum.", problem) == []


def test_the_reference_planner_is_shown_the_solution_and_its_plan_is_stripped(tiny_model_dir):
    model, tok = roles.load_model(tiny_model_dir, dtype="float32")
    role = roles.ROLES["reference-planner"]
    problem = reference_problem()
    assert REFERENCE.strip() in role.prompt(tok, problem, {})
    out = role.parse(" a list; its even sum.\nSteps: 1. total = 0\n2. Keep a total of the evens.\n"
                     "Loops: over the list.", problem, {})
    assert out == {"plan": "Input/Output: a list; its even sum.\nSteps:\n2. Keep a total of the evens.\n"
                           "Loops: over the list.", "plan_stripped": 1, "plan_leaks": ["total"]}
    with pytest.raises(ValueError, match="no reference solution"):
        role.prompt(tok, roles.dataclasses.replace(problem, reference=""), {})
