"""Proof that the GRPO loop learns: train.py's real loop (same sampler, grpo.py functions, optimizer) on a tiny
random model with a toy verifiable reward (the fraction of characters that are 'e', `--stage toy`).

This guards the sign and the plumbing of the objective: with a flipped sign, a broken mask, advantages not
reaching the loss, or an optimizer over the wrong parameters, the reward does not go up. It also checks that the
KL to the reference (the same model with adapters off) starts at exactly zero and then grows.
"""
import json
import os

import pytest

import train
from tiny_model import build_tiny_model


@pytest.fixture(scope="module")
def learnable_model_dir(tmp_path_factory):
    # init_std 0.3: see build_tiny_model; at HF's 0.02 a tiny model's logits are too flat to move quickly.
    return build_tiny_model(str(tmp_path_factory.mktemp("tiny-learnable")), init_std=0.3)



def run_toy(model_dir, data, out, steps, extra=()):
    """The toy stage on `data`: our own small MBPP-format file (conftest.toy_mbpp), only its prompts are used.
    Rewarded: the character "e" (frequent in the tiny model's vocabulary), LoRA rank 8."""
    patch = pytest.MonkeyPatch()
    patch.setattr(train, "TOY_TARGET", "e")
    patch.setattr(train, "LORA_R", 8)
    try:
        _run_toy(model_dir, data, out, steps, extra)
    finally:
        patch.undo()
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def _run_toy(model_dir, data, out, steps, extra):
    train.main(["--stage", "toy", "--model", model_dir, "--out", str(out), "--num-steps", str(steps), "--data", data,
                "--problems-per-step", "4", "--group-size", "8", "--max-new-tokens", "8", "--lr", "1e-2",
                "--warmup-steps", "1", "--eval-every", "0", "--limit", "16",
                "--beta", "0.01", "--seed", "0", "--dtype", "float32",
                # plain GRPO scaling: the toy's rewards (fractions of 8 characters) differ by less than the floor
                "--adv-std-floor", "0", *extra])
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


@pytest.fixture(scope="module")
def toy_metrics(learnable_model_dir, toy_mbpp, tmp_path_factory):
    return run_toy(learnable_model_dir, toy_mbpp, tmp_path_factory.mktemp("toy-run"), steps=24)


def test_reward_goes_up(toy_metrics):
    first = sum(m["reward_mean"] for m in toy_metrics[:4]) / 4
    last = sum(m["reward_mean"] for m in toy_metrics[-4:]) / 4
    assert last > first + 0.1, (first, last)


def test_kl_starts_at_zero_then_grows(toy_metrics):
    assert toy_metrics[0]["kl"] == pytest.approx(0.0, abs=1e-6)
    assert toy_metrics[-1]["kl"] > 0.01


def test_no_step_skipped_and_grad_norm_logged(toy_metrics):
    assert not any(m.get("skipped") for m in toy_metrics)
    assert all(m["grad_norm"] > 0 for m in toy_metrics)


def test_bfloat16_weights_train_with_float32_adapters(learnable_model_dir, toy_mbpp, tmp_path):
    # The dtype train.py uses on CUDA (bf16 base, float32 LoRA), run here on CPU: every step finite and applied,
    # KL starting at zero, and the adapter saved in float32.
    from safetensors.torch import load_file

    metrics = run_toy(learnable_model_dir, toy_mbpp, tmp_path, steps=4, extra=("--dtype", "bfloat16"))
    assert len(metrics) == 4 and not any(m.get("skipped") for m in metrics)
    assert all(m["grad_norm"] > 0 and m["grad_norm"] == m["grad_norm"] for m in metrics)
    assert metrics[0]["kl"] == pytest.approx(0.0, abs=1e-6)
    tensors = load_file(os.path.join(tmp_path, "final", "coder", "adapter_model.safetensors"))
    assert tensors and all(str(t.dtype) == "torch.float32" for t in tensors.values())


def poison_loss_call(monkeypatch, k):
    """Make the k-th call of grpo_loss (1-based) return a non-finite loss; the others are untouched."""
    real, calls = train.grpo.grpo_loss, []

    def poisoned(*a, **kw):
        loss, st = real(*a, **kw)
        calls.append(1)
        return (loss * float("nan"), st) if len(calls) == k else (loss, st)

    monkeypatch.setattr(train.grpo, "grpo_loss", poisoned)


def test_lr_schedule_counts_updates_not_skipped_steps(learnable_model_dir, toy_mbpp, tmp_path, monkeypatch):
    # Step 1's loss is made non-finite: its update is dropped, and the warm-up must not advance for it.
    poison_loss_call(monkeypatch, 1)
    metrics = run_toy(learnable_model_dir, toy_mbpp, tmp_path, steps=2, extra=("--warmup-steps", "4", "--micro-batch", "32"))
    assert metrics[0].get("skipped") and not metrics[1].get("skipped")
    # lr after the skipped step: still the first warm-up value (1/4); after the first real update: 2/4.
    assert metrics[0]["lr"] == pytest.approx(1e-2 / 4) and metrics[1]["lr"] == pytest.approx(1e-2 * 2 / 4)
