"""agents.load_model: the tiny model loads on CPU in fp32; wrong paths fail fast with one clear line."""
import os
import time

import pytest
import torch

import agents


def _one_line(err):
    return "\n" not in str(err) and len(str(err)) > 0


def test_loads_tiny_model_fp32_on_cpu_in_eval_mode(tiny_model_dir):
    model, tok = agents.load_model(tiny_model_dir, device="cpu", dtype="float32")
    assert next(model.parameters()).dtype == torch.float32
    assert next(model.parameters()).device.type == "cpu"
    assert not model.training
    assert tok.pad_token_id is not None and tok.padding_side == "left"


def test_dtype_can_be_overridden(tiny_model_dir):
    model, _ = agents.load_model(tiny_model_dir, device="cpu", dtype="bf16")
    assert next(model.parameters()).dtype == torch.bfloat16


def test_cpu_has_native_bf16_reads_the_cpu_flags(monkeypatch, tmp_path):
    real_open = open
    fake = tmp_path / "cpuinfo"
    monkeypatch.setattr("builtins.open", lambda p, *a, **k: real_open(fake if p == "/proc/cpuinfo" else p, *a, **k))
    fake.write_text("processor: 0\nflags\t\t: fpu sse avx2 avx512f avx512_bf16\n")
    assert agents.cpu_has_native_bf16()
    fake.write_text("processor: 0\nflags\t\t: fpu sse avx2 avx512f avx512_fp16\n")
    assert not agents.cpu_has_native_bf16()


def test_resolve_dtype_defaults_and_bad_name():
    cpu_auto = torch.bfloat16 if agents.cpu_has_native_bf16() else torch.float32
    assert agents.resolve_dtype(None, "cpu") == cpu_auto
    assert agents.resolve_dtype("auto", "cpu") == cpu_auto
    assert agents.resolve_dtype(torch.float16, "cpu") == torch.float16
    with pytest.raises(ValueError, match="unknown dtype"):
        agents.resolve_dtype("float8", "cpu")


def test_missing_local_path_is_one_clear_line(tmp_path):
    with pytest.raises(FileNotFoundError) as err:
        agents.load_model(str(tmp_path / "no-such-model"))
    assert _one_line(err.value) and "--model DIR or CORECODE_MODEL=DIR" in str(err.value)


def test_hub_id_without_a_reachable_hub_fails_in_seconds(monkeypatch):
    # No HF_HUB_OFFLINE, but the hub's host refuses connections (a machine without a network): the uncached id fails
    # after one connection attempt, not after the hub client's ~50 s of retries.
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    t0 = time.time()
    with pytest.raises(ValueError) as err:
        agents.load_model("no-such-org/no-such-model-xyz")
    assert time.time() - t0 < agents.HUB_PROBE_TIMEOUT_S + 5
    assert _one_line(err.value) and "cannot be reached" in str(err.value) and "CORECODE_MODEL=DIR" in str(err.value)


def test_file_instead_of_directory_is_rejected(tiny_model_dir):
    with pytest.raises(ValueError, match="not a directory"):
        agents.load_model(os.path.join(tiny_model_dir, "config.json"))


def test_random_like_has_the_architecture_and_tokenizer_and_new_weights(tiny_model_dir, tmp_path):
    from tiny_model import build_random_like

    real, real_tok = agents.load_model(tiny_model_dir, device="cpu", dtype="float32")
    fake, fake_tok = agents.load_model(build_random_like(tiny_model_dir, tmp_path / "like", seed=3), device="cpu",
                                       dtype="float32")
    assert {n: p.shape for n, p in fake.named_parameters()} == {n: p.shape for n, p in real.named_parameters()}
    assert fake_tok.get_vocab() == real_tok.get_vocab() and fake_tok.chat_template == real_tok.chat_template
    emb = fake.get_input_embeddings().weight
    assert not torch.equal(emb, real.get_input_embeddings().weight.to(emb.dtype))
