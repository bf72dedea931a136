"""End-to-end smoke test of train.py and evaluate.py on the tiny random model with real MBPP problems and real
sandbox execution: stage planner, then stage coder from the planner's adapter, then evaluation with both adapters;
plus resume (also after SIGKILL: the resumed run's metrics equal an uninterrupted run's) and bad input.
"""
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

import agents
import evaluate
import train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMING = ("t_sample", "t_execute", "t_reference", "t_learn", "t_step", "informative_per_hour")


def small(model, out, stage, mbpp, steps=2, extra=()):
    return ["--stage", stage, "--model", model, "--out", str(out), "--data", mbpp, "--limit", "4",
            "--num-steps", str(steps), "--problems-per-step", "2", "--group-size", "2", "--max-new-tokens", "16",
            "--plan-max-new-tokens", "32", "--eval-every", "2", "--eval-limit", "2", "--workers", "2",
            "--dtype", "float32", *extra]


def read_metrics(out):
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


@pytest.fixture(scope="module")
def planner_run(tiny_model_dir, mbpp_path, tmp_path_factory):
    out = tmp_path_factory.mktemp("planner")
    train.main(small(tiny_model_dir, out, "planner", mbpp_path))
    return out


@pytest.fixture(scope="module")
def coder_run(tiny_model_dir, mbpp_path, planner_run, tmp_path_factory):
    out = tmp_path_factory.mktemp("coder")
    train.main(small(tiny_model_dir, out, "coder", mbpp_path,
                     extra=("--adapter", f"planner={planner_run / 'final' / 'planner'}")))
    return out


def test_planner_stage_writes_adapter_metrics_args(planner_run):
    assert os.path.exists(planner_run / "final" / "planner" / "adapter_config.json")
    assert os.path.exists(planner_run / "final" / "planner" / "adapter_model.safetensors")
    assert json.load(open(planner_run / "args.json"))["stage"] == "planner"
    m = read_metrics(planner_run)
    assert [r["step"] for r in m] == [1, 2]
    for key in ("reward_mean", "pass_rate", "zero_var_frac", "kl", "clip_frac", "completion_len", "grad_norm",
                "t_sample", "t_execute", "t_learn"):
        assert key in m[0], key
    # held-out evaluation before training and at the end: CG is tracked
    assert "eval_cg_start" in m[0] and "eval_cg" in m[1]


def test_each_step_logs_its_informative_groups_and_the_run_their_rate_per_hour(planner_run):
    ms = read_metrics(planner_run)
    for m in ms:
        assert m["informative_groups"] == round((1 - m["zero_var_frac"]) * m["groups"])
        assert m["t_step"] == pytest.approx(sum(m[k] for k in ("t_sample", "t_execute", "t_reference", "t_learn")))
        assert m["informative_per_hour"] == pytest.approx(3600 * m["informative_groups"] / m["t_step"])
    hours = sum(m["t_step"] for m in ms) / 3600
    informative, groups = sum(m["informative_groups"] for m in ms), sum(m["groups"] for m in ms)
    assert train.informative_summary(planner_run) == (f"informative groups: {informative} of {groups} over {len(ms)} "
                                                      f"steps, {informative / hours:.1f} per hour of step time")


def test_checkpoints_keep_the_newest_and_the_end(planner_run):
    ckpts = sorted(os.listdir(planner_run / "checkpoints"))
    assert ckpts == ["step_000002"]  # step 1's went when step 2's was written; no temporary dirs left
    assert os.path.exists(planner_run / "checkpoints" / "step_000002" / "state.pt")


def test_coder_stage_trains_coder_from_planner(coder_run):
    assert os.path.exists(coder_run / "final" / "coder" / "adapter_config.json")
    assert len(read_metrics(coder_run)) == 2


def test_evaluate_with_both_adapters(tiny_model_dir, mbpp_path, planner_run, coder_run, tmp_path):
    out = tmp_path / "eval"
    evaluate.main(["--bench", "mbpp", "--data", mbpp_path, "--split", "validation", "--limit", "2",
                   "--model", tiny_model_dir, "--method", "planner-coder", "-n", "1", "--temperature", "0",
                   "--max-new-tokens", "16", "--plan-max-new-tokens", "16", "--out", str(out),
                   "--adapter", f"planner={planner_run / 'final' / 'planner'}",
                   "--adapter", f"coder={coder_run / 'final' / 'coder'}"])
    summary = json.load(open(out / "summary.json"))
    assert "pass@1" in json.dumps(summary)


def test_resume_continues_from_last_checkpoint(tiny_model_dir, mbpp_path, coder_run, planner_run):
    train.main(small(tiny_model_dir, coder_run, "coder", mbpp_path, steps=3,
                     extra=("--adapter", f"planner={planner_run / 'final' / 'planner'}", "--resume")))
    assert [r["step"] for r in read_metrics(coder_run)] == [1, 2, 3]


def test_resume_with_a_setting_that_changes_results_is_refused(tiny_model_dir, mbpp_path, planner_run, capsys):
    before = read_metrics(planner_run)
    with pytest.raises(SystemExit) as e:
        train.main(small(tiny_model_dir, planner_run, "planner", mbpp_path, steps=3, extra=("--lr", "3e-4", "--resume")))
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and "lr:" in err[0] and "0.0003" in err[0]
    assert read_metrics(planner_run) == before  # nothing touched


@pytest.mark.parametrize("held_out", [["--split", "test"], ["--split", "validation"], ["--split", "all"],
                                      ["--eval-split", "test"], ["--split", "validation", "--eval-split", "validation"]])
def test_training_on_or_choosing_checkpoints_on_a_held_out_split_is_refused(tiny_model_dir, mbpp_path, tmp_path,
                                                                           capsys, held_out):
    with pytest.raises(SystemExit) as e:
        train.main(small(tiny_model_dir, tmp_path / "r", "planner", mbpp_path, extra=held_out))
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and "--allow-held-out-split" in err[0]
    assert not os.path.exists(tmp_path / "r")


def test_existing_run_without_resume_is_refused(tiny_model_dir, mbpp_path, planner_run, capsys):
    with pytest.raises(SystemExit) as e:
        train.main(small(tiny_model_dir, planner_run, "planner", mbpp_path))
    assert e.value.code == 2
    assert "--resume" in capsys.readouterr().err


def test_stage_coder_without_planner_adapter_is_a_clear_error(tiny_model_dir, mbpp_path, tmp_path, capsys,
                                                              monkeypatch):
    monkeypatch.chdir(tmp_path)  # no runs/planner/final here
    with pytest.raises(SystemExit) as e:
        train.main(small(tiny_model_dir, tmp_path / "c", "coder", mbpp_path))
    err = capsys.readouterr().err
    assert e.value.code == 2 and "--adapter planner=" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("bad", [["--model", "/no/such/model"], ["--group-size", "0"], ["--data", "/no/such.jsonl"],
                                 ["--bench-option", "time_facter=2"], ["--group-size", "1"], ["--lr", "-1"],
                                 ["--stage", "nope"], ["--resume"]])
def test_bad_input_is_one_error_line(tiny_model_dir, mbpp_path, tmp_path, bad):
    argv = small(tiny_model_dir, tmp_path / "r", "planner", mbpp_path) + bad
    r = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), *argv], capture_output=True, text=True,
                       timeout=120, cwd=ROOT)
    assert r.returncode == 2
    assert r.stderr.strip().startswith("error:") and len(r.stderr.strip().splitlines()) == 1, r.stderr


def toy_argv(model, out, steps, data):
    return ["--stage", "toy", "--model", model, "--out", str(out), "--num-steps", str(steps), "--limit", "8",
            "--data", data,
            "--problems-per-step", "2", "--group-size", "4", "--max-new-tokens", "8", "--lr", "1e-2",
            "--warmup-steps", "1", "--eval-every", "0", "--seed", "3", "--dtype", "float32"]


def assert_same_run(got_dir, want_dir):
    """The metrics (timings aside) and the final adapter of two runs are equal up to float32 rounding: the runs are
    different processes, and CPU matmul kernels may pick code paths by memory alignment, which moves the last bits of
    a sum (seen: KL 0.022808235 vs 0.022808239 at step 4). What a broken resume changes (sampled tokens, rewards,
    optimizer or RNG state) moves these by far more than 1e-5."""
    def strip(ms):
        return [{k: v for k, v in m.items() if k not in TIMING} for m in ms]

    got, want = strip(read_metrics(got_dir)), strip(read_metrics(want_dir))
    assert [sorted(m) for m in got] == [sorted(m) for m in want]
    for g, w in zip(got, want):
        for k in w:
            if isinstance(w[k], float):
                assert g[k] == pytest.approx(w[k], rel=1e-5, abs=1e-9), (g["step"], k)
            else:
                assert g[k] == w[k], (g["step"], k)
    from safetensors.torch import load_file
    a, b = (load_file(os.path.join(d, "final", "coder", "adapter_model.safetensors")) for d in (got_dir, want_dir))
    assert sorted(a) == sorted(b) and all(torch_allclose(a[k], b[k]) for k in a)


def torch_allclose(x, y):
    import torch
    return torch.allclose(x, y, rtol=1e-5, atol=1e-7)


def start_and_stop(cmd, out, log, sig, ready):
    """Start cmd with its stdout in a log file, send `sig` once ready(log text) holds; returns (rc, stderr)."""
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=f, stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 120
        while not ready(open(log).read()) and time.time() < deadline and proc.poll() is None:
            time.sleep(0.02)
        assert proc.poll() is None, "the run ended before it could be stopped"
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=120)
    return proc.returncode, err


@pytest.fixture(scope="module")
def toy_full(tiny_model_dir, toy_mbpp, tmp_path_factory):
    out = tmp_path_factory.mktemp("toy-full")
    train.main(toy_argv(tiny_model_dir, out, 10, toy_mbpp))
    return out


def test_sigkill_then_resume_matches_uninterrupted_run(tiny_model_dir, toy_mbpp, tmp_path, toy_full):
    killed = tmp_path / "killed"
    cmd = [sys.executable, os.path.join(ROOT, "train.py"), *toy_argv(tiny_model_dir, killed, 10, toy_mbpp)]
    start_and_stop(cmd, killed, tmp_path / "log", signal.SIGKILL,
                   lambda log: os.path.isdir(killed / "checkpoints" / "step_000002"))
    assert os.path.isdir(killed / "checkpoints" / "step_000002") and not os.path.isdir(killed / "final")
    # a run killed for memory continues with checkpointing on: the same run
    subprocess.run(cmd + ["--resume", "--grad-ckpt"], cwd=ROOT, check=True, capture_output=True, timeout=300)
    assert_same_run(killed, toy_full)


def test_memory_flags_do_not_change_the_settings_a_resume_checks(tiny_model_dir, mbpp_path, tmp_path):
    def settings(*extra):
        args = train.get_args(small(tiny_model_dir, tmp_path / "r", "planner", mbpp_path, extra=extra))
        train.check_args(args)
        return args.settings
    assert settings("--micro-batch", "2", "--grad-ckpt") == settings()
    assert settings("--lr", "3e-4") != settings()  # what it learns is still checked


def test_sigterm_mid_step_keeps_every_completed_step_and_resumes_exactly(tiny_model_dir, toy_mbpp, tmp_path,
                                                                         toy_full):
    # Stopped in step 4 after step 3 was logged: step 3's checkpoint is kept.
    out = tmp_path / "stopped"
    cmd = [sys.executable, os.path.join(ROOT, "train.py"), *toy_argv(tiny_model_dir, out, 10, toy_mbpp)]
    rc, err = start_and_stop(cmd, out, tmp_path / "log", signal.SIGTERM, lambda log: "step 4/10:" in log)
    assert rc == 143, err
    closing = err.strip().splitlines()
    assert len(closing) == 1 and closing[0].startswith("interrupted:") and "--resume" in closing[0], err
    assert os.path.isdir(out / "checkpoints" / "step_000003") and not os.path.isdir(out / "final")
    subprocess.run(cmd + ["--resume"], cwd=ROOT, check=True, capture_output=True, timeout=300)
    assert_same_run(out, toy_full)
    assert sorted(os.listdir(out / "checkpoints")) == ["step_000010"]  # the end's; earlier ones not every 25th


def test_the_work_progress_and_time_left_reach_a_redirected_log_while_the_run_goes_on(tiny_model_dir, toy_mbpp,
                                                                                        tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, os.path.join(ROOT, "train.py"), *toy_argv(tiny_model_dir, out, 200, toy_mbpp)]
    rc, _ = start_and_stop(cmd, out, tmp_path / "log", signal.SIGTERM,
                           lambda log: re.search(r"step 1: .* left", log))
    log = open(tmp_path / "log").read()
    assert "work: 200 steps x 2 problems x G=4 coder samples" in log
    assert "step 1/200: sampling coder" in log  # inside the step, before its line
    assert re.search(r"step 1: .*\| \S+/step, ~\S+ left", log), log


def test_direct_stage_is_single_agent_grpo(tiny_model_dir, mbpp_path, tmp_path):
    # The paper's baseline: the Coder trained on the problem alone; its held-out eval is direct coding (no CG).
    train.main(small(tiny_model_dir, tmp_path, "direct", mbpp_path))
    assert os.path.exists(tmp_path / "final" / "coder" / "adapter_config.json")
    m = read_metrics(tmp_path)
    assert "eval_pass1_direct_start" in m[0] and "eval_pass1_direct" in m[1]
    assert not any(k.startswith("eval_cg") or "planner" in k for r in m for k in r)
    rows = [json.loads(line) for line in open(tmp_path / "eval" / "step_000002.jsonl")]
    assert {r["method"] for r in rows} == {"direct"} and len(rows) == 2


def test_planner_eval_rows_direct_once_and_paired_test(planner_run):
    # Per-problem rows for both methods at step 0; later evals read direct back (the Coder is frozen) and report
    # the paired comparison with step 0.
    start = [json.loads(line) for line in open(planner_run / "eval" / "step_000000.jsonl")]
    end = [json.loads(line) for line in open(planner_run / "eval" / "step_000002.jsonl")]
    assert {r["method"] for r in start} == {"planner-coder", "direct", *evaluate.PLAN_CONTROLS}
    # The Coder-only rows (direct, the plan controls) are run once: the Coder is frozen in this stage.
    assert all(r.get("cached_from_step") == 0 for r in end if r["method"] != "planner-coder")
    last = read_metrics(planner_run)[-1]
    for key in ("eval_gained", "eval_lost", "eval_mcnemar_p", "eval_plan_parts_frac", "eval_plan_placeholder_frac",
                "eval_plan_chars", "eval_plan_truncated_frac", "eval_plan_info", "eval_info_vs", "eval_info_gained", "eval_info_lost",
                "eval_info_p", "t_eval"):
        assert key in last, key
    for key in ("plan_parts_frac", "plan_placeholder_frac", "plan_chars", "plan_truncated_frac", "plan_content_free_frac",
                "time_rank_frac"):
        assert key in read_metrics(planner_run)[0], key


@pytest.mark.parametrize("model", ["missing-dir", "no-org/no-model-xyz"])
def test_a_model_that_cannot_load_fails_in_seconds_before_anything_is_printed_or_made(mbpp_path, tmp_path, model):
    # A missing local dir, or a hub id while the hub cannot be reached (HF_ENDPOINT: a closed port) and nothing is
    # cached: one line saying what to pass, no plan or estimate printed first, no run directory left behind.
    env = dict(os.environ, HF_ENDPOINT="http://127.0.0.1:9", HF_HOME=str(tmp_path / "hf"))
    env.pop("HF_HUB_OFFLINE", None)
    model = str(tmp_path / model) if model == "missing-dir" else model
    t0 = time.time()
    r = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), "--stage", "planner", "--model", model,
                        "--data", mbpp_path, "--out", str(tmp_path / "o")], capture_output=True, text=True,
                       timeout=120, cwd=ROOT, env=env)
    assert r.returncode == 2 and time.time() - t0 < 30
    assert r.stderr.startswith("error: --model") and "--model DIR or CORECODE_MODEL=DIR" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and r.stdout == "" and not os.path.exists(tmp_path / "o")


def default_sigint():
    """Ctrl-C as a terminal delivers it: a shell without job control starts background commands with SIGINT ignored
    (POSIX), and a test run launched that way would otherwise hand the ignored signal down to train.py."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_says_where_the_checkpoint_is_and_how_to_resume(tiny_model_dir, toy_mbpp, tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, os.path.join(ROOT, "train.py"), *toy_argv(tiny_model_dir, out, 200, toy_mbpp)]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=default_sigint)
    deadline = time.time() + 120
    while not os.path.isdir(out / "checkpoints" / "step_000002") and time.time() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "every completed step is kept, the last in" in err and "--resume" in err
    assert len([line for line in err.splitlines() if "interrupted" in line]) == 1


def test_ctrl_c_before_the_first_checkpoint_says_to_start_again(tiny_model_dir, toy_mbpp, tmp_path):
    # --resume would fail there (no checkpoint): the message gives the command that works, and it does. Every
    # completed step is checkpointed, so the stop comes before the first step: once args.json is written.
    out = tmp_path / "run"
    argv = toy_argv(tiny_model_dir, out, 200, toy_mbpp)
    proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "train.py"), *argv], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=default_sigint)
    deadline = time.time() + 120
    while not os.path.exists(out / "args.json") and time.time() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    line = next(line for line in err.splitlines() if "interrupted" in line)
    assert proc.returncode == 130 and "Traceback" not in err and "--resume" not in line, err
    assert "start again with: python train.py" in line
    again = line.split("python train.py ", 1)[1].split() + ["--num-steps", "1"]
    train.main(again)
    assert [json.loads(x)["step"] for x in open(out / "metrics.jsonl")] == [1]


def test_problems_judged_inside_the_child_are_never_a_training_reward():
    import data
    from data import Problem

    def problem(i, test):
        return Problem(id=f"humaneval/{i}", bench="humaneval", statement="s", kind="assert", public_tests=[],
                       hidden_tests=["assert f(1) == 1", test], entry_point="f")

    kept = train.judged_in_parent([problem(0, "assert f(2) == 2"), problem(1, f"assert {data.HUMANEVAL_HELPER}(f) is None")])
    assert [p.id for p in kept] == ["humaneval/0"]


def test_the_direct_stage_samples_from_the_direct_prompt_evaluation_uses(tiny_model_dir, mbpp_path, tmp_path,
                                                                          monkeypatch):
    # One direct prompt, one place: single-agent GRPO trains on exactly what evaluate.py's direct row measures.
    prompts, real = [], agents.sample

    def spy(model, tokenizer, texts, *a, **kw):
        prompts.extend(texts)
        return real(model, tokenizer, texts, *a, **kw)

    monkeypatch.setattr(agents, "sample", spy)
    train.main(small(tiny_model_dir, tmp_path, "direct", mbpp_path, steps=1, extra=("--eval-every", "0")))
    tokenizer = agents.load_model(tiny_model_dir, device="cpu", dtype="float32")[1]
    problems = train.data.load("mbpp", path=mbpp_path, split="train", limit=4)
    assert prompts and set(prompts) <= {agents.direct_prompt(tokenizer, p) for p in problems}
    assert all("Input/Output: as in the problem:" in p for p in prompts)


def plans_file(path, problems, plan="Steps: 1. Return the answer the tests ask for."):
    with open(path, "w") as f:
        for p in problems:
            f.write(json.dumps({"id": p.id, "samples": [{"plan": f"{plan} ({p.id})"}]}) + "\n")
    return str(path)


def test_the_coder_stage_with_given_plans_writes_from_them_without_a_planner(tiny_model_dir, mbpp_path, tmp_path,
                                                                            monkeypatch):
    # The Coder branch of the plan ceiling: stage 2 from (problem, reference plan) pairs of the train split.
    prompts, real = [], agents.sample

    def spy(model, tokenizer, texts, *a, **kw):
        prompts.extend(texts)
        return real(model, tokenizer, texts, *a, **kw)

    monkeypatch.chdir(tmp_path)  # no runs/planner/final here: none is needed
    monkeypatch.setattr(agents, "sample", spy)
    problems = train.data.load("mbpp", path=mbpp_path, split="train", limit=4)
    plans = plans_file(tmp_path / "plans.jsonl", problems)
    train.main(small(tiny_model_dir, tmp_path / "c", "coder", mbpp_path, steps=1,
                     extra=("--eval-every", "0", "--plans-from", plans)))
    tokenizer = agents.load_model(tiny_model_dir, device="cpu", dtype="float32")[1]
    given = {agents.coder_prompt(tokenizer, p, f"Steps: 1. Return the answer the tests ask for. ({p.id})")
             for p in problems}
    assert prompts and set(prompts) <= given
    assert json.load(open(tmp_path / "c" / "settings.json"))["plans_digest"] == evaluate.digest(plans)


@pytest.mark.parametrize("stage, what", [("planner", "--stage coder only"), ("coder", "has 0 plans")])
def test_given_plans_outside_the_coder_stage_or_missing_a_problem_are_one_error_line(tiny_model_dir, mbpp_path,
                                                                                    tmp_path, capsys, stage, what):
    problems = train.data.load("mbpp", path=mbpp_path, split="train", limit=3)  # the run reads 4
    plans = plans_file(tmp_path / "plans.jsonl", problems)
    with pytest.raises(SystemExit) as e:
        train.main(small(tiny_model_dir, tmp_path / "c", stage, mbpp_path, steps=1,
                         extra=("--eval-every", "0", "--plans-from", plans)))
    err = capsys.readouterr().err
    assert e.value.code == 2 and what in err and len(err.strip().splitlines()) == 1, err
