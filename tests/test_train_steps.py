"""train.py's phases, one property each, on the tiny model: the chain a stage runs, the rollout's
grouping into Rollouts, each group's reward, the advantages, micro-batching, and the learning step's
gradient against a direct computation of the same loss on the whole batch."""
import types

import pytest
import torch

import agents
import grpo
import rewards
import sandbox
import train
from data import Problem


def args_of(*argv):
    return train.get_args(["--stage", *argv])


def problem(i):
    return Problem(id=f"mbpp/{600 + i}", bench="mbpp", statement=f"Write a function to add {i} to x.",
                   kind="assert", public_tests=[f"assert add(1) == {1 + i}"],
                   hidden_tests=[f"assert add(1) == {1 + i}", f"assert add(2) == {2 + i}"], entry_point="add")


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return agents.load_model(tiny_model_dir, device="cpu", dtype="float32")


def test_the_planner_stage_chain_samples_g_plans_and_m_programs_each():
    args = args_of("planner", "--group-size", "4", "--downstream-samples", "2", "--temperature", "0.7")
    assert train.stage_chain(args) == [("planner", 4, 0.7), ("coder", 2, 0.7)]
    # M = 1: the frozen Coder writes greedily, so a plan's reward is not blurred by sampling noise
    assert train.stage_chain(args_of("planner", "--group-size", "4")) == [("planner", 4, 1.0), ("coder", 1, 0.0)]


def test_roles_before_the_trained_one_write_once_greedily():
    args = args_of("coder", "--group-size", "3")
    assert train.stage_chain(args) == [("planner", 1, 0.0), ("coder", 3, 1.0)]


def test_a_rollout_row_carries_its_problem_text_plan_and_its_m_programs(tiny):
    model, tok = tiny
    args = args_of("planner", "--group-size", "2", "--downstream-samples", "2", "--max-new-tokens", "8",
                   "--plan-max-new-tokens", "8")
    team = agents.Team(model, tok, max_new_tokens=8, plan_max_new_tokens=8)
    state = types.SimpleNamespace(args=args, team=team, plans={}, show=lambda text: None)
    problems = [problem(0), problem(1)]
    gens = [torch.Generator().manual_seed(i) for i in range(2)]
    rollouts, samples = train.sample(state, problems, gens, {})
    assert len(rollouts) == 4 and samples.completion_ids.shape[0] == 4  # G = 2 per problem
    assert [r.problem.id for r in rollouts] == ["mbpp/600", "mbpp/600", "mbpp/601", "mbpp/601"]
    assert [r.text for r in rollouts] == samples.texts
    assert all(len(r.programs) == 2 for r in rollouts)  # M = 2 programs per plan
    for r in rollouts:  # the plan the Coder saw is the Planner's sample, pre-fill included
        assert r.plan == agents.clean_plan(r.text, agents.plan_prefix(r.problem))
    assert [r.length for r in rollouts] == samples.completion_mask.sum(1).tolist()



def test_given_plans_replace_the_planner_in_the_coder_stage(tiny):
    # --plans-from: the chain has no Planner, and each rollout's Coder wrote from its problem's plan
    model, tok = tiny
    args = args_of("coder", "--group-size", "2", "--max-new-tokens", "8", "--plan-max-new-tokens", "8")
    team = agents.Team(model, tok, max_new_tokens=8, plan_max_new_tokens=8)
    plans = {"mbpp/600": ("Steps: 1. add zero.", False), "mbpp/601": ("Steps: 1. add one.", True)}
    state = types.SimpleNamespace(args=args, team=team, plans=plans, show=lambda text: None)
    gens = [torch.Generator().manual_seed(i) for i in range(2)]
    rollouts, samples = train.sample(state, [problem(0), problem(1)], gens, {})
    assert [(r.plan, r.plan_truncated) for r in rollouts] == [plans["mbpp/600"]] * 2 + [plans["mbpp/601"]] * 2
    assert [r.text for r in rollouts] == samples.texts  # the trained role's samples are the Coder's
    assert all(r.programs == [agents.extract_code(r.text, "assert", "add")] for r in rollouts)

def result(pass_rate, cpu_s=0.01, peak=1 << 20):
    return types.SimpleNamespace(pass_rate=pass_rate, cpu_s=cpu_s, peak_bytes=peak,
                                 verdict="passed" if pass_rate == 1 else "failed")


def test_a_planner_group_is_scored_by_rewards_planner_reward_with_its_gate_labels():
    group = [train.Rollout(problem(0), "t", 1, results=[result(1.0, 0.01), result(0.5)], gate="ok"),
             train.Rollout(problem(0), "t", 1, results=[result(1.0, 0.02), result(1.0)], gate="truncated"),
             train.Rollout(problem(0), "t", 1, results=[result(1.0), result(1.0)], gate="content-free")]
    train.score_group("planner", group)
    pass_rates = [[x.pass_rate for x in r.results] for r in group]
    cpu = [[x.cpu_s for x in r.results] for r in group]
    want = rewards.planner_reward(pass_rates, cpu, ["ok", "truncated", "content-free"])
    assert [r.reward for r in group] == want
    assert group[2].reward == -train.GATE_PENALTY
    assert [r.without["time"] for r in group] == rewards.planner_reward(
        pass_rates, cpu, ["ok", "truncated", "content-free"], w_time=0.0)


def test_a_coder_group_is_scored_by_rewards_coder_reward():
    group = [train.Rollout(problem(0), "t", 1, results=[result(1.0, peak=5 << 20)]),
             train.Rollout(problem(0), "t", 1, results=[result(0.5)]),
             train.Rollout(problem(0), "t", 1, results=[result(1.0, peak=1 << 20)])]
    train.score_group("coder", group)
    want = rewards.coder_reward([1.0, 0.5, 1.0], [5 << 20, 1 << 20, 1 << 20])
    assert [r.reward for r in group] == want and group[2].reward > group[0].reward > group[1].reward


def test_advantages_normalise_each_group_and_a_step_without_groups_is_skipped():
    opt = types.SimpleNamespace(param_groups=[{"lr": 0.1}])
    state = types.SimpleNamespace(args=args_of("toy", "--group-size", "2", "--adv-std-floor", "0"),
                                  optimizer=opt)
    rollouts = [train.Rollout(problem(0), "t", 1, reward=x) for x in (1.0, 0.0, 0.5, 0.5)]
    m = {}
    adv = train.advantages(state, rollouts, m)
    want, _ = grpo.group_advantages([1.0, 0.0, 0.5, 0.5], 2)
    assert torch.equal(adv, want) and m["groups"] == 2 and m["informative_groups"] == 1
    m = {}
    assert train.advantages(state, [], m) is None and m["no_group"] and m["groups"] == 0


def samples_of(tiny, n_prompts=3, group=2, new=6):
    model, tok = tiny
    prompts = [agents.chat_prompt(tok, "You write Python.", "x" * (1 + 5 * i)) for i in range(n_prompts)]
    return agents.sample(model, tok, prompts, group_size=group, max_new_tokens=new, temperature=1.0, seed=0)


def test_micro_batches_trim_only_padding(tiny):
    s = samples_of(tiny)
    full = torch.cat([s.prompt_ids, s.completion_ids], 1)
    P = s.prompt_ids.shape[1]
    for mb in train.micro_batches(s, 4):
        left = mb.completion_start
        assert torch.equal(mb.input_ids, full[mb.rows][:, P - left:P + mb.completion_mask.shape[1]])
        # every dropped column is padding in every row of the micro-batch
        assert s.prompt_mask[mb.rows][:, :P - left].sum() == 0
        assert s.completion_mask[mb.rows][:, mb.completion_mask.shape[1]:].sum() == 0


def learning_state(tiny, micro_batch, beta=0.04):
    model, tok = tiny
    if "coder" not in grpo.adapter_names(model):
        grpo.add_lora(model, "coder", r=4, alpha=8)
        torch.manual_seed(0)
        for name, p in model.named_parameters():  # B moved off zero: the policy differs from the reference
            if "lora_B.coder" in name:
                p.data.normal_(0, 0.05)
    params = grpo.lora_parameters(model, "coder")
    optimizer = torch.optim.SGD(params, lr=0.0)  # lr 0: the gradients are read, the weights kept
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    args = args_of("toy", "--micro-batch", str(micro_batch), "--beta", str(beta), "--temperature", "1.0")
    team = agents.Team(model, tok, adapters=frozenset({"coder"}))
    return types.SimpleNamespace(args=args, team=team, model=model, params=params, optimizer=optimizer,
                                 scheduler=scheduler, device=torch.device("cpu"), role="coder",
                                 show=lambda text: None)


def direct_gradient(state, s, adv, beta):
    """The same loss on the whole batch at once, written out: -mean_i mean_t (rho_it A_i - beta KL_it)."""
    model = state.model
    ids = torch.cat([s.prompt_ids, s.completion_ids], 1)
    attn = torch.cat([s.prompt_mask, s.completion_mask], 1)
    P, m = s.prompt_ids.shape[1], s.completion_mask.bool()
    with torch.no_grad(), grpo.adapters_off(model):
        ref = grpo.token_logprobs(model, ids, attn, P)
    model.zero_grad(set_to_none=True)
    with grpo.use_adapter(model, "coder"):
        lp = grpo.token_logprobs(model, ids, attn, P)
    ratio = torch.exp(lp - lp.detach())
    d = ref - lp
    per_token = torch.where(m, ratio * adv[:, None] - beta * (torch.exp(d) - d - 1), 0.0)
    loss = -(per_token.sum(1) / m.sum(1)).mean()
    loss.backward()
    return [p.grad.clone() for p in state.params]


@pytest.mark.parametrize("micro_batch", [1, 4, 16])
def test_the_learning_step_gradient_equals_the_loss_on_the_whole_batch(tiny, monkeypatch, micro_batch):
    monkeypatch.setattr(train, "GRAD_CLIP", float("inf"))  # read the gradient as computed, not clipped
    s = samples_of(tiny)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 0.0, 2.0])
    state = learning_state(tiny, micro_batch)
    want = direct_gradient(state, s, adv, beta=0.04)
    m = {"step": 1}
    train.learn(state, s, adv, m)
    got = [p.grad for p in state.params]
    assert all(torch.allclose(g, w, rtol=1e-4, atol=1e-6) for g, w in zip(got, want))
    assert m["grad_norm"] == pytest.approx(float(torch.linalg.vector_norm(
        torch.stack([torch.linalg.vector_norm(w) for w in want]))), rel=1e-4)


def test_curves_png_is_drawn_from_metrics_jsonl(tmp_path):
    pytest.importorskip("matplotlib")
    import json
    rows = [{"step": 1, "reward_mean": 0.1, "pass_rate": 0.2, "kl": 0.0, "eval_cg_start": -0.1},
            {"step": 2, "reward_mean": 0.3, "pass_rate": 0.4, "kl": 0.01, "eval_cg": 0.05}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    train.plot_curves(str(tmp_path))
    assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_training_never_holds_a_held_out_problems_reference_solution(mbpp_path):
    # Reference plans are written from the reference solution: with none on the held-out problems,
    # no role of a training run can read one there, nor a plan made from one.
    args = args_of("planner", "--data", mbpp_path, "--limit", "3", "--eval-limit", "3")
    args.bench_kwargs = {}
    train_set, eval_set = train.load_data(args)
    assert all(p.reference for p in train_set)
    assert eval_set and not any(p.reference for p in eval_set)
    assert all("reference-planner" not in stage["chain"] for stage in train.STAGES.values())
