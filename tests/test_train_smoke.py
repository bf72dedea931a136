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
            "--plan-max-new-tokens", "32", "--eval-every", "2", "--eval-limit", "2", "--save-every", "1",
            "--lora-r", "4", "--workers", "2", "--dtype", "float32", *extra]


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


def test_checkpoints_keep_last_k(planner_run):
    ckpts = sorted(os.listdir(planner_run / "checkpoints"))
    assert ckpts == ["step_000001", "step_000002"]  # keep-last 3 > 2 steps; no temp dirs left behind
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
                                 ["--planner-prompt", "restate", "--blind-weight", "1"],
                                 ["--planner-prompt", "worked", "--blind-weight", "1"]])
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
            "--warmup-steps", "1", "--eval-every", "0", "--save-every", "2", "--lora-r", "4", "--seed", "3", "--dtype", "float32"]


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
        return train.run_settings(args)
    assert settings("--micro-batch", "2", "--grad-ckpt") == settings()
    assert settings("--lr", "3e-4") != settings()  # what it learns is still checked


def test_sigterm_mid_step_keeps_every_completed_step_and_resumes_exactly(tiny_model_dir, toy_mbpp, tmp_path,
                                                                         toy_full):
    # --save-every 2, stopped in step 4 after step 3 was logged: step 3 is kept all the same.
    out = tmp_path / "stopped"
    cmd = [sys.executable, os.path.join(ROOT, "train.py"), *toy_argv(tiny_model_dir, out, 10, toy_mbpp)]
    rc, err = start_and_stop(cmd, out, tmp_path / "log", signal.SIGTERM, lambda log: "step 4/10:" in log)
    assert rc == 143, err
    closing = err.strip().splitlines()
    assert len(closing) == 1 and closing[0].startswith("interrupted:") and "--resume" in closing[0], err
    assert os.path.isdir(out / "checkpoints" / "step_000003") and not os.path.isdir(out / "final")
    subprocess.run(cmd + ["--resume"], cwd=ROOT, check=True, capture_output=True, timeout=300)
    assert_same_run(out, toy_full)
    assert sorted(os.listdir(out / "checkpoints")) == ["step_000006", "step_000008", "step_000010"]  # --keep-last 3


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


@pytest.mark.parametrize("name, says", [("plain", "the four labelled parts"), ("restate", "restated for you")])
def test_planner_prompt_trains_and_evaluates_with_that_prompt(tiny_model_dir, mbpp_path, tmp_path, monkeypatch, name,
                                                              says):
    prompts, real = [], agents.sample

    def spy(model, tokenizer, texts, *a, **kw):
        prompts.extend(texts)
        return real(model, tokenizer, texts, *a, **kw)

    monkeypatch.setattr(agents, "sample", spy)
    train.main(small(tiny_model_dir, tmp_path, "planner", mbpp_path, steps=1, extra=("--planner-prompt", name)))
    planner_prompts = [p for p in prompts if "Algorithmic Thought" in p]
    assert planner_prompts and all(says in p and "replacing each <...>" not in p for p in planner_prompts)
    m = read_metrics(tmp_path)[-1]
    assert f"eval_pass1_planner_coder_{name}" in m and "eval_plan_info" in m and "eval_pass1_planner_coder" not in m


def test_the_planner_prompt_is_the_skeleton_one_unless_asked():
    args = train.get_args(["--stage", "planner"])
    assert args.planner_prompt == "skeleton" and train.eval_method(args) == "planner-coder"
    assert train.eval_method(train.get_args(["--stage", "planner", "--planner-prompt", "plain"])) == \
        "planner-coder-plain"
    for name in ("restate", "conditions", "worked"):
        assert train.eval_method(train.get_args(["--stage", "planner", "--planner-prompt", name])) == \
            f"planner-coder-{name}"
    assert train.eval_method(train.get_args(["--stage", "direct", "--planner-prompt", "plain"])) == "direct"


def test_planner_eval_rows_direct_once_and_paired_test(planner_run):
    # Per-problem rows for both methods at step 0; later evals read direct back (the Coder is frozen) and report
    # the paired comparison with step 0.
    start = [json.loads(line) for line in open(planner_run / "eval" / "step_000000.jsonl")]
    end = [json.loads(line) for line in open(planner_run / "eval" / "step_000002.jsonl")]
    assert {r["method"] for r in start} == {"planner-coder", "direct", *agents.PLAN_CONTROLS}
    # The Coder-only rows (direct, the plan controls) are run once: the Coder is frozen in this stage.
    assert all(r.get("cached_from_step") == 0 for r in end if r["method"] != "planner-coder")
    last = read_metrics(planner_run)[-1]
    for key in ("eval_gained", "eval_lost", "eval_mcnemar_p", "eval_plan_parts_frac", "eval_plan_placeholder_frac",
                "eval_plan_chars", "eval_plan_cut_frac", "eval_plan_info", "eval_info_vs", "eval_info_gained", "eval_info_lost",
                "eval_info_p", "t_eval"):
        assert key in last, key
    for key in ("plan_parts_frac", "plan_placeholder_frac", "plan_chars", "plan_cut_frac", "plan_content_free_frac",
                "time_rank_frac"):
        assert key in read_metrics(planner_run)[0], key


def test_unwritable_out_is_one_error_line(tiny_model_dir, mbpp_path, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    argv = small(tiny_model_dir, blocker / "run", "planner", mbpp_path)
    r = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), *argv], capture_output=True, text=True,
                       timeout=120, cwd=ROOT)
    assert r.returncode == 2 and "--out" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_resume_without_a_checkpoint_is_refused(tiny_model_dir, mbpp_path, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        train.main(small(tiny_model_dir, tmp_path / "empty", "planner", mbpp_path, extra=("--resume",)))
    err = capsys.readouterr().err
    assert e.value.code == 2 and "no checkpoint" in err and len(err.strip().splitlines()) == 1
    assert not os.path.exists(tmp_path / "empty")  # a run that never started leaves no directory behind


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


def test_the_coder_stage_says_which_planner_adapter_it_loaded(tiny_model_dir, mbpp_path, planner_run, tmp_path,
                                                              capsys):
    planner = str(planner_run / "final" / "planner")
    train.main(small(tiny_model_dir, tmp_path / "c", "coder", mbpp_path, steps=1,
                     extra=("--adapter", f"planner={planner}", "--eval-every", "0")))
    assert f"frozen adapters: planner={planner}" in capsys.readouterr().out


def test_args_json_is_written_only_after_inputs_are_valid(tiny_model_dir, tmp_path):
    r = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), "--stage", "planner", "--model",
                        tiny_model_dir, "--data", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "o")],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 2 and not os.path.exists(tmp_path / "o" / "args.json")
    assert r.stdout.count("\n") <= 2, r.stdout  # no 50-line argument dump before the error


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


def test_a_usage_error_from_argparse_is_one_line_naming_help(capsys):
    with pytest.raises(SystemExit) as e:
        train.get_args(["--stage", "nope"])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and "'nope'" in err[0] and "--help" in err[0]


def test_the_eval_line_is_labelled_the_same_at_step_0_and_later():
    m = {"eval_pass1_planner_coder": 0.3, "eval_pass1_direct": 0.4, "eval_cg": -0.1, "eval_plan_info": 0.05,
         "eval_info_vs": "restatement", "eval_info_gained": 3, "eval_info_lost": 1, "eval_info_p": 0.625}
    line = train.eval_line(m, "planner-coder")
    assert line == " eval planner-coder 0.300 direct 0.400 CG -0.100 plan info +0.050 vs restatement (+3 -1 p=0.625)"
    later = train.eval_line(dict(m, eval_gained=2, eval_lost=0, eval_mcnemar_p=0.5), "planner-coder")
    assert later.startswith(line) and later.endswith("vs step 0: +2 -0 p=0.5") and "eval_" not in later


def test_problems_judged_inside_the_child_are_never_a_training_reward():
    import data
    from data import Problem

    def problem(i, test):
        return Problem(id=f"humaneval/{i}", bench="humaneval", statement="s", kind="assert", public_tests=[],
                       hidden_tests=["assert f(1) == 1", test], entry_point="f")

    kept = train.judged_in_parent([problem(0, "assert f(2) == 2"), problem(1, f"assert {data.HUMANEVAL_HELPER}(f) is None")])
    assert [p.id for p in kept] == ["humaneval/0"]


def test_gradient_checkpointing_is_on_unless_switched_off():
    assert train.get_args(["--stage", "planner"]).grad_ckpt is True
    assert train.get_args(["--stage", "planner", "--no-grad-ckpt"]).grad_ckpt is False


def test_a_planner_model_of_its_own_is_trained_then_frozen_then_evaluated(tiny_model_dir, tiny_planner_model_dir,
                                                                          mbpp_path, tmp_path):
    """--planner-model: stage planner trains an adapter of the second base (its KL reference: the policy starts
    equal to that base, so step 1's KL is 0), stage coder trains the Coder's under it, and evaluate.py runs the pair."""
    import grpo

    second = ("--planner-model", tiny_planner_model_dir)
    train.main(small(tiny_model_dir, tmp_path / "p", "planner", mbpp_path, steps=1, extra=second))
    planner = tmp_path / "p" / "final" / "planner"
    assert json.load(open(planner / "adapter_config.json"))["base_model_name_or_path"] == tiny_planner_model_dir
    assert read_metrics(tmp_path / "p")[0]["kl"] < 1e-6
    grpo.load_adapter(agents.load_model(tiny_planner_model_dir, dtype="float32")[0], "planner", str(planner))
    with pytest.raises(ValueError):  # wider layers than the Coder's base: it is the Planner base's adapter
        grpo.load_adapter(agents.load_model(tiny_model_dir, dtype="float32")[0], "planner", str(planner))
    train.main(small(tiny_model_dir, tmp_path / "c", "coder", mbpp_path, steps=1,
                     extra=second + ("--adapter", f"planner={planner}")))
    coder = tmp_path / "c" / "final" / "coder"
    assert json.load(open(coder / "adapter_config.json"))["base_model_name_or_path"] == tiny_model_dir
    assert evaluate.main(["--bench", "mbpp", "--data", mbpp_path, "--split", "validation", "--limit", "2",
                          "--model", tiny_model_dir, *second, "--method", "planner-coder", "direct",
                          "--max-new-tokens", "16", "--plan-max-new-tokens", "16", "--out", str(tmp_path / "e"),
                          "--adapter", f"planner={planner}", "--adapter", f"coder={coder}"]) == 0
    settings = json.load(open(tmp_path / "e" / "settings.json"))
    assert settings["planner_model"] == tiny_planner_model_dir and "cg" in json.dumps(json.load(
        open(tmp_path / "e" / "summary.json"))).lower()


@pytest.mark.parametrize("extra, says", [
    (["--stage", "direct", "--planner-model", "PM"], "stage direct has no Planner"),
    (["--stage", "planner", "--planner-model", "/nonexistent/planner"], "--planner-model: model not found"),
])
def test_a_planner_model_that_cannot_serve_is_one_error_line(tiny_model_dir, tiny_planner_model_dir, mbpp_path,
                                                             tmp_path, capsys, extra, says):
    extra = [tiny_planner_model_dir if w == "PM" else w for w in extra]
    with pytest.raises(SystemExit) as e:
        train.main(["--model", tiny_model_dir, "--data", mbpp_path, "--out", str(tmp_path / "o"), *extra])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1 and says in err and not (tmp_path / "o").exists()


def test_a_log_file_gets_each_line_as_it_is_printed(tiny_model_dir, toy_mbpp, tmp_path):
    # stdout redirected to a file is block-buffered unless the script says otherwise: the run's header must reach the
    # log while the run still goes on, not at exit.
    log = open(tmp_path / "log", "w")
    p = subprocess.Popen([sys.executable, os.path.join(ROOT, "train.py"),
                          *toy_argv(tiny_model_dir, tmp_path / "r", 200, toy_mbpp)], stdout=log, cwd=ROOT)
    try:
        deadline = time.time() + 120
        while "step 1:" not in (tmp_path / "log").read_text() and time.time() < deadline and p.poll() is None:
            time.sleep(0.5)
        assert p.poll() is None and "step 1:" in (tmp_path / "log").read_text()
    finally:
        p.kill()
        p.wait()


def test_the_blind_coder_is_scored_by_execution_from_the_plan_without_the_statement(tiny_model_dir, monkeypatch):
    from types import SimpleNamespace

    import sandbox
    from data import Problem

    seen = []

    def coder(model, tok, prompts, **kw):  # codes a + b only when the plan says so
        seen.extend(prompts)
        body = ["a + b" if "Return a + b" in p else "0" for p in prompts]
        return agents.Samples(None, None, None, None, texts=[f"```python\ndef add(a, b):\n    return {b}\n```" for b in body])

    monkeypatch.setattr(agents, "sample", coder)
    model, tok = agents.load_model(tiny_model_dir, device="cpu", dtype="float32")
    p = Problem(id="mbpp/1", bench="mbpp", statement="Add two numbers.", kind="assert",
                public_tests=["assert add(1, 2) == 3"], hidden_tests=["assert add(1, 2) == 3", "assert add(0, 5) == 5"],
                entry_point="add")
    with sandbox.SandboxPool(1) as pool:
        run = SimpleNamespace(args=SimpleNamespace(stop_on_failure=False), team=agents.Team(model, tok, pool=pool))
        rates = train.blind_pass_rates(run, [p, p], ["Steps: 1. Return a + b.", agents.CONTENT_FREE_PLAN])
    assert rates == [1.0, 0.0]
    assert all("Add two numbers" not in s and "assert add(1, 2) == 3" in s for s in seen)


def test_the_blind_weight_adds_the_blind_pass_rate_before_the_gate():
    from types import SimpleNamespace

    args = train.get_args(["--stage", "planner"])
    plan = "Input/Output: two ints; their sum.\nSteps: 1. Return a + b.\nConditions: none.\nLoops: none."
    outputs = [dict(plan=plan, verdict="ok", blind=1.0), dict(plan=plan, verdict="ok", blind=0.0),
               dict(plan="x", verdict="missing parts", blind=1.0)]
    results = [SimpleNamespace(pass_rate=0.5, cpu_s=0.001)] * 3
    off = train.reward_planner(results, outputs, 3, 1, args)[0]
    args.blind_weight = 0.5
    on = train.reward_planner(results, outputs, 3, 1, args)[0]
    assert on[0] == pytest.approx(off[0] + 0.5) and on[1] == pytest.approx(off[1])
    assert on[2] == off[2] == -args.format_penalty  # a gated plan scores -penalty whatever the blind Coder did


def test_a_planner_run_with_the_blind_weight_logs_the_blind_pass_rate(tiny_model_dir, mbpp_path, tmp_path):
    train.main(small(tiny_model_dir, tmp_path, "planner", mbpp_path, steps=1,
                     extra=("--blind-weight", "1", "--eval-every", "0")))
    m = read_metrics(tmp_path)[-1]
    assert 0.0 <= m["blind_pass_rate"] <= 1.0 and m["t_blind"] > 0


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
