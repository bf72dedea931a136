"""Tests of the MapCoder extension: the Retrieval / Planning-with-confidence / Debugging parsers on hand-written
messy texts, the mapcoder pipeline (control flow with a scripted sampler; end to end on the tiny random model),
train.py's retriever and debugger stages (2 steps each, adapter written; the Debugger sees only public-test
feedback; a batch where nothing fails is skipped cleanly), and evaluate.py's --method mapcoder.

The tiny model writes nonsense, so model-driven tests check plumbing only; behaviour is checked with scripted
completions whose right answer is known.
"""
import dataclasses
import json
import os

import pytest

import agents
import evaluate
import sandbox
import train
from data import Problem

SENTINEL = "HIDDEN_SENTINEL"  # appears only in hidden tests: it must never reach a prompt


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return agents.load_model(tiny_model_dir, device="cpu", dtype="float32")


def add_problem(i=0):
    return Problem(id=f"mbpp/{i}", bench="mbpp", statement=f"Write a function to add two numbers (variant {i}).",
                   kind="assert", public_tests=["assert add_nums(1, 2) == 3"],
                   hidden_tests=["assert add_nums(1, 2) == 3", f"assert add_nums(40, 2) == '{SENTINEL}'"],
                   entry_point="add_nums")


# ----------------------------------------------------------------------------------------------------------------
# Retrieval parser

# What a well-behaved model writes after the pre-filled "Algorithm:".
CLEAN = (" Two pointers\n"
         "Tutorial: Keep one index at each end and move them toward each other.\n"
         "Example 1: Find a pair with sum k in a sorted array.\n"
         "Plan 1: 1. i at the start, j at the end. 2. Move i or j by the sum.\n"
         "Example 2: Check whether a string is a palindrome.\n"
         "Plan 2: 1. Compare the ends. 2. Move inward.\n")


def test_parse_retrieval_clean_answer():
    r = agents.parse_retrieval(CLEAN)
    assert r["algorithm"] == "Two pointers"
    assert r["tutorial"] == "Keep one index at each end and move them toward each other."
    assert [e["problem"] for e in r["exemplars"]] == ["Find a pair with sum k in a sorted array.",
                                                      "Check whether a string is a palindrome."]
    assert r["exemplars"][1]["plan"] == "1. Compare the ends. 2. Move inward." and r["exemplars"][1]["code"] == ""


def test_parse_retrieval_markdown_decorations_give_the_same_structure():
    messy = (" Two pointers\n\n**Tutorial:** Keep one index at each end and move them toward each other.\n\n"
             "### Example 1\nFind a pair with sum k in a sorted array.\n"
             "**Plan 1**: 1. i at the start, j at the end. 2. Move i or j by the sum.\n\n"
             "2. Example 2: Check whether a string is a palindrome.\n"
             "- Plan 2: 1. Compare the ends. 2. Move inward.\n")
    assert agents.parse_retrieval(messy) == agents.parse_retrieval(CLEAN)
    labelled = CLEAN.replace("Example", "Similar problem")
    assert agents.parse_retrieval(labelled) == agents.parse_retrieval(CLEAN)


def test_parse_retrieval_plan_steps_numbered_as_plans_stay_in_their_exemplar():
    # What the untrained 0.5B wrote: the steps of each exemplar's plan labelled "Plan 1", "Plan 2", ...
    text = (" Counting\nExample 1: Count items in a tuple.\nPlan 1: Start at the root.\nPlan 2: Recurse on tuples.\n"
            "Example 2: Count words.\nPlan 1: Split.\nPlan 2: Tally.\n")
    r = agents.parse_retrieval(text)
    assert [(e["problem"], e["plan"]) for e in r["exemplars"]] == [
        ("Count items in a tuple.", "Start at the root.\nRecurse on tuples."), ("Count words.", "Split.\nTally.")]


def test_parse_retrieval_all_problems_first_then_all_plans():
    r = agents.parse_retrieval(" X\nExample 1: a.\nExample 2: b.\nPlan 1: pa.\nPlan 2: pb.")
    assert [(e["problem"], e["plan"]) for e in r["exemplars"]] == [("a.", "pa."), ("b.", "pb.")]


def test_parse_retrieval_drops_exact_repeats():
    text = " X\n" + "Example 1: same.\nPlan 1: p.\n" + "Example 2: same.\nPlan 2:  p.\n" + "Example 3: other.\nPlan 3: q."
    assert [e["problem"] for e in agents.parse_retrieval(text)["exemplars"]] == ["same.", "other."]


def test_parse_retrieval_missing_sections_are_empty_strings():
    r = agents.parse_retrieval(" Greedy\nExample 1: Make change with coins.\nExample 2: Schedule meetings.\n"
                               "Plan 2: Sort by end time.")
    assert r["tutorial"] == "" and r["algorithm"] == "Greedy"
    assert [(e["problem"], e["plan"]) for e in r["exemplars"]] == [("Make change with coins.", ""),
                                                                   ("Schedule meetings.", "Sort by end time.")]


@pytest.mark.parametrize("garbage", ["", "   ", "!!@@ ```\n}}}", None, "Example", "\n\n```python\nx = 1\n```"])
def test_parse_retrieval_survives_garbage(garbage):
    r = agents.parse_retrieval(garbage)
    assert set(r) == {"algorithm", "tutorial", "exemplars"} and isinstance(r["algorithm"], str)
    assert all(isinstance(v, str) for e in r["exemplars"] for v in e.values())
    assert agents.retrieval_text(r)  # renders to something (possibly "(nothing recalled)")


def test_parse_retrieval_code_goes_to_its_exemplar_and_stray_code_is_dropped():
    text = (" DP\n```python\nstray = 1\n```\nExample 1: Fibonacci.\nPlan 1: table.\nCode 1:\n"
            "```python\ndef fib(n):\n    return n\n```\nExample 2: Stairs.")
    r = agents.parse_retrieval(text)
    assert r["exemplars"][0]["code"] == "def fib(n):\n    return n"
    assert "stray" not in json.dumps(r)


def test_parse_retrieval_keeps_at_most_k_exemplars_in_order():
    text = "".join(f"\nExample {i}: p{i}\nPlan {i}: s{i}" for i in range(1, 6))
    assert [e["problem"] for e in agents.parse_retrieval(text, k=3)["exemplars"]] == ["p1", "p2", "p3"]


def test_parse_retrieval_prose_is_not_a_label_and_unnumbered_labels_pair_up():
    r = agents.parse_retrieval(" BFS\nExample:\nShortest path in a grid.\nPlan 1: Use a queue.\n"
                               "Plan the visits so each cell is seen once.\nExample: Islands.\nPlan: Flood fill.")
    assert [(e["problem"], e["plan"]) for e in r["exemplars"]] == [
        ("Shortest path in a grid.", "Use a queue.\nPlan the visits so each cell is seen once."),
        ("Islands.", "Flood fill.")]


# ----------------------------------------------------------------------------------------------------------------
# Confidence and plans

@pytest.mark.parametrize("value,expected", [
    ("85", 85.0), ("85%", 85.0), ("0.9", 90.0), ("8/10", 80.0), ("4 out of 5", 80.0), ("**70**", 70.0),
    ("high", 80.0), ("very low", 10.0), ("ninety", None), ("150", None), ("", None), ("-", None), ("3/0", None)])
def test_parse_confidence(value, expected):
    assert agents.parse_confidence(value) == expected


PLAN = "Input/Output: two ints; their sum.\nSteps: 1. Add.\nConditions: none.\nLoops: none."


def test_plan_with_confidence_splits_the_confidence_line_off():
    raw = PLAN[len("Input/Output:"):] + "\n**Confidence:** 75\nI am fairly sure."
    assert agents.plan_with_confidence(raw) == (PLAN, 75.0)


def test_plan_without_confidence_is_exactly_the_plain_planner_parse():
    raw = PLAN[len("Input/Output:"):] + "\n\n```python\ndef f(): pass\n```"
    assert agents.plan_with_confidence(raw) == (agents.clean_plan(raw), None)
    ctx = {"retrieval": {}}  # the Planner after a Retriever: its answer starts at the bare label
    parsed = agents.ROLES["planner"].parse(raw, add_problem(), ctx)
    assert parsed == {"plan": agents.clean_plan(raw), "confidence": None}


def test_bad_confidence_is_none_but_still_cut_from_the_plan():
    plan, conf = agents.plan_with_confidence(PLAN[len("Input/Output:"):] + "\nConfidence: ninety-ish")
    assert conf is None and plan == PLAN


def test_rank_plans_most_confident_first_unrated_last_ties_stable():
    assert agents.rank_plans([("a", None), ("b", 50.0), ("c", 90.0), ("d", 50.0), ("e", None)]) == \
        ["c", "b", "d", "a", "e"]


# ----------------------------------------------------------------------------------------------------------------
# Prompts and ROLES rows

def test_retriever_prompt_asks_for_k_exemplars_and_shows_no_hidden_test(tiny):
    _, tok = tiny
    prompt = agents.retriever_prompt(tok, add_problem(), k=2)
    assert prompt.endswith("<|im_start|>assistant\n" + agents.RETRIEVAL_PREFIX)
    assert "Similar problem 2:" in prompt and "Plan 2:" in prompt and "Similar problem 3:" not in prompt
    assert "assert add_nums(1, 2) == 3" in prompt and SENTINEL not in prompt


def test_planner_row_uses_retrieval_when_present_else_unchanged(tiny):
    _, tok = tiny
    p = add_problem()
    assert agents.ROLES["planner"].prompt(tok, p, {}) == agents.planner_prompt(tok, p)
    r = agents.parse_retrieval(CLEAN)
    prompt = agents.ROLES["planner"].prompt(tok, p, {"retrieval": r})
    assert "Two pointers" in prompt and "Move inward." in prompt and "Move i or j" in prompt
    assert "Confidence" in prompt and prompt.endswith(agents.PLAN_PREFIX)
    only_second = agents.retrieval_planner_prompt(tok, p, r, exemplar=1)
    assert "Move inward." in only_second and "Move i or j" not in only_second


def test_debugger_row_prompt_has_program_feedback_and_parses_code(tiny):
    _, tok = tiny
    ctx = {"program": "def add_nums(a, b):\n    return a - b", "feedback": "Test: assert add_nums(1, 2) == 3\nGot: -1"}
    prompt = agents.ROLES["debugger"].prompt(tok, add_problem(), ctx)
    assert "return a - b" in prompt and "Got: -1" in prompt and agents.DEBUGGER_SYSTEM in prompt
    parse = agents.ROLES["debugger"].parse
    fixed = "```python\ndef add_nums(a, b):\n    return a + b\n```"
    assert parse(fixed, add_problem(), ctx) == {"program": "def add_nums(a, b):\n    return a + b"}
    assert parse("no code here at all", add_problem(), ctx) == {"program": ""}


# ----------------------------------------------------------------------------------------------------------------
# The pipeline's control flow, with scripted completions

SCRIPT_RETRIEVAL = (" Arithmetic\nTutorial: add.\nExample 1: alpha problem.\nPlan 1: a.\n"
                    "Example 2: beta problem.\nPlan 2: b.\nExample 3: gamma problem.\nPlan 3: c.")
ONLY_ALPHA = " Arithmetic\nExample 1: alpha problem.\nPlan 1: a."
# alpha is rated 10, beta 90, gamma unrated -> order beta, alpha, gamma.
SCRIPT_PLANS = {"alpha": (" plan-alpha\nSteps: 1.\nConditions: -.\nLoops: -.\nConfidence: 10", "return a + b  # PASS"),
                "beta": (" plan-beta\nSteps: 1.\nConditions: -.\nLoops: -.\nConfidence: 90", "return 0  # beta"),
                "gamma": (" plan-gamma\nSteps: 1.\nConditions: -.\nLoops: -.", "return 0  # gamma")}


def scripted(monkeypatch):
    """Replace the sampler with scripted answers by role, and the public check by 'passes iff # PASS'.
    Returns the log of (role, prompts) per sample call and of checked programs."""
    log = {"calls": [], "checked": []}

    def fake_sample(model, tokenizer, prompts, group_size=1, **kw):
        texts = []
        for p in prompts:
            if agents.RETRIEVER_SYSTEM in p:
                # Problem variant 1 recalls only alpha (its plan passes at once); the others recall all three.
                role, text = "retriever", ONLY_ALPHA if "(variant 1)" in p else SCRIPT_RETRIEVAL
            elif "Confidence: <0 to 100>" in p:
                role, text = "planner", next(t for k, (t, _) in SCRIPT_PLANS.items() if f"{k} problem" in p)
            elif agents.DEBUGGER_SYSTEM in p:
                role, text = "debugger", "```python\ndef add_nums(a, b):\n    return 1  # debugged\n```"
            else:
                body = next(c for k, (_, c) in SCRIPT_PLANS.items() if f"plan-{k}" in p)
                role, text = "coder", f"```python\ndef add_nums(a, b):\n    {body}\n```"
            texts += [text] * group_size
        log["calls"].append((role, list(prompts)))
        return agents.Samples(prompt_ids=None, prompt_mask=None, completion_ids=None, completion_mask=None, texts=texts)

    def fake_check(problems, programs, pool):
        log["checked"].append(list(programs))
        return [("# PASS" in prog, f"public failure of: {prog.splitlines()[-1].strip()}") for prog in programs]

    monkeypatch.setattr(agents, "sample", fake_sample)
    monkeypatch.setattr(agents, "check_public", fake_check)
    return log


def test_mapcoder_ranks_plans_debugs_t_rounds_then_tries_the_next_plan(tiny, monkeypatch):
    model, tok = tiny
    log = scripted(monkeypatch)
    roles_seen = []
    real_acting = agents.acting
    monkeypatch.setattr(agents, "acting", lambda team, role: roles_seen.append(role) or real_acting(team, role))

    team = agents.Team(model, tok, pool=object(), mapcoder_k=3, mapcoder_t=2)
    out = evaluate.run_method(team, "mapcoder", [add_problem()], n=1, temperature=0.0)
    # Most confident plan (beta) coded, debugged twice, then the next plan (alpha) coded and it passes.
    assert roles_seen == ["retriever", "planner", "coder", "debugger", "debugger", "coder"]
    assert [role for role, _ in log["calls"]] == roles_seen
    assert len(log["calls"][1][1]) == 3  # one plan per recalled exemplar, in one call
    assert "plan-beta" in log["calls"][2][1][0] and "plan-alpha" in log["calls"][5][1][0]
    # The Debugger gets the plan it follows, the failing program and its public-test feedback.
    first_debug = log["calls"][3][1][0]
    assert "plan-beta" in first_debug and "return 0  # beta" in first_debug and "public failure of: return 0" in first_debug
    (a,) = out[0]
    assert "# PASS" in a.program and a.plan.startswith("Input/Output: plan-alpha") and a.rounds == 2


def test_mapcoder_keeps_the_last_program_when_every_plan_fails(tiny, monkeypatch):
    model, tok = tiny
    log = scripted(monkeypatch)
    monkeypatch.setitem(SCRIPT_PLANS, "alpha", (SCRIPT_PLANS["alpha"][0], "return 0  # alpha"))
    team = agents.Team(model, tok, pool=object(), mapcoder_k=3, mapcoder_t=1)
    out = evaluate.run_method(team, "mapcoder", [add_problem()], n=1, temperature=0.0)
    # 3 plans x (code + 1 debugging round) after retrieval and planning.
    assert [role for role, _ in log["calls"]] == ["retriever", "planner"] + ["coder", "debugger"] * 3
    (a,) = out[0]
    assert a.program.endswith("return 1  # debugged") and a.plan.startswith("Input/Output: plan-gamma") and a.rounds == 3


def test_mapcoder_batches_runs_and_drops_finished_ones(tiny, monkeypatch):
    model, tok = tiny
    log = scripted(monkeypatch)
    team = agents.Team(model, tok, pool=object(), mapcoder_k=3, mapcoder_t=1)
    problems = [add_problem(0), add_problem(1)]
    out = evaluate.run_method(team, "mapcoder", problems, n=1, temperature=1.0)
    calls = [(role, len(prompts)) for role, prompts in log["calls"]]
    # One call per stage: retrieval for both problems, 3 + 1 plans, then coding for both; problem 1 is done,
    # only problem 0 goes on.
    assert calls[:3] == [("retriever", 2), ("planner", 4), ("coder", 2)] and calls[3] == ("debugger", 1)
    assert "# PASS" in out[1][0].program and out[1][0].rounds == 0


def test_mapcoder_tiny_model_end_to_end_never_leaks_hidden_tests(tiny, monkeypatch):
    """Real sampler, real sandbox: garbage retrieval and plans flow through; only public tests reach prompts."""
    model, tok = tiny
    calls = []
    real = agents.sample

    def spy(model, tokenizer, prompts, group_size=1, **kw):
        calls.append((list(prompts), group_size))
        return real(model, tokenizer, prompts, group_size=group_size, **kw)

    monkeypatch.setattr(agents, "sample", spy)
    roles_seen = []
    real_acting = agents.acting
    monkeypatch.setattr(agents, "acting", lambda team, role: roles_seen.append(role) or real_acting(team, role))

    problems = [add_problem(0), add_problem(1)]
    with sandbox.SandboxPool(1) as pool:
        team = agents.Team(model, tok, pool=pool, max_new_tokens=8, plan_max_new_tokens=8,
                           mapcoder_k=2, mapcoder_t=1)
        out = evaluate.run_method(team, "mapcoder", problems, n=2, temperature=1.0)
    assert len(out) == 2 and all(len(a) == 2 for a in out)
    assert all(isinstance(a.program, str) and isinstance(a.plan, str) for atts in out for a in atts)
    assert roles_seen[:3] == ["retriever", "planner", "coder"] and set(roles_seen) <= set(agents.ROLES)
    assert calls[0][1] == 2 and len(calls[0][0]) == 2  # retrieval: n samples per problem, one call
    assert not any(SENTINEL in p for prompts, _ in calls for p in prompts)


def test_mapcoder_greedy_gives_n_identical_attempts(tiny):
    model, tok = tiny
    with sandbox.SandboxPool(1) as pool:
        team = agents.Team(model, tok, pool=pool, max_new_tokens=6, plan_max_new_tokens=6,
                           mapcoder_k=1, mapcoder_t=1)
        out = evaluate.run_method(team, "mapcoder", [add_problem()], n=3, temperature=0.0)
    assert len(out[0]) == 3 and len({(a.program, a.raw, a.plan) for a in out[0]}) == 1


# ----------------------------------------------------------------------------------------------------------------
# train.py: the retriever and debugger stages

def small(model, out, stage, data, steps=2, extra=()):
    return ["--stage", stage, "--model", model, "--out", str(out), "--data", data, "--limit", "4",
            "--num-steps", str(steps), "--problems-per-step", "2", "--group-size", "2", "--max-new-tokens", "16",
            "--plan-max-new-tokens", "16", "--eval-every", "2", "--eval-limit", "2",
            "--workers", "2", "--dtype", "float32", *extra]


def train_small(argv):
    """train.main with MapCoder's k = t = 1 (one exemplar, one debugging round; train.py takes them
    from agents.MAPCODER_K / MAPCODER_T), so that a run on the tiny model stays short."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(agents, "MAPCODER_K", 1)
        mp.setattr(agents, "MAPCODER_T", 1)
        train.main(argv)


def read_metrics(out):
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


@pytest.fixture(scope="module")
def retriever_run(tiny_model_dir, mbpp_path, tmp_path_factory):
    out = tmp_path_factory.mktemp("retriever")
    train_small(small(tiny_model_dir, out, "retriever", mbpp_path))
    return out


def test_retriever_stage_trains_and_writes_its_adapter(retriever_run):
    assert os.path.exists(retriever_run / "final" / "retriever" / "adapter_config.json")
    assert os.path.exists(retriever_run / "final" / "retriever" / "adapter_model.safetensors")
    m = read_metrics(retriever_run)
    assert [r["step"] for r in m] == [1, 2] and all(r["groups"] == 2 for r in m)
    assert all("reward_mean" in r and "grad_norm" in r for r in m)
    # The held-out evaluation of MapCoder's stages compares mapcoder with direct coding.
    assert "eval_pass1_mapcoder_start" in m[0] and "eval_pass1_mapcoder" in m[1] and "eval_cg" in m[1]


def test_retriever_stage_scores_retrievals_through_frozen_planner_and_coder(tiny_model_dir, mbpp_path, tmp_path,
                                                                           monkeypatch):
    prompts_by_call = []
    real = agents.sample
    monkeypatch.setattr(agents, "sample", lambda *a, **k: prompts_by_call.append((list(a[2]), k["group_size"]))
                        or real(*a, **k))
    train_small(small(tiny_model_dir, tmp_path / "r", "retriever", mbpp_path, steps=1,
                      extra=("--eval-every", "0", "--downstream-samples", "2")))
    # Retriever: 2 problems x G=2; planner: M=2 per retrieval; coder: 1 per plan (M is drawn once).
    assert [(len(p), g) for p, g in prompts_by_call] == [(2, 2), (4, 2), (8, 1)]
    assert all("Confidence: <0 to 100>" in p for p in prompts_by_call[1][0])


@pytest.fixture(scope="module")
def debugger_run(tiny_model_dir, mbpp_path, tmp_path_factory):
    out = tmp_path_factory.mktemp("debugger")
    train_small(small(tiny_model_dir, out, "debugger", mbpp_path))
    return out


def test_debugger_stage_trains_and_writes_its_adapter(debugger_run):
    assert os.path.exists(debugger_run / "final" / "debugger" / "adapter_config.json")
    m = read_metrics(debugger_run)
    # The tiny model's programs never pass, so every problem fails its public test and forms a group.
    assert [r["step"] for r in m] == [1, 2] and all(r["groups"] == 2 and not r.get("no_group") for r in m)
    assert "eval_pass1_mapcoder" in m[1]


def sentinel_mbpp(path):
    """A small MBPP-format file (train ids) whose hidden tests contain SENTINEL; only test_list[0] is public."""
    with open(path, "w") as f:
        for i in range(4):
            f.write(json.dumps({"task_id": 601 + i, "text": f"Write a function to add two numbers, case {i}.",
                                "code": "def add_nums(a, b):\n    return a + b",
                                "test_list": [f"assert add_nums({i}, 2) == {i + 2}", f"assert add_nums(40, 2) == '{SENTINEL}'"],
                                "test_setup_code": "", "challenge_test_list": []}) + "\n")
    return str(path)


def test_debugger_sees_public_feedback_never_hidden_tests(tiny_model_dir, tmp_path, monkeypatch):
    data = sentinel_mbpp(tmp_path / "mbpp.jsonl")
    # The frozen Coder writes a real, wrong program, so the public test runs in the sandbox and fails.
    wrong = {"program": "def add_nums(a, b):\n    return 0"}
    coder = dataclasses.replace(agents.ROLES["coder"], parse=lambda text, p, ctx: wrong)
    monkeypatch.setitem(agents.ROLES, "coder", coder)
    prompts = []
    real = agents.sample
    monkeypatch.setattr(agents, "sample", lambda *a, **k: prompts.extend(a[2]) or real(*a, **k))
    train_small(small(tiny_model_dir, tmp_path / "run", "debugger", data,
                      extra=("--eval-split", "train", "--eval-limit", "2",
                             "--allow-held-out-split")))
    # Training's Debugger prompts (the held-out mapcoder eval's also show the plan they followed).
    debugger_prompts = [p for p in prompts if agents.DEBUGGER_SYSTEM in p and "The plan it followed" not in p]
    assert debugger_prompts and all("return 0" in p and "Verdict: failed" in p for p in debugger_prompts)
    assert any("Test: assert add_nums(0, 2) == 2" in p for p in debugger_prompts)
    # No prompt of any role, in training or in the held-out evaluation, ever shows a hidden test.
    assert not any(SENTINEL in p for p in prompts)


def test_debugger_stage_skips_a_batch_where_nothing_fails(tiny_model_dir, mbpp_path, tmp_path, monkeypatch):
    calls = []

    def fake_check(problems, programs, pool):
        # Step 1: every program passes its public test (no group); step 2: only the first passes.
        calls.append(len(problems))
        return [(len(calls) == 1 or k == 0, "Test: x\nVerdict: failed") for k in range(len(problems))]

    monkeypatch.setattr(agents, "check_public", fake_check)
    saved, real_save = [], train.save_checkpoint
    monkeypatch.setattr(train, "save_checkpoint", lambda state, step: saved.append(step)
                        or real_save(state, step))
    out = tmp_path / "run"
    train_small(small(tiny_model_dir, out, "debugger", mbpp_path, extra=("--eval-every", "0")))
    m = read_metrics(out)
    assert m[0]["no_group"] is True and m[0]["groups"] == 0 and "reward_mean" not in m[0]
    assert m[1]["groups"] == 1 and not m[1].get("no_group") and "reward_mean" in m[1]
    assert saved == [1, 2]  # the skipped step is saved too: a resume does not redo it
    assert os.path.exists(out / "final" / "debugger" / "adapter_config.json")


def test_bad_new_adapter_flag_is_one_error_line(tiny_model_dir, mbpp_path, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        train_small(small(tiny_model_dir, tmp_path / "r", "debugger", mbpp_path,
                          extra=("--adapter", f"retriever={tmp_path / 'nope'}")))
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and "--adapter retriever=" in err and len(err.splitlines()) == 1


# ----------------------------------------------------------------------------------------------------------------
# evaluate.py: --method mapcoder

FAST = ["--bench", "mbpp", "--split", "validation", "--limit", "2", "-n", "1", "--temperature", "0", "--dtype", "float32",
        "--max-new-tokens", "12", "--plan-max-new-tokens", "12", "--workers", "2", "--mapcoder-k", "2",
        "--mapcoder-t", "1"]


def test_evaluate_mapcoder_reports_cg_against_direct(tiny_model_dir, mbpp_path, tmp_path, retriever_run,
                                                     debugger_run):
    argv = FAST + ["--model", tiny_model_dir, "--data", mbpp_path, "--out", str(tmp_path),
                   "--adapter", f"retriever={retriever_run / 'final' / 'retriever'}",
                   "--adapter", f"debugger={debugger_run / 'final' / 'debugger'}"]
    assert evaluate.main(argv + ["--method", "mapcoder"]) == 0
    assert evaluate.main(argv + ["--method", "direct"]) == 0
    summary = json.load(open(tmp_path / "summary.json"))
    assert set(summary) == {"mapcoder", "direct", "sandbox"} and summary["mapcoder"]["cg_vs"] == "direct"
    settings = json.load(open(tmp_path / "settings.json"))
    assert settings["mapcoder_k"] == 2 and settings["retriever_adapter"].endswith("retriever")
