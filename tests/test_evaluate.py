"""Tests of evaluate.py: the metric bookkeeping on hand-made records, and the script end to end on the
tiny random model (2 MBPP validation problems, greedy, 16 tokens) — exit codes, files, resume, errors.

The tiny model writes nonsense, so the end-to-end tests check the plumbing (keys, files, resume), never
the scores; the scores are checked by summarize() on records whose answer is known.
"""
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

import evaluate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# One small, fast setting shared by the end-to-end runs.
FAST = ["--bench", "mbpp", "--split", "validation", "--limit", "2", "-n", "1", "--temperature", "0", "--dtype", "float32",
        "--max-new-tokens", "16", "--plan-max-new-tokens", "16", "--repair-rounds", "1", "--workers", "2"]


def rec(pid, verdicts, pass_rates=None, cpu_ms=1.0, peak_mb=2.0):
    """A per-problem record as evaluate writes it, with only the fields summarize() reads."""
    pass_rates = pass_rates or [1.0 if v == "passed" else 0.0 for v in verdicts]
    return {"id": pid, "wall_s": 0.5, "samples": [
        {"verdict": v, "pass_rate": r, "cpu_ms": cpu_ms, "peak_mb": peak_mb} for v, r in zip(verdicts, pass_rates)]}


# ----------------------------------------------------------------------------------------------------
# summarize() and friends: pure, no model.


def test_summarize_pass1_is_mean_fraction_of_passing_samples():
    recs = [rec("a", ["passed", "failed"]), rec("b", ["failed", "failed"])]
    s = evaluate.summarize({"direct": recs}, n=2)["direct"]
    # Problem a: 1 of 2 -> 0.5; problem b: 0 -> mean 0.25.
    assert s["pass@1"] == pytest.approx(0.25)


def test_summarize_pass5_only_when_n_at_least_5():
    assert "pass@5" not in evaluate.summarize({"direct": [rec("a", ["passed"] + ["failed"] * 3)]}, n=4)["direct"]
    s = evaluate.summarize({"direct": [rec("a", ["passed"] + ["failed"] * 5)]}, n=6)["direct"]
    # Unbiased estimator, 1 correct of 6: 1 - C(5,5)/C(6,5) = 1 - 1/6.
    assert s["pass@5"] == pytest.approx(5 / 6)


def test_summarize_apr_is_mean_test_pass_rate():
    recs = [rec("a", ["failed", "passed"], pass_rates=[0.5, 1.0]), rec("b", ["failed", "error"], [0.25, 0.0])]
    assert evaluate.summarize({"cot": recs}, n=2)["cot"]["apr"] == pytest.approx((0.5 + 1.0 + 0.25 + 0.0) / 4)


def test_summarize_cpu_and_memory_average_passing_samples_only():
    recs = [rec("a", ["passed"], cpu_ms=4.0, peak_mb=8.0), rec("b", ["timeout"], cpu_ms=4000.0, peak_mb=900.0),
            rec("c", ["passed"], cpu_ms=2.0, peak_mb=2.0)]
    s = evaluate.summarize({"direct": recs}, n=1)["direct"]
    assert (s["cpu_ms"], s["peak_mb"]) == (pytest.approx(3.0), pytest.approx(5.0))
    # Nothing passes -> no efficiency figure at all (not 0, which would read as "infinitely fast").
    none = evaluate.summarize({"direct": [rec("b", ["failed"])]}, n=1)["direct"]
    assert none["cpu_ms"] is None and none["peak_mb"] is None


def test_summarize_cg_is_planner_coder_minus_direct_on_common_problems():
    direct = [rec("a", ["failed"]), rec("b", ["passed"]), rec("extra", ["passed"])]
    planner_coder = [rec("a", ["passed"]), rec("b", ["passed"])]
    s = evaluate.summarize({"direct": direct, "planner-coder": planner_coder}, n=1)
    # On {a, b}: 1.0 - 0.5. The direct-only problem "extra" must not enter the comparison.
    assert s["planner-coder"]["cg"] == pytest.approx(0.5)
    assert "cg" not in s["direct"]
    # Without the baseline there is no CG to report.
    assert "cg" not in evaluate.summarize({"planner-coder": planner_coder}, n=1)["planner-coder"]


def test_summarize_plan_info_is_own_plan_minus_content_free_plan_with_paired_counts():
    own = [rec("a", ["passed"]), rec("b", ["passed"]), rec("c", ["failed"]), rec("d", ["passed"])]
    free = [rec("a", ["failed"]), rec("b", ["passed"]), rec("c", ["passed"]), rec("d", ["failed"]), rec("x", ["passed"])]
    s = evaluate.summarize({"planner-coder": own, "content-free-plan": free}, n=1)["planner-coder"]
    # On {a, b, c, d}: 3/4 - 2/4; a and d solved with own plans only, c with the content-free plan only.
    assert s["plan_info"] == pytest.approx(0.25) and s["plan_info_vs"] == "content-free-plan"
    assert (s["plan_info_gained"], s["plan_info_lost"]) == (2, 1)
    assert s["plan_info_p"] == pytest.approx(evaluate.rewards.mcnemar_exact(2, 1))
    assert "plan_info" not in evaluate.summarize({"planner-coder": own}, n=1)["planner-coder"]


def test_plan_information_is_measured_against_the_strongest_control_on_the_same_problems():
    own = [rec("a", ["passed"]), rec("b", ["passed"]), rec("c", ["failed"])]
    free = [rec("a", ["failed"]), rec("b", ["failed"]), rec("c", ["failed"])]
    restated = [rec("a", ["passed"]), rec("b", ["failed"]), rec("c", ["passed"])]
    s = evaluate.summarize({"planner-coder": own, "content-free-plan": free, "restatement": restated}, n=1)
    assert s["planner-coder"]["plan_info_vs"] == "restatement" and s["planner-coder"]["plan_info"] == pytest.approx(0)
    assert (s["planner-coder"]["plan_info_gained"], s["planner-coder"]["plan_info_lost"]) == (1, 1)


def test_the_plan_controls_give_the_coder_their_text_and_the_generic_plan_passes_the_gate(mbpp_path):
    problem = evaluate.data.load("mbpp", path=mbpp_path, split="validation", limit=1)[0]
    restated = evaluate.agents.restatement_plan(problem)
    assert problem.statement.split()[0] in restated and problem.public_tests[0] in restated
    # The generic plan slips past every text rule (that is why it is a control); a restatement does not.
    assert evaluate.agents.gate_label(evaluate.GENERIC_PLAN, problem=problem) == "ok"
    assert evaluate.agents.gate_label(restated, problem=problem) == "restatement"


def test_summarize_reports_the_plans_format_and_share_truncated_for_methods_with_plans():
    good = ("Input/Output: a list of ints; their sum.\nSteps: 1. Add every number to a running total.\n"
            "Conditions: an empty list sums to 0.\nLoops: over the list once.")
    recs = [rec("a", ["passed"]), rec("b", ["failed"])]
    recs[0]["samples"][0].update(plan=good, plan_truncated=True)
    recs[1]["samples"][0].update(plan=evaluate.agents.CONTENT_FREE_PLAN, plan_truncated=False)
    s = evaluate.summarize({"planner-coder": recs, "direct": [rec("a", ["passed"])]}, n=1)
    assert s["planner-coder"]["plan_truncated_frac"] == 0.5
    assert s["planner-coder"]["plan_ok_frac"] == 0.5 and s["planner-coder"]["plan_content_free_frac"] == 0.5
    assert "plan_truncated_frac" not in s["direct"]  # no plans, no plan statistics
    table = evaluate.format_table(s, n=1)
    assert "truncated%" in table and "50.0" in table.splitlines()[2]


def test_paired_counts_only_the_problems_both_have():
    assert evaluate.paired({"a": True, "b": False, "c": True}, {"a": False, "b": True, "z": False}) == \
        {"problems": 2, "a_passed": 1, "b_passed": 1, "gained": 1, "lost": 1, "p": 1.0}


def test_other_plan_donors_are_a_derangement_of_the_whole_list_whatever_the_chunk():
    problems = list("abcde")
    chunks = [[(0, "a"), (1, "b")], [(2, "c"), (3, "d")], [(4, "e")]]
    donors = [d for chunk in chunks for d in evaluate.other_plan_donors(problems, chunk)]
    assert donors == list("bcdea")


def _write_row(path, passed):
    with open(path, "w") as f:
        for pid, ok in passed.items():
            f.write(json.dumps(rec(pid, ["passed" if ok else "failed"])) + "\n")


def test_compare_prints_gained_lost_and_p_per_row(tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    _write_row(a / "planner-coder.jsonl", {"1": True, "2": True, "3": True, "4": False})
    _write_row(b / "planner-coder.jsonl", {"1": False, "2": False, "3": True, "4": True})
    _write_row(a / "direct.jsonl", {"1": True})  # only in A: not compared
    assert evaluate.main(["--compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("planner-coder")).split()
    assert row == ["planner-coder", "4", "75.0", "50.0", "+25.0", "+2", "-1", "1"]
    assert not any(line.startswith("direct") for line in out.splitlines())
    # Two row files of different names compare with each other.
    assert evaluate.main(["--compare", str(a / "planner-coder.jsonl"), str(b / "planner-coder.jsonl")]) == 0


def test_compare_of_dirs_without_a_common_row_is_one_error_line(tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    _write_row(a / "direct.jsonl", {"1": True})
    assert evaluate.main(["--compare", str(a), str(b)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --compare")
    assert evaluate.main(["--compare", str(a), str(tmp_path / "nothing")]) == 2


def test_other_plan_on_one_problem_is_one_error_line(tiny_model_dir, mbpp_path, tmp_path, capsys):
    argv = FAST[:FAST.index("--limit")] + ["--limit", "1", "--method", "other-plan", "--model", tiny_model_dir,
                                           "--data", mbpp_path, "--out", str(tmp_path / "o")]
    assert evaluate.main(argv) == 2
    assert "at least 2" in capsys.readouterr().err


def test_format_table_is_aligned_and_marks_missing_values():
    s = evaluate.summarize({"direct": [rec("a", ["failed"])], "planner-coder": [rec("a", ["passed"])]}, n=1)
    lines = evaluate.format_table(s, n=1).splitlines()
    assert len({len(line) for line in lines}) == 1  # every row as wide as the header
    assert lines[2].split()[0] == "direct" and "-" in lines[2].split()  # no cpu_ms when nothing passed
    assert "+100.0" in lines[3]


def test_read_records_drops_a_line_cut_short_by_a_kill(tmp_path):
    path = tmp_path / "direct.jsonl"
    path.write_text(json.dumps({"id": "a", "samples": []}) + "\n" + '{"id": "b", "sam')
    assert [r["id"] for r in evaluate.read_records(str(path))] == ["a"]
    # The file is rewritten so that the next append starts on a fresh line.
    assert path.read_text().endswith("\n") and len(path.read_text().splitlines()) == 1


# ----------------------------------------------------------------------------------------------------
# The script end to end on the tiny model.


@pytest.fixture(scope="module")
def all_run(tiny_model_dir, mbpp_path, tmp_path_factory):
    """One `--method all` run (every method, 2 problems); returns (argv, out dir, exit code)."""
    out = str(tmp_path_factory.mktemp("eval-all"))
    argv = FAST + ["--method", "all", "--model", tiny_model_dir, "--data", mbpp_path, "--out", out]
    return argv, out, evaluate.main(argv)


def test_method_all_exits_0_and_writes_every_method(all_run):
    argv, out, rc = all_run
    assert rc == 0
    with open(os.path.join(out, "summary.json")) as f:
        summary = json.load(f)
    # 'all' = every method but given-plan, which needs --plans-from, and reference-plan (the ceiling)
    assert set(summary) == set(evaluate.METHODS) - {"given-plan", "reference-plan"} | {"sandbox"}
    for method in set(evaluate.METHODS) - {"given-plan", "reference-plan"}:
        with open(os.path.join(out, f"{method}.jsonl")) as f:
            lines = [json.loads(line) for line in f]
        assert [len(r["samples"]) for r in lines] == [1, 1]
        assert {"program", "verdict", "pass_rate", "cpu_ms", "peak_mb"} <= set(lines[0]["samples"][0])


def test_summary_has_the_promised_keys(all_run):
    _, out, _ = all_run
    with open(os.path.join(out, "summary.json")) as f:
        summary = json.load(f)
    mode = summary.pop("sandbox")  # the sandbox's mode is recorded with the results
    assert {"name", "isolated", "cpu_counted", "memory_counted", "missing"} <= set(mode)
    for method, metrics in summary.items():
        assert {"pass@1", "apr", "cpu_ms", "peak_mb", "wall_s"} <= set(metrics), method
        assert "pass@5" not in metrics  # n = 1
    assert "cg" in summary["planner-coder"] and "plan_info" in summary["planner-coder"]
    with open(os.path.join(out, "args.json")) as f:
        resolved = [m for m in evaluate.METHODS if m not in ("given-plan", "reference-plan")]
        assert json.load(f)["method"] == resolved  # 'all' resolved


def test_resume_skips_done_problems_without_generating(all_run, capsys, monkeypatch):
    argv, out, _ = all_run
    rows = set(evaluate.METHODS) - {"given-plan", "reference-plan"}
    before = {m: open(os.path.join(out, f"{m}.jsonl")).read() for m in rows}
    capsys.readouterr()

    def no_loading(*a, **k):
        raise AssertionError("the model was loaded although every problem was done")

    # Nothing left to do -> the model is never even loaded, let alone sampled.
    monkeypatch.setattr(evaluate.agents, "load_model", no_loading)
    assert evaluate.main(argv) == 0
    assert "direct: skipped 2 done" in capsys.readouterr().out
    assert {m: open(os.path.join(out, f"{m}.jsonl")).read() for m in rows} == before


def test_resume_with_other_settings_is_refused(all_run, capsys):
    argv, out, _ = all_run
    capsys.readouterr()
    assert evaluate.main(argv + ["--max-new-tokens", "8"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "--out" in err and "max_new_tokens" in err and "\n" not in err


def plans_file(path, ids, plans_per_problem=("Plan one.",)):
    """A <row>.jsonl as an earlier run writes it, with only the fields given-plan reads."""
    with open(path, "w") as f:
        for pid in ids:
            f.write(json.dumps({"id": pid, "samples": [{"plan": plan and f"{plan} ({pid})", "plan_truncated": False}
                                                       for plan in plans_per_problem]}) + "\n")
    return str(path)


def validation_ids(mbpp_path, limit=2):
    return [p.id for p in evaluate.data.load("mbpp", path=mbpp_path, split="validation", limit=limit)]


def test_given_plan_codes_from_the_plans_of_another_run(tiny_model_dir, mbpp_path, tmp_path):
    base = FAST + ["--model", tiny_model_dir, "--data", mbpp_path]
    assert evaluate.main(base + ["--method", "planner-coder", "--out", str(tmp_path / "a")]) == 0
    src = tmp_path / "a" / "planner-coder.jsonl"
    assert evaluate.main(base + ["--method", "given-plan", "content-free-plan", "--plans-from", str(src),
                                 "--out", str(tmp_path / "b")]) == 0

    def plans(path):
        return {r["id"]: [(s["plan"], s["plan_truncated"]) for s in r["samples"]] for r in evaluate.read_records(path)}

    assert plans(str(tmp_path / "b" / "given-plan.jsonl")) == plans(str(src))
    with open(tmp_path / "b" / "summary.json") as f:
        row = json.load(f)["given-plan"]
    assert row["plan_info_vs"] == "content-free-plan"


def test_reference_plans_are_a_row_given_plan_reads(tiny_model_dir, mbpp_path, tmp_path):
    base = FAST + ["--model", tiny_model_dir, "--data", mbpp_path]
    assert evaluate.main(base + ["--method", "reference-plan", "direct", "--out", str(tmp_path / "a")]) == 0
    src = tmp_path / "a" / "reference-plan.jsonl"
    samples = [s for r in evaluate.read_records(str(src)) for s in r["samples"]]
    assert len(samples) == 2 and all(s["plan"].startswith("Input/Output:") for s in samples)
    assert all(isinstance(s["plan_stripped"], int) and isinstance(s["plan_leaks"], list) for s in samples)
    with open(tmp_path / "a" / "summary.json") as f:
        assert json.load(f)["reference-plan"]["cg_vs"] == "direct"
    assert evaluate.main(base + ["--method", "given-plan", "--plans-from", str(src), "--out",
                                 str(tmp_path / "b")]) == 0
    given = evaluate.read_records(str(tmp_path / "b" / "given-plan.jsonl"))
    assert [s["plan"] for r in given for s in r["samples"]] == [s["plan"] for s in samples]


def test_reference_plan_without_reference_solutions_is_one_error_line(tiny_model_dir, tmp_path, capsys,
                                                                      monkeypatch):
    path = tmp_path / "mbpp.jsonl"
    path.write_text(json.dumps({"task_id": 11, "text": "Add one.", "test_list": ["assert f(1) == 2"]}) + "\n")
    monkeypatch.setattr(evaluate.agents, "load_model", lambda *a, **k: 1 / 0)
    argv = FAST + ["--method", "reference-plan", "--model", tiny_model_dir, "--data", str(path),
                   "--split", "all", "--out", str(tmp_path / "out")]
    assert evaluate.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "reference solution" in err and "mbpp/11" in err and "\n" not in err


@pytest.mark.parametrize("case, says", [
    ("missing", "no such file"), ("no plans", "carry no plans"), ("fewer problems", "has 0 plans"),
    ("other n", "has 2 plans")])
def test_bad_plans_from_is_one_error_line_before_the_model_loads(tiny_model_dir, mbpp_path, tmp_path, capsys,
                                                                 monkeypatch, case, says):
    ids = validation_ids(mbpp_path)
    path = {"missing": str(tmp_path / "nothing.jsonl"),
            "no plans": plans_file(tmp_path / "direct.jsonl", ids, ("",)),
            "fewer problems": plans_file(tmp_path / "one.jsonl", ids[:1]),
            "other n": plans_file(tmp_path / "two.jsonl", ids, ("Plan one.", "Plan two."))}[case]

    def no_loading(*a, **k):
        raise AssertionError("the model was loaded before the plans were checked")

    monkeypatch.setattr(evaluate.agents, "load_model", no_loading)
    argv = FAST + ["--method", "given-plan", "--plans-from", path, "--model", tiny_model_dir, "--data", mbpp_path,
                   "--out", str(tmp_path / "out")]
    assert evaluate.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --plans-from") and says in err and "\n" not in err
    assert not os.path.exists(tmp_path / "out")


@pytest.mark.parametrize("flags, says", [(["--method", "given-plan"], "needs --plans-from"),
                                         (["--method", "direct", "--plans-from", "x.jsonl"], "only by --method")])
def test_given_plan_and_plans_from_come_together(flags, says, capsys):
    with pytest.raises(SystemExit) as e:
        evaluate.parse_args(flags)
    assert e.value.code == 2 and says in capsys.readouterr().err


def test_a_resume_from_other_plans_is_refused(tiny_model_dir, mbpp_path, tmp_path, capsys):
    ids = validation_ids(mbpp_path)
    path = plans_file(tmp_path / "p.jsonl", ids)
    argv = FAST + ["--method", "given-plan", "--plans-from", path, "--model", tiny_model_dir, "--data", mbpp_path,
                   "--out", str(tmp_path / "out")]
    assert evaluate.main(argv) == 0
    plans_file(tmp_path / "p.jsonl", ids, ("Another plan.",))  # the same path, other plans
    capsys.readouterr()
    assert evaluate.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "plans_digest" in err and "\n" not in err  # the plans are keyed by content


def planner_adapter_run(tiny_model_dir, mbpp_path, tmp_path):
    """A fresh planner adapter saved to tmp_path/planner, and the planner-coder argv that evaluates with it."""
    import agents
    import grpo

    model, _ = agents.load_model(tiny_model_dir, dtype="float32")
    grpo.add_lora(model, "planner", r=2)
    grpo.save_adapter(model, "planner", str(tmp_path / "planner"))
    return model, FAST + ["--method", "planner-coder", "--model", tiny_model_dir, "--data", mbpp_path,
                          "--adapter", f"planner={tmp_path / 'planner'}", "--out", str(tmp_path / "out")]


def test_adapters_are_loaded_per_role(tiny_model_dir, mbpp_path, tmp_path):
    _, argv = planner_adapter_run(tiny_model_dir, mbpp_path, tmp_path)
    assert evaluate.main(argv) == 0
    with open(tmp_path / "out" / "settings.json") as f:
        assert json.load(f)["planner_adapter"] == str(tmp_path / "planner")


def test_an_adapter_overwritten_at_the_same_path_does_not_reuse_old_results(tiny_model_dir, mbpp_path, tmp_path,
                                                                            capsys):
    import grpo
    import torch

    model, argv = planner_adapter_run(tiny_model_dir, mbpp_path, tmp_path)
    assert evaluate.main(argv) == 0
    with torch.no_grad():  # "train" it: new weights, same path
        for p in grpo.lora_parameters(model, "planner"):
            p.add_(0.5)
    grpo.save_adapter(model, "planner", str(tmp_path / "planner"))
    capsys.readouterr()
    assert evaluate.main(argv) == 2
    err = capsys.readouterr().err
    assert "planner_adapter_digest" in err and len(err.strip().splitlines()) == 1


def test_default_out_dir_without_and_with_adapters(tiny_model_dir, mbpp_path, tmp_path, monkeypatch):
    # No --out: runs/eval/<bench>-<split>-<model>-n<N>-t<T>-tok<plan>-<code>, plus -a<hash of the adapters> when
    # adapters are given; another token budget is another directory (not a settings error).
    import agents
    import grpo

    model, _ = agents.load_model(tiny_model_dir, dtype="float32")
    grpo.add_lora(model, "coder", r=2)
    grpo.save_adapter(model, "coder", str(tmp_path / "coder"))
    monkeypatch.chdir(tmp_path)
    argv = FAST + ["--method", "direct", "--model", tiny_model_dir, "--data", mbpp_path]
    assert evaluate.main(argv) == 0
    assert evaluate.main(argv + ["--adapter", f"coder={tmp_path / 'coder'}"]) == 0
    assert evaluate.main(argv + ["--max-new-tokens", "5"]) == 0
    made = sorted(os.listdir(tmp_path / "runs" / "eval"))
    base = f"mbpp-validation-{os.path.basename(tiny_model_dir)}-n1-t0-tok16-16"
    other = f"mbpp-validation-{os.path.basename(tiny_model_dir)}-n1-t0-tok16-5"
    assert made == sorted([base, other, made[1]]) and made[1].startswith(base + "-a") and len(made) == 3
    assert all(os.path.exists(tmp_path / "runs" / "eval" / d / "summary.json") for d in made)


def test_canonical_solutions_pass_and_wrong_programs_fail(tiny_model_dir, mbpp_path, tmp_path, monkeypatch):
    """Scoring wiring (Job fields, verdicts, metrics): MBPP's own solutions pass, a wrong one does not."""
    with open(mbpp_path) as f:
        code = {f"mbpp/{r['task_id']}": r["code"] for r in map(json.loads, f)}

    def fake_run_method(team, method, problems, n, **_):
        # Sample 0: the reference solution; sample 1: a program that defines nothing.
        return [[evaluate.agents.Attempt(program=code[p.id]), evaluate.agents.Attempt(program="pass")]
                for p in problems]

    monkeypatch.setattr(evaluate, "run_method", fake_run_method)
    # A later flag wins in argparse: -n 2 and --temperature 0.8 override FAST's -n 1 and greedy.
    assert evaluate.main(FAST + ["-n", "2", "--temperature", "0.8", "--method", "direct", "--model", tiny_model_dir,
                                 "--data", mbpp_path, "--out", str(tmp_path)]) == 0
    with open(tmp_path / "summary.json") as f:
        s = json.load(f)["direct"]
    assert s["pass@1"] == pytest.approx(0.5) and s["apr"] == pytest.approx(0.5)
    assert s["cpu_ms"] > 0 and s["peak_mb"] >= 0


def run_cli(args):
    """evaluate.py as a subprocess: what a user sees (exit code, stderr), tracebacks included."""
    return subprocess.run([sys.executable, os.path.join(ROOT, "evaluate.py")] + args, capture_output=True,
                          text=True, cwd=ROOT, timeout=120)


def test_missing_model_is_one_error_line(mbpp_path, tmp_path):
    p = run_cli(FAST + ["--model", str(tmp_path / "nope"), "--data", mbpp_path, "--out", str(tmp_path / "o")])
    assert p.returncode == 2
    assert p.stderr.strip().startswith("error:") and "--model" in p.stderr and len(p.stderr.strip().splitlines()) == 1
    # Nothing written, not even the directory: a fixed --model must not then be refused as "other settings".
    assert not os.path.exists(tmp_path / "o")
    assert p.stdout == ""  # nothing printed (no plan of problems, no estimate) before the error


def test_an_unreachable_hub_fails_in_seconds_naming_what_to_pass(mbpp_path, tmp_path):
    env = dict(os.environ, HF_ENDPOINT="http://127.0.0.1:9", HF_HOME=str(tmp_path / "hf"))
    env.pop("HF_HUB_OFFLINE", None)
    t0 = time.time()
    p = subprocess.run([sys.executable, os.path.join(ROOT, "evaluate.py"), *FAST, "--model", "no-org/no-model-xyz",
                        "--data", mbpp_path, "--out", str(tmp_path / "o")], capture_output=True, text=True, cwd=ROOT,
                       timeout=120, env=env)
    assert p.returncode == 2 and time.time() - t0 < 30
    assert "--model DIR or CORECODE_MODEL=DIR" in p.stderr and len(p.stderr.strip().splitlines()) == 1
    assert not os.path.exists(tmp_path / "o") and p.stdout == ""


def test_missing_data_is_one_error_line(tiny_model_dir, tmp_path, capsys):
    rc = evaluate.main(FAST + ["--model", tiny_model_dir, "--data", str(tmp_path / "no.jsonl"), "--out", str(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.startswith("error:") and "--data" in err and len(err.splitlines()) == 1


def test_missing_adapter_is_one_error_line(tiny_model_dir, mbpp_path, tmp_path, capsys):
    rc = evaluate.main(FAST + ["--model", tiny_model_dir, "--data", mbpp_path, "--out", str(tmp_path),
                               "--adapter", f"coder={tmp_path / 'no-adapter'}"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.startswith("error:") and "--adapter coder=" in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("bad", ["planer=x", "coder", "coder=", "coder=none,coder=none"])
def test_malformed_adapter_flag_is_one_error_line(tiny_model_dir, mbpp_path, tmp_path, capsys, bad):
    flags = [x for pair in bad.split(",") for x in ("--adapter", pair)]
    rc = evaluate.main(FAST + ["--model", tiny_model_dir, "--data", mbpp_path, "--out", str(tmp_path)] + flags)
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.startswith("error: --adapter") and len(err.splitlines()) == 1
    assert not os.path.exists(tmp_path / "settings.json")


# ----------------------------------------------------------------------------------------------------
# Defaults and bad input as a new user meets them.


def test_defaults_are_greedy_the_method_pair_and_the_default_model(monkeypatch):
    monkeypatch.delenv("CORECODE_MODEL", raising=False)
    args = evaluate.parse_args(["--bench", "mbpp"])
    assert args.temperature == 0 and args.n == 1 and args.split == "test"
    assert args.method == ["direct", "planner-coder", "content-free-plan", "generic-plan", "restatement"]
    assert args.model == evaluate.agents.DEFAULT_MODEL
    monkeypatch.setenv("CORECODE_MODEL", "/some/dir")
    assert evaluate.parse_args([]).model == "/some/dir"
    assert evaluate.parse_args(["--model", "x/y"]).model == "x/y"


@pytest.mark.parametrize("bad,says", [(["--temperature", "-1"], "--temperature"),
                                      (["-n", "3"], "temperature > 0")])
def test_bad_sampling_settings_fail_before_anything_loads(tmp_path, bad, says):
    p = run_cli(["--model", str(tmp_path / "never-loaded"), "--out", str(tmp_path / "o"), *bad])
    assert p.returncode == 2 and says in p.stderr and "Traceback" not in p.stderr
    assert not os.path.exists(tmp_path / "o")


def test_unwritable_out_is_one_error_line(tiny_model_dir, mbpp_path, tmp_path, capsys):
    # A path under a regular file cannot be created, even by root (CI runs as root, where chmod would not stop it).
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    rc = evaluate.main(FAST + ["--method", "direct", "--model", tiny_model_dir, "--data", mbpp_path,
                               "--out", str(blocker / "out")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.startswith("error:") and "--out" in err and len(err.splitlines()) == 1


def test_bad_bench_option_is_one_error_line_naming_the_options(tiny_model_dir, mbpp_path, tmp_path, capsys):
    rc = evaluate.main(FAST + ["--model", tiny_model_dir, "--data", mbpp_path, "--out", str(tmp_path),
                               "--bench-option", "challange=true"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "mbpp takes challenge, time_factor" in err and len(err.splitlines()) == 1


def test_bench_options_and_stop_on_failure_reach_the_jobs(tiny_model_dir, tmp_path, monkeypatch):
    jobs, real = [], evaluate.agents.problem_job

    def spy(*a, **kw):
        jobs.append(real(*a, **kw))
        return jobs[-1]
    monkeypatch.setattr(evaluate.agents, "problem_job", spy)
    monkeypatch.setattr(evaluate, "run_method", lambda team, method, problems, n, **_: [
        [evaluate.agents.Attempt(program="print(3)")] for _ in problems])
    fixture = os.path.join(ROOT, "tests", "fixtures", "codeforces.jsonl")
    assert evaluate.main(["--bench", "codeforces", "--data", fixture, "--method", "direct", "--dtype", "float32",
                          "--model", tiny_model_dir, "--bench-option", "time_factor=2", "--stop-on-failure",
                          "--out", str(tmp_path)]) == 0
    assert [j.time_limit_s for j in jobs] == [2.0, 5.0] and all(j.stop_on_failure for j in jobs)
    with open(tmp_path / "summary.json") as f:
        summary = json.load(f)["direct"]
    # A fails its 2nd test, D passes (C, with several right outputs, is left out); APR is not measured
    assert summary["pass@1"] == pytest.approx(1 / 2) and summary["apr"] is None
    with open(tmp_path / "settings.json") as f:
        assert json.load(f)["bench_option"] == ["time_factor=2"]


def test_the_sandbox_mode_is_said_before_the_run(tiny_model_dir, mbpp_path, tmp_path, capsys):
    assert evaluate.main(FAST + ["--method", "direct", "--model", tiny_model_dir, "--data", mbpp_path,
                                 "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[1].startswith("sandbox:") and out.index("sandbox:") < out.index("summary:")


def test_batch_size_chunks_the_problems(tiny_model_dir, mbpp_path, tmp_path, monkeypatch):
    # --batch-size bounds memory: run_method sees at most that many problems at once, and every problem is written.
    sizes, real = [], evaluate.run_method
    monkeypatch.setattr(evaluate, "run_method", lambda team, m, probs, **kw: sizes.append(len(probs))
                        or real(team, m, probs, **kw))
    assert evaluate.main(FAST + ["--limit", "3", "--method", "direct", "--batch-size", "2", "--model", tiny_model_dir,
                                 "--data", mbpp_path, "--out", str(tmp_path)]) == 0
    assert sizes == [2, 1] and len(evaluate.read_records(str(tmp_path / "direct.jsonl"))) == 3


def test_a_usage_error_from_argparse_is_one_line_naming_help(capsys):
    with pytest.raises(SystemExit) as e:
        evaluate.parse_args(["--no-such-flag"])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and "--no-such-flag" in err[0] and "--help" in err[0]


def test_ctrl_c_is_one_line_saying_the_same_command_continues(monkeypatch, tmp_path, capsys):
    def interrupted(args):
        (tmp_path / "o").mkdir()
        (tmp_path / "o" / "direct.jsonl").write_text("")
        raise KeyboardInterrupt

    monkeypatch.setattr(evaluate, "evaluate", interrupted)
    assert evaluate.main(["--out", str(tmp_path / "o")]) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "same command continues" in err[0] and str(tmp_path / "o") in err[0]


def test_ctrl_c_before_any_chunk_finished_says_nothing_is_saved(monkeypatch, tmp_path, capsys):
    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(evaluate, "evaluate", interrupted)
    assert evaluate.main(["--out", str(tmp_path / "o")]) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nothing saved" in err[0] and "saved in" not in err[0]


def test_the_held_out_line_is_labelled_the_same_at_step_0_and_later():
    m = {"eval_pass1_planner_coder": 0.3, "eval_pass1_direct": 0.4, "eval_cg": -0.1, "eval_plan_info": 0.05,
         "eval_info_vs": "restatement", "eval_info_gained": 3, "eval_info_lost": 1, "eval_info_p": 0.625}
    line = evaluate.held_out_line(m, "planner-coder")
    assert line == (" eval planner-coder 0.300 direct 0.400 CG -0.100 plan info +0.050 vs restatement "
                    "(+3 -1 p=0.625)")
    later = evaluate.held_out_line(dict(m, eval_gained=2, eval_lost=0, eval_mcnemar_p=0.5), "planner-coder")
    assert later.startswith(line) and later.endswith("vs step 0: +2 -0 p=0.5") and "eval_" not in later


def test_the_progress_lock_exists_before_the_run_starts(monkeypatch, tmp_path):
    # A Ctrl-C inside tqdm's first lock creation once left tqdm without its lock (AttributeError, a traceback, exit
    # 1): both scripts make it before any work, so a stop cannot land there.
    seen = []
    monkeypatch.delattr(evaluate.tqdm, "_lock", raising=False)
    monkeypatch.setattr(evaluate, "evaluate", lambda args: seen.append(hasattr(evaluate.tqdm, "_lock")))
    assert evaluate.main(["--out", str(tmp_path / "o")]) == 0 and seen == [True]


def test_a_log_file_gets_one_progress_line_per_chunk(tiny_model_dir, mbpp_path, tmp_path, capsys):
    argv = FAST + ["--method", "direct", "--batch-size", "1", "--model", tiny_model_dir, "--data", mbpp_path,
                   "--out", str(tmp_path / "o")]
    assert evaluate.main(argv) == 0
    out = capsys.readouterr().out  # not a terminal: no bar, a line per chunk
    assert "direct: 1/2 problems" in out and "direct: 2/2 problems" in out


def test_sigterm_keeps_the_finished_problems_and_the_same_command_continues_to_the_same_metrics(
        tiny_model_dir, mbpp_path, tmp_path):
    argv = ["--bench", "mbpp", "--split", "validation", "--limit", "6", "--method", "direct", "content-free-plan",
            "--dtype", "float32", "--max-new-tokens", "16", "--batch-size", "1", "--workers", "2",
            "--model", tiny_model_dir, "--data", mbpp_path]
    assert evaluate.main(argv + ["--out", str(tmp_path / "whole")]) == 0
    out = tmp_path / "stopped"
    cmd = [sys.executable, os.path.join(ROOT, "evaluate.py"), *argv, "--out", str(out)]
    with open(tmp_path / "log", "w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 120
        while time.time() < deadline and proc.poll() is None and not (
                os.path.exists(out / "direct.jsonl") and len(open(out / "direct.jsonl").readlines()) >= 2):
            time.sleep(0.02)
        assert proc.poll() is None, "the evaluation ended before it could be stopped"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143 and err.strip().splitlines()[-1].startswith("interrupted:"), err
    assert "the same command continues" in err and not os.path.exists(out / "summary.json")
    # The log got the work line and a time left before the stop.
    assert "work: 12 problem-rows to run (6 problems x 2 methods" in open(tmp_path / "log").read()
    assert re.search(r"direct: \d/6 problems, .* left in this method, ~\S+ in the run",
                     open(tmp_path / "log").read())
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "skipped" in r.stdout, r.stderr

    def metrics(path):
        rows = json.load(open(path / "summary.json"))
        return {row: {k: v for k, v in m.items() if not k.endswith("_s")} for row, m in rows.items()
                if row != "sandbox"}

    assert metrics(out) == metrics(tmp_path / "whole")


class _PerProcessPool:
    """A pool whose mode holds a memory limit per process only (no memory cgroup), as an ordinary user's does."""
    mode = {"name": "no-cgroup", "isolated": True, "cpu_counted": False, "memory_counted": False,
            "memory_limit": "per process", "missing": ["memory: no cgroup"]}

    def __init__(self, *a, **kw):
        self.closed = False

    def close(self):
        self.closed = True


@pytest.mark.parametrize("bench, refused", [("codecontests", True), ("codeforces", True), ("mbpp", False)])
def test_a_benchmark_with_memory_limits_is_refused_where_the_limit_holds_per_process_only(monkeypatch, tmp_path,
                                                                                           bench, refused):
    monkeypatch.setattr(evaluate.sandbox, "SandboxPool", _PerProcessPool)
    (tmp_path / "data.jsonl").write_text("")
    args = evaluate.parse_args(["--bench", bench, "--data", str(tmp_path / "data.jsonl")])
    if refused:
        with pytest.raises(evaluate.UsageError, match="memory limit.*--allow-uncounted"):
            evaluate.open_pool(args)
        args.allow_uncounted = True
    assert evaluate.open_pool(args).mode["memory_limit"] == "per process"
