"""Tests of grpo.py's hand-written LoRA and gradient checkpointing on the tiny random Qwen2 model.

What it is: minLoRA's checklist (unchanged after adding, changed after B moves, off == base, on again, save/load,
merge), trainability, checkpointing equivalence, named-adapter switching, PEFT-format round trips both ways, and
clear errors on bad input. What it is not: a test of training quality. Everything runs on CPU in fp32.
"""
import copy
import json

import pytest
import torch
from transformers import AutoModelForCausalLM

import grpo

ATOL = 1e-5


@pytest.fixture
def model(tiny_model_dir):
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


@pytest.fixture
def ids():
    g = torch.Generator().manual_seed(1)
    return torch.randint(3, 300, (2, 12), generator=g)  # (B, L)


def logits(model, ids):
    with torch.no_grad():
        return model(ids).logits  # (B, L, V)


def randomize_B(model, name, std=0.05, seed=0):
    """Move every B of adapter `name` off zero, as training would."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, m in grpo.lora_modules(model):
            if name in m.lora_B:
                B = m.lora_B[name]
                B.copy_(torch.randn(B.shape, generator=g) * std)


# --- minLoRA checklist ------------------------------------------------------------------------------------------

def test_output_unchanged_right_after_adding(model, ids):
    base = logits(model, ids)
    grpo.add_lora(model, "coder", r=4, alpha=8)
    assert torch.allclose(logits(model, ids), base, atol=ATOL)


def test_output_changes_after_B_moves(model, ids):
    base = logits(model, ids)
    grpo.add_lora(model, "coder", r=4, alpha=8)
    randomize_B(model, "coder")
    assert (logits(model, ids) - base).abs().max() > 1e-3


def test_adapters_off_equals_base(model, ids):
    base = logits(model, ids)
    grpo.add_lora(model, "coder", r=4, alpha=8)
    randomize_B(model, "coder")
    with grpo.adapters_off(model):
        assert torch.allclose(logits(model, ids), base, atol=ATOL)


def test_equal_again_after_reenabling(model, ids):
    grpo.add_lora(model, "coder", r=4, alpha=8)
    randomize_B(model, "coder")
    on = logits(model, ids)
    with grpo.adapters_off(model):
        logits(model, ids)
    assert grpo.active_adapter(model) == "coder"
    assert torch.allclose(logits(model, ids), on, atol=ATOL)


def test_equal_after_save_load(model, ids, tiny_model_dir, tmp_path):
    grpo.add_lora(model, "coder", r=4, alpha=8)
    randomize_B(model, "coder")
    grpo.save_adapter(model, "coder", str(tmp_path / "coder"))
    fresh = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    grpo.load_adapter(fresh, "coder", str(tmp_path / "coder"))
    assert torch.allclose(logits(fresh, ids), logits(model, ids), atol=ATOL)


def test_peft_merges_our_adapter_into_a_plain_model_with_same_logits(model, ids, tiny_model_dir, tmp_path):
    # Merging for export is PEFT's merge_and_unload on our saved adapter (grpo.merge_adapter was removed).
    peft = pytest.importorskip("peft")
    keys = set(model.state_dict())
    grpo.add_lora(model, "coder", r=4, alpha=8)
    randomize_B(model, "coder")
    grpo.save_adapter(model, "coder", str(tmp_path))
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    merged = peft.PeftModel.from_pretrained(base, str(tmp_path)).merge_and_unload().eval()
    assert set(merged.state_dict()) == keys and torch.allclose(logits(merged, ids), logits(model, ids), atol=ATOL)


def test_eval_does_not_merge(model, ids):
    base = logits(model, ids)
    grpo.add_lora(model, "coder", r=4, alpha=8)
    randomize_B(model, "coder")
    model.train()
    model.eval()
    with grpo.adapters_off(model):
        assert torch.allclose(logits(model, ids), base, atol=ATOL)


# --- trainability and checkpointing -----------------------------------------------------------------------------

def test_only_lora_parameters_trainable(model):
    grpo.add_lora(model, "planner", r=4, alpha=8)
    grpo.add_lora(model, "coder", r=4, alpha=8)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    ours = {id(p) for p in grpo.lora_parameters(model, "coder")}
    # 2 layers x 7 targets x (A, B), and only the coder's.
    assert len(ours) == 28
    assert ours == {id(p) for n, p in model.named_parameters() if n.endswith(".coder")}


def lora_grads(model, ids, checkpointing):
    model.train()
    grpo.enable_checkpointing(model, checkpointing)
    for p in model.parameters():
        p.grad = None
    torch.manual_seed(123)  # same dropout masks in both runs (checkpoint replays the RNG state)
    model(ids).logits.float().pow(2).mean().backward()
    return [p.grad.clone() for p in grpo.lora_parameters(model, "coder")]


def test_lora_grads_nonzero_and_equal_with_checkpointing(model, ids):
    grpo.add_lora(model, "coder", r=4, alpha=8, dropout=0.1)
    randomize_B(model, "coder")
    plain = lora_grads(model, ids, checkpointing=False)
    ckpt = lora_grads(model, ids, checkpointing=True)
    assert all(g.abs().sum() > 0 for g in ckpt)
    for a, b in zip(plain, ckpt):
        assert torch.allclose(a, b, atol=1e-6, rtol=1e-5)


def count_checkpoint_calls(monkeypatch):
    calls = []
    real = grpo.checkpoint

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(grpo, "checkpoint", counting)
    return calls


def test_checkpointing_only_when_training_with_grad(model, ids, monkeypatch):
    grpo.add_lora(model, "coder", r=4, alpha=8)
    grpo.enable_checkpointing(model)
    calls = count_checkpoint_calls(monkeypatch)
    model.train()
    with torch.no_grad():
        model(ids)
    model.eval()
    model(ids)
    assert calls == []
    model.train()
    model(ids)
    assert len(calls) == model.config.num_hidden_layers


def test_checkpointing_off_restores_plain_forward(model, ids, monkeypatch):
    grpo.enable_checkpointing(model)
    grpo.enable_checkpointing(model, on=False)
    calls = count_checkpoint_calls(monkeypatch)
    model.train()
    model(ids)
    assert calls == [] and all("forward" not in layer.__dict__ for layer in model.model.layers)


def test_checkpointed_model_deepcopies(model, ids):
    grpo.enable_checkpointing(model)
    twin = copy.deepcopy(model)
    # The copy's layers must run their own weights: change the copy, the original stays.
    with torch.no_grad():
        twin.model.layers[0].mlp.down_proj.weight.add_(1.0)
    assert not torch.allclose(logits(twin, ids), logits(model, ids))


# --- named adapters ---------------------------------------------------------------------------------------------

def test_adapters_give_different_outputs(model, ids):
    grpo.add_lora(model, "planner", r=4, alpha=8)
    grpo.add_lora(model, "coder", r=4, alpha=8)
    randomize_B(model, "planner", seed=1)
    randomize_B(model, "coder", seed=2)
    with grpo.use_adapter(model, "planner"):
        planner = logits(model, ids)
    with grpo.use_adapter(model, "coder"):
        coder = logits(model, ids)
    assert (planner - coder).abs().max() > 1e-3


def test_selected_adapter_is_the_one_used(model, ids, tiny_model_dir, tmp_path):
    grpo.add_lora(model, "planner", r=4, alpha=8)
    grpo.add_lora(model, "coder", r=8, alpha=8, targets=("q_proj", "v_proj"))
    randomize_B(model, "planner", seed=1)
    randomize_B(model, "coder", seed=2)
    grpo.save_adapter(model, "coder", str(tmp_path))
    # A model holding only the coder adapter is the reference for "coder selected".
    alone = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    grpo.load_adapter(alone, "coder", str(tmp_path))
    assert grpo.active_adapter(model) == "planner"  # the first adapter added stays active
    with grpo.use_adapter(model, "coder"):
        assert torch.allclose(logits(model, ids), logits(alone, ids), atol=ATOL)
    assert grpo.active_adapter(model) == "planner"  # restored on exit


def test_adding_an_adapter_keeps_the_active_one(model):
    grpo.add_lora(model, "planner", r=4, targets=("v_proj",))
    # q_proj comes before v_proj in module order: its new wrapper must not reset the active adapter.
    grpo.add_lora(model, "coder", r=4, targets=("q_proj",))
    assert all(m.active == "planner" for _, m in grpo.lora_modules(model))


# --- bad input --------------------------------------------------------------------------------------------------

def test_unknown_adapter_name_is_a_clear_error(model):
    grpo.add_lora(model, "coder", r=4, alpha=8)
    with pytest.raises(ValueError, match="unknown adapter 'planer'.*coder"):
        with grpo.use_adapter(model, "planer"):
            pass


def test_duplicate_adapter_name_is_a_clear_error(model):
    grpo.add_lora(model, "coder", r=4, alpha=8)
    with pytest.raises(ValueError, match="already exists"):
        grpo.add_lora(model, "coder", r=4, alpha=8)


def test_no_target_matched_is_a_clear_error(model):
    with pytest.raises(ValueError, match="no nn.Linear module name matched"):
        grpo.add_lora(model, "coder", targets=("c_attn",))


def test_bad_adapter_name_is_a_clear_error(model):
    with pytest.raises(ValueError, match="bad adapter name"):
        grpo.add_lora(model, "my.adapter")


def test_loading_into_mismatched_adapter_is_a_clear_error(model, tiny_model_dir, tmp_path):
    grpo.add_lora(model, "coder", r=4, alpha=8, targets=("q_proj",))
    grpo.save_adapter(model, "coder", str(tmp_path))
    other = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    grpo.add_lora(other, "coder", r=4, alpha=8, targets=("v_proj",))
    with pytest.raises(ValueError, match="adapter keys do not fit"):
        grpo.load_adapter(other, "coder", str(tmp_path))


def test_unsupported_peft_settings_are_a_clear_error(model, tiny_model_dir, tmp_path):
    grpo.add_lora(model, "coder", r=4, alpha=8)
    grpo.save_adapter(model, "coder", str(tmp_path))
    cfg = json.load(open(tmp_path / "adapter_config.json"))
    json.dump(dict(cfg, use_dora=True), open(tmp_path / "adapter_config.json", "w"))
    fresh = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    with pytest.raises(ValueError, match=r"unsupported PEFT adapter settings \['use_dora'\]"):
        grpo.load_adapter(fresh, "coder", str(tmp_path))


# --- PEFT format ------------------------------------------------------------------------------------------------

def test_saved_keys_and_config_are_peft_format(model, tmp_path):
    from safetensors.torch import load_file

    grpo.add_lora(model, "coder", r=4, alpha=8, dropout=0.05)
    grpo.save_adapter(model, "coder", str(tmp_path), base_model_name_or_path="tiny")
    keys = set(load_file(str(tmp_path / "adapter_model.safetensors")))
    assert "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight" in keys
    assert "base_model.model.model.layers.1.mlp.down_proj.lora_B.weight" in keys
    assert len(keys) == 2 * 7 * 2
    cfg = json.load(open(tmp_path / "adapter_config.json"))
    assert cfg["peft_type"] == "LORA" and cfg["task_type"] == "CAUSAL_LM"
    assert (cfg["r"], cfg["lora_alpha"], cfg["lora_dropout"]) == (4, 8, 0.05)
    assert sorted(cfg["target_modules"]) == sorted(grpo.DEFAULT_TARGETS)
    assert cfg["base_model_name_or_path"] == "tiny" and cfg["bias"] == "none" and cfg["fan_in_fan_out"] is False


def test_peft_loads_our_adapter_with_same_logits(model, ids, tiny_model_dir, tmp_path):
    peft = pytest.importorskip("peft")
    grpo.add_lora(model, "coder", r=4, alpha=8)
    randomize_B(model, "coder")
    grpo.save_adapter(model, "coder", str(tmp_path))
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    theirs = peft.PeftModel.from_pretrained(base, str(tmp_path)).eval()
    assert torch.allclose(logits(theirs, ids), logits(model, ids), atol=ATOL)


def test_we_load_a_peft_adapter_with_same_logits(model, ids, tiny_model_dir, tmp_path):
    peft = pytest.importorskip("peft")
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    # init_lora_weights=False: PEFT draws B at random too, so the adapter is not a no-op.
    cfg = peft.LoraConfig(r=4, lora_alpha=16, target_modules=["q_proj", "o_proj", "up_proj"],
                          init_lora_weights=False, task_type="CAUSAL_LM")
    theirs = peft.get_peft_model(base, cfg).eval()
    theirs.save_pretrained(str(tmp_path))
    grpo.load_adapter(model, "coder", str(tmp_path))
    assert torch.allclose(logits(model, ids), logits(theirs, ids), atol=ATOL)


def test_adapter_on_some_layers_round_trips_through_peft(model, ids, tiny_model_dir, tmp_path):
    peft = pytest.importorskip("peft")
    # Only layer 0's q_proj: the leaf name "q_proj" would select both layers, so the config must say exactly which.
    grpo.add_lora(model, "coder", r=4, alpha=8, targets=r"model\.layers\.0\.self_attn\.q_proj")
    randomize_B(model, "coder", std=0.5)
    grpo.save_adapter(model, "coder", str(tmp_path))
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    theirs = peft.PeftModel.from_pretrained(base, str(tmp_path)).eval()
    assert torch.allclose(logits(theirs, ids), logits(model, ids), atol=ATOL)
    assert sum("lora_A" in n for n, _ in theirs.named_parameters()) == 1


def test_checkpointed_backward_outside_adapter_context_uses_forward_adapter(tiny_model_dir):
    """Backward may run after `use_adapter` exited (another adapter active): the recompute must replay the
    adapter that was active in forward, so gradients equal those without checkpointing."""
    import torch
    from transformers import AutoModelForCausalLM

    import grpo

    def grads(ckpt):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
        grpo.add_lora(model, "planner", r=4)
        grpo.add_lora(model, "coder", r=4)
        for name in ("planner", "coder"):  # B != 0 so the adapters differ
            for p in grpo.lora_parameters(model, name):
                torch.nn.init.normal_(p, std=0.1)
        grpo.enable_checkpointing(model, ckpt)
        model.train()
        ids = torch.arange(1, 13).view(2, 6)
        with grpo.use_adapter(model, "coder"):
            loss = model(input_ids=ids).logits.float().square().mean()
        with grpo.use_adapter(model, "planner"):
            loss.backward()  # outside the coder's context, another adapter active
        return [p.grad.clone() for p in grpo.lora_parameters(model, "coder")]

    for a, b in zip(grads(False), grads(True)):
        torch.testing.assert_close(a, b)
