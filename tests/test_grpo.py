"""Tests of grpo.py's GRPO objective: advantages, k3 KL, the loss, and chunked token log-probs.

What it is: properties on random tensors (zero-mean advantages, k3 >= 0, masked tokens get no gradient), equality
with straightforward references (a per-sample Python loop of the DeepSeekMath formula, REINFORCE with a baseline,
full-logits log_softmax on the tiny model). What it is not: a training run. CPU, float64 where it helps exactness.
"""
import math

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM

import grpo


def random_batch(B=6, T=9, seed=0, dtype=torch.float64):
    """logp, old, ref (B, T) near each other (ratios around 1, some clipped), advantages (B,), mask (B, T)."""
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(B, T, generator=g, dtype=dtype) * 3
    old = logp + torch.randn(B, T, generator=g, dtype=dtype) * 0.3
    ref = logp + torch.randn(B, T, generator=g, dtype=dtype) * 0.5
    adv = torch.randn(B, generator=g, dtype=dtype)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).long()  # (B, T) right padding
    return logp, old, ref, adv, mask


# --- advantages -------------------------------------------------------------------------------------------------

def test_advantages_zero_mean_unit_std_per_group():
    rewards = torch.rand(4 * 8, generator=torch.Generator().manual_seed(0))
    adv, stats = grpo.group_advantages(rewards, group_size=8)
    groups = adv.view(4, 8)
    assert torch.allclose(groups.mean(1), torch.zeros(4), atol=1e-6)
    assert torch.allclose(groups.std(1), torch.ones(4), atol=1e-2)
    assert stats["zero_var_frac"] == 0.0


def test_advantages_finite_and_zero_when_rewards_tie():
    # Group 0: all pass; group 1: all fail; group 2: a tie on a value whose float mean is inexact; group 3: signal.
    rewards = [1.0] * 4 + [0.0] * 4 + [0.1] * 4 + [0.0, 1.0, 0.0, 0.5]
    adv, stats = grpo.group_advantages(rewards, group_size=4)
    assert torch.isfinite(adv).all()
    assert (adv[:12] == 0).all() and (adv[12:] != 0).all()
    assert stats["zero_var_frac"] == 0.75
    assert math.isclose(stats["reward_mean"], sum(rewards) / 16, rel_tol=1e-6)


def test_advantages_bad_group_size_is_a_clear_error():
    with pytest.raises(ValueError, match="do not split into groups of 4"):
        grpo.group_advantages([0.0] * 6, group_size=4)


# --- k3 KL ------------------------------------------------------------------------------------------------------

def test_k3_zero_at_equality_and_nonnegative():
    logp, _, ref, _, _ = random_batch()
    assert torch.equal(grpo.kl_k3(logp, logp), torch.zeros_like(logp))
    assert (grpo.kl_k3(logp, ref) >= 0).all() and (grpo.kl_k3(logp, ref) > 0).any()


# --- the loss ---------------------------------------------------------------------------------------------------

def loop_loss(logp, old, ref, adv, mask, beta, eps):
    """DeepSeekMath eq. (3) written out per completion and per token in plain Python floats."""
    total = 0.0
    for i in range(len(logp)):
        tokens = [t for t in range(len(logp[i])) if mask[i][t]]
        acc = 0.0
        for t in tokens:
            rho = math.exp(logp[i][t] - old[i][t])
            rho_clip = min(max(rho, 1 - eps), 1 + eps)
            surrogate = min(rho * adv[i], rho_clip * adv[i])
            d = ref[i][t] - logp[i][t]
            acc += surrogate - beta * (math.exp(d) - d - 1)
        total += acc / len(tokens)
    return -total / len(logp)


@pytest.mark.parametrize("beta", [0.0, 0.04, 0.5])
def test_loss_equals_per_sample_python_loop(beta):
    logp, old, ref, adv, mask = random_batch(seed=1)
    loss, _ = grpo.grpo_loss(logp, old, ref, adv, mask, beta=beta, clip_eps=0.2)
    expected = loop_loss(logp.tolist(), old.tolist(), ref.tolist(), adv.tolist(), mask.tolist(), beta, 0.2)
    assert math.isclose(loss.item(), expected, rel_tol=1e-10, abs_tol=1e-12)


def test_clip_frac_counts_tokens_where_clipping_binds():
    logp, old, ref, adv, mask = random_batch(seed=2)
    _, stats = grpo.grpo_loss(logp, old, ref, adv, mask, clip_eps=0.2)
    rho = torch.exp(logp - old)
    A = adv[:, None].expand_as(rho)
    binds = ((rho > 1.2) & (A > 0)) | ((rho < 0.8) & (A < 0))
    assert 0 < stats["clip_frac"] < 1
    assert math.isclose(stats["clip_frac"], binds[mask.bool()].double().mean().item(), rel_tol=1e-6)


def test_masked_tokens_get_zero_gradient():
    logp, old, ref, adv, mask = random_batch(seed=3)
    pad = ~mask.bool()
    # Padding may hold anything: huge values, -inf from a sampler, NaN-free garbage.
    logp = logp.masked_fill(pad, 80.0).requires_grad_()
    old = old.masked_fill(pad, -math.inf)
    ref = ref.masked_fill(pad, -1e4)
    loss, _ = grpo.grpo_loss(logp, old, ref, adv, mask, beta=0.04)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logp.grad).all()
    assert (logp.grad[pad] == 0).all() and (logp.grad[~pad] != 0).all()


def test_one_pass_beta0_gradient_is_reinforce_with_baseline():
    logp, _, ref, adv, mask = random_batch(seed=4)
    logp = logp.requires_grad_()
    loss, stats = grpo.grpo_loss(logp, logp.detach(), ref, adv, mask, beta=0.0)
    (grad,) = torch.autograd.grad(loss, logp)
    # REINFORCE with the group baseline folded into A: -mean_i (1/|o_i|) sum_t A_i log p_it.
    m = mask.double()
    reinforce = -((adv[:, None] * logp * m).sum(1) / m.sum(1)).mean()
    (expected,) = torch.autograd.grad(reinforce, logp)
    assert torch.allclose(grad, expected, atol=1e-12)
    assert stats["clip_frac"] == 0.0 and stats["ratio_mean"] == 1.0


def test_beta_without_reference_is_a_clear_error():
    logp, old, _, adv, mask = random_batch()
    with pytest.raises(ValueError, match="needs ref_logp"):
        grpo.grpo_loss(logp, old, None, adv, mask, beta=0.04)


# --- token log-probs --------------------------------------------------------------------------------------------

@pytest.fixture
def model(tiny_model_dir):
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


def ragged_batch(pad_id=0, eos_id=2):
    """Left-padded prompts of lengths 3, 7, 5 and right-padded completions of lengths 4, 6, 1 ending in EOS."""
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(3, 300, (n,), generator=g) for n in (3, 7, 5)]
    completions = [torch.cat([torch.randint(3, 300, (n - 1,), generator=g), torch.tensor([eos_id])]) for n in (4, 6, 1)]
    P, T = max(map(len, prompts)), max(map(len, completions))
    ids = torch.full((3, P + T), pad_id)
    am = torch.zeros(3, P + T, dtype=torch.long)
    for i, (p, c) in enumerate(zip(prompts, completions)):
        ids[i, P - len(p):P], am[i, P - len(p):P] = p, 1
        ids[i, P:P + len(c)], am[i, P:P + len(c)] = c, 1
    return ids, am, P, am[:, P:]  # (B, L), (B, L), int, (B, T) completion mask


def naive_logprobs(model, ids, am, P):
    """Full (B, L, V) logits from the HF forward, log_softmax, gather: the obvious way."""
    pos = (am.cumsum(-1) - 1).clamp(min=0)
    logits = model(ids, attention_mask=am, position_ids=pos).logits  # (B, L, V)
    logp = F.log_softmax(logits[:, P - 1:-1].float(), dim=-1)  # (B, T, V)
    return logp.gather(-1, ids[:, P:, None]).squeeze(-1)  # (B, T)


@pytest.mark.parametrize("chunk", [1, 2, 128])
def test_token_logprobs_equal_naive_full_logits(model, chunk):
    ids, am, P, cmask = ragged_batch()
    with torch.no_grad():
        ours = grpo.token_logprobs(model, ids, am, P, chunk=chunk)
        naive = naive_logprobs(model, ids, am, P)
    m = cmask.bool()
    assert ours.shape == cmask.shape and torch.isfinite(ours).all()
    assert torch.allclose(ours[m], naive[m], atol=1e-5)
    assert (ours[~m] == 0).all()


def test_sampled_tokens_logprobs_at_temperature_2_are_the_tempered_softmax(model, tiny_model_dir):
    # Tokens drawn by the sampler at T = 2 are scored under softmax(logits / 2): what GRPO's policy, old and
    # reference log-probs must use (TRL / verl divide by T too). At T = 1 they would differ.
    from transformers import AutoTokenizer

    import agents

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    s = agents.sample(model, tok, ["hello world", "a b"], group_size=3, max_new_tokens=6, temperature=2.0, seed=0)
    ids = torch.cat([s.prompt_ids, s.completion_ids], 1)  # (B, P+T)
    am = torch.cat([s.prompt_mask, s.completion_mask], 1)  # (B, P+T)
    P, m = s.prompt_ids.shape[1], s.completion_mask.bool()
    with torch.no_grad():
        ours = grpo.token_logprobs(model, ids, am, P, temperature=2.0)  # (B, T)
        pos = (am.cumsum(-1) - 1).clamp(min=0)
        logits = model(ids, attention_mask=am, position_ids=pos).logits[:, P - 1:-1].float()  # (B, T, V)
        want = F.log_softmax(logits / 2.0, -1).gather(-1, ids[:, P:, None]).squeeze(-1)  # (B, T)
        at_1 = F.log_softmax(logits, -1).gather(-1, ids[:, P:, None]).squeeze(-1)
    assert torch.allclose(ours[m], want[m], atol=1e-5)
    assert not torch.allclose(ours[m], at_1[m], atol=1e-3)


def test_token_logprobs_rejects_nonpositive_temperature(model):
    ids, am, P, _ = ragged_batch()
    with pytest.raises(ValueError, match="temperature"):
        grpo.token_logprobs(model, ids, am, P, temperature=0.0)


def test_token_logprobs_unchanged_by_left_padding(model):
    ids, am, P, cmask = ragged_batch()
    with torch.no_grad():
        batch = grpo.token_logprobs(model, ids, am, P)
        row = ids[0][am[0].bool()][None]  # row 0 without any padding
        alone = grpo.token_logprobs(model, row, torch.ones_like(row), 3)
    assert torch.allclose(batch[0, :4], alone[0], atol=1e-5)


def lora_grads_ours_and_naive(model, batch, seed):
    """LoRA gradients of sum(weights * logprobs) on a random-adapter model: naive full logits without checkpointing,
    then token_logprobs (chunk=2) with checkpointing on."""
    grpo.add_lora(model, "coder", r=4, alpha=8)
    with torch.no_grad():
        for p in grpo.lora_parameters(model, "coder"):
            p.normal_(std=0.05)
    ids, am, P, cmask = batch
    weights = torch.randn(cmask.shape, generator=torch.Generator().manual_seed(seed)) * cmask  # (B, T)
    model.train()

    def grads(fn):
        for p in model.parameters():
            p.grad = None
        (fn() * weights).sum().backward()
        return [p.grad.clone() for p in grpo.lora_parameters(model, "coder")]

    expected = grads(lambda: naive_logprobs(model, ids, am, P))
    grpo.enable_checkpointing(model)
    return grads(lambda: grpo.token_logprobs(model, ids, am, P, chunk=2)), expected


def test_token_logprobs_gradients_equal_naive(model):
    ours, expected = lora_grads_ours_and_naive(model, ragged_batch(), seed=6)
    assert all(g.abs().sum() > 0 for g in ours)
    for a, b in zip(ours, expected):
        assert torch.allclose(a, b, atol=1e-6, rtol=1e-4)


def grouped_batch(G=3, pad_id=0, eos_id=2, extra_left=2, extra_right=3):
    """A GRPO layout: prompts of lengths 3, 7, 5, each repeated for G completions of ragged lengths (1..6, EOS at the
    end), left-padded prompts and right-padded completions, plus `extra_left` / `extra_right` columns that are padding
    in every row (as in a micro-batch cut from a larger batch)."""
    g = torch.Generator().manual_seed(8)
    prompts = [torch.randint(3, 300, (n,), generator=g) for n in (3, 7, 5)]
    B = len(prompts) * G
    lengths = torch.randint(1, 7, (B,), generator=g).tolist()
    completions = [torch.cat([torch.randint(3, 300, (n - 1,), generator=g), torch.tensor([eos_id])]) for n in lengths]
    P, T = max(map(len, prompts)) + extra_left, max(lengths) + extra_right
    ids = torch.full((B, P + T), pad_id)
    am = torch.zeros(B, P + T, dtype=torch.long)
    for i, c in enumerate(completions):
        p = prompts[i // G]
        ids[i, P - len(p):P], am[i, P - len(p):P] = p, 1
        ids[i, P:P + len(c)], am[i, P:P + len(c)] = c, 1
    return ids, am, P, am[:, P:]


def test_grouped_batch_with_padding_columns_equals_naive_full_logits(model):
    # A micro-batch cut from a larger batch: G rows per prompt, and columns that are padding in every row.
    ids, am, P, cmask = grouped_batch()
    with torch.no_grad():
        ours = grpo.token_logprobs(model, ids, am, P, chunk=2)
    m = cmask.bool()
    assert ours.shape == cmask.shape and (ours[~m] == 0).all()
    assert torch.allclose(ours[m], naive_logprobs(model, ids, am, P).detach()[m], atol=1e-5)


def test_grouped_batch_gradients_equal_naive_with_checkpointing(model):
    ours, expected = lora_grads_ours_and_naive(model, grouped_batch(), seed=9)
    assert all(g.abs().sum() > 0 for g in ours)
    for a, b in zip(ours, expected):
        assert torch.allclose(a, b, atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("temperature", [1.0, 2.0, 0.7])
def test_chunked_head_gradients_equal_autograd_with_bias_and_trainable_head(temperature):
    # The hand-written backward against autograd through the full logits / T: hidden, weight and bias, uneven chunks.
    g = torch.Generator().manual_seed(7)
    h = torch.randn(7, 5, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(11, 5, generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(11, generator=g, dtype=torch.float64, requires_grad=True)
    t = torch.randint(0, 11, (7,), generator=g)
    fn = grpo._ChunkedHeadLogprob.apply
    # The function's forward computes in float32 by design; compare in that precision against autograd.
    out = fn(h, w, b, t, 3, temperature)
    ref = F.log_softmax(F.linear(h, w, b).float() / temperature, -1).gather(1, t[:, None]).squeeze(1)
    assert torch.allclose(out, ref, atol=1e-5)
    gout = torch.randn(7, generator=g, dtype=torch.float32)
    ours = torch.autograd.grad(out, (h, w, b), gout)
    theirs = torch.autograd.grad(ref, (h, w, b), gout)
    for a, e in zip(ours, theirs):
        assert torch.allclose(a, e, atol=1e-5)
