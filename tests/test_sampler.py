"""agents.sample: the KV-cache sampler against references (naive full recompute, HF generate greedy).

One property per test, on the tiny random model. Its stock weights (std 0.02) make greedy decoding
collapse to one repeated token, which would make equality tests vacuous, so the `tiny` fixture redraws
the matrices with a larger scale (in memory only) to get varied, prompt-dependent outputs.
"""

import pytest
import torch

import agents

from tiny_model import real_model_dir


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    model, tok = agents.load_model(tiny_model_dir, device="cpu", dtype="float32")
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:  # (out, in): scale 2/sqrt(in) gives peaked, input-dependent logits
                p.copy_(torch.randn(p.shape, generator=g) * 2 / p.shape[1] ** 0.5)
    return model, tok


def ragged_prompts(tok):
    """Three chat prompts of clearly different token lengths (exercises left padding)."""
    users = ["hi", "Write a function to find the minimum of a list.", "def add(a, b):\n    return a + b\n" * 3]
    return [agents.chat_prompt(tok, "You write Python.", u) for u in users]


def naive_sample(model, tok, prompts, group_size, max_new_tokens, temperature, seed, eos_ids):
    """Reference: no cache, the full sequence re-run every step, same per-step draws as `sample`."""
    enc = tok(prompts, padding=True, padding_side="left", return_tensors="pt", add_special_tokens=False)
    ids = enc["input_ids"].repeat_interleave(group_size, 0)  # (B, P) every row prefilled on its own
    am = enc["attention_mask"].repeat_interleave(group_size, 0)  # (B, P)
    gen = torch.Generator().manual_seed(seed)
    B = ids.shape[0]
    finished = torch.zeros(B, dtype=torch.bool)
    out, mask = [], []
    for _ in range(max_new_tokens):
        pos = (am.cumsum(-1) - 1).clamp(min=0)
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=am, position_ids=pos, use_cache=False).logits[:, -1].float()
        nxt = agents.sample_token(logits, temperature, gen)
        nxt = torch.where(finished, tok.pad_token_id, nxt)
        out.append(nxt)
        mask.append((~finished).long())
        finished = finished | torch.isin(nxt, torch.tensor(eos_ids, dtype=torch.long))
        ids = torch.cat([ids, nxt[:, None]], 1)
        am = torch.cat([am, torch.ones(B, 1, dtype=am.dtype)], 1)
        if finished.all():
            break
    return torch.stack(out, 1), torch.stack(mask, 1)


def greedy_ids(model, tok, prompts, n):
    return agents.sample(model, tok, prompts, max_new_tokens=n, temperature=0, eos_token_ids=()).completion_ids


# ---------------------------------------------------------------------------------------------- references

def test_cached_sampling_equals_naive_recompute(tiny):
    model, tok = tiny
    prompts = ragged_prompts(tok)
    eos = list(range(3, 43))  # 10% of the vocabulary ends a row: some rows stop early, some run to the cap
    kw = dict(group_size=3, max_new_tokens=24, temperature=1.0)
    s = agents.sample(model, tok, prompts, seed=7, eos_token_ids=eos, **kw)
    ref_ids, ref_mask = naive_sample(model, tok, prompts, kw["group_size"], kw["max_new_tokens"],
                                     kw["temperature"], 7, eos)
    assert torch.equal(s.completion_ids, ref_ids)
    assert torch.equal(s.completion_mask, ref_mask)
    lengths = s.completion_mask.sum(1)
    assert lengths.min() < lengths.max()  # the test really exercised per-row stopping


def test_greedy_equals_hf_generate_on_ragged_batch(tiny):
    model, tok = tiny
    prompts = ragged_prompts(tok)
    n = 20
    ours = agents.sample(model, tok, prompts, max_new_tokens=n, temperature=0)
    enc = tok(prompts, padding=True, padding_side="left", return_tensors="pt")
    ref = model.generate(**enc, do_sample=False, max_new_tokens=n, pad_token_id=tok.pad_token_id)
    assert torch.equal(ours.completion_ids, ref[:, enc["input_ids"].shape[1]:])


def test_greedy_with_early_eos_equals_hf_generate(tiny):
    model, tok = tiny
    prompts = ragged_prompts(tok)
    eos = int(greedy_ids(model, tok, prompts, 6)[1, 3])  # row 1 emits it at step 3 (maybe earlier)
    ours = agents.sample(model, tok, prompts, max_new_tokens=16, temperature=0, eos_token_ids=[eos])
    enc = tok(prompts, padding=True, padding_side="left", return_tensors="pt")
    ref = model.generate(**enc, do_sample=False, max_new_tokens=16, eos_token_id=eos, pad_token_id=tok.pad_token_id)
    assert torch.equal(ours.completion_ids, ref[:, enc["input_ids"].shape[1]:])


# ----------------------------------------------------------------------------------------- group sampling

def test_first_tokens_after_shared_prefill_are_independent(tiny):
    model, tok = tiny
    s = agents.sample(model, tok, ragged_prompts(tok)[:1], group_size=64, max_new_tokens=1, temperature=5.0, seed=0)
    # One prefill, 64 rows: broadcasting one draw would give a single distinct token.
    assert len(set(s.completion_ids[:, 0].tolist())) > 16


def test_group_rows_are_laid_out_prompt_major(tiny):
    model, tok = tiny
    prompts = ragged_prompts(tok)
    s = agents.sample(model, tok, prompts, group_size=2, max_new_tokens=2, seed=0)
    enc = tok(prompts, padding=True, padding_side="left", return_tensors="pt")
    assert torch.equal(s.prompt_ids, enc["input_ids"].repeat_interleave(2, 0))  # row i*G+g = prompt i
    assert torch.equal(s.prompt_mask, enc["attention_mask"].repeat_interleave(2, 0))
    assert len(s.texts) == 6


# ----------------------------------------------------------------------------------------- reproducibility

def test_same_seed_same_output(tiny):
    model, tok = tiny
    a = agents.sample(model, tok, ragged_prompts(tok), group_size=2, max_new_tokens=12, seed=3)
    b = agents.sample(model, tok, ragged_prompts(tok), group_size=2, max_new_tokens=12, seed=3)
    assert torch.equal(a.completion_ids, b.completion_ids) and a.texts == b.texts


def test_different_seed_different_output(tiny):
    model, tok = tiny
    a = agents.sample(model, tok, ragged_prompts(tok), group_size=2, max_new_tokens=12, seed=3)
    b = agents.sample(model, tok, ragged_prompts(tok), group_size=2, max_new_tokens=12, seed=4)
    assert not torch.equal(a.completion_ids, b.completion_ids)


def test_generator_argument_equals_seed(tiny):
    model, tok = tiny
    a = agents.sample(model, tok, ragged_prompts(tok), max_new_tokens=8, seed=11)
    b = agents.sample(model, tok, ragged_prompts(tok), max_new_tokens=8, generator=torch.Generator().manual_seed(11))
    assert torch.equal(a.completion_ids, b.completion_ids)


def test_global_torch_seed_reproduces_unseeded_calls(tiny):
    model, tok = tiny
    torch.manual_seed(5)
    a = agents.sample(model, tok, ragged_prompts(tok), max_new_tokens=8)
    torch.manual_seed(5)
    b = agents.sample(model, tok, ragged_prompts(tok), max_new_tokens=8)
    assert torch.equal(a.completion_ids, b.completion_ids)


# ------------------------------------------------------------------------------------ stopping and masks

def test_max_new_tokens_is_respected(tiny):
    model, tok = tiny
    s = agents.sample(model, tok, ragged_prompts(tok), group_size=2, max_new_tokens=9, eos_token_ids=(), seed=0)
    assert s.completion_ids.shape == (6, 9) and bool(s.completion_mask.all())


def test_eos_ends_row_and_mask_includes_eos(tiny):
    model, tok = tiny
    prompts = ragged_prompts(tok)
    free = greedy_ids(model, tok, prompts, 12)
    eos = int(free[0, 4])
    stop_at = int((free[0] == eos).nonzero()[0])  # first time row 0 emits it (<= 4)
    s = agents.sample(model, tok, prompts, max_new_tokens=12, temperature=0, eos_token_ids=[eos])
    row, m = s.completion_ids[0], s.completion_mask[0]
    assert row[stop_at] == eos
    assert m[: stop_at + 1].tolist() == [1] * (stop_at + 1)  # up to and including EOS
    assert not m[stop_at + 1:].any() and (row[stop_at + 1:] == tok.pad_token_id).all()
    assert s.texts[0] == tok.decode(free[0, :stop_at])  # the text leaves the EOS token out


def test_mask_keeps_eos_when_pad_equals_eos(tiny, tiny_model_dir):
    model, _ = tiny
    _, tok = agents.load_model(tiny_model_dir, device="cpu", dtype="float32")
    prompts = ragged_prompts(tok)
    eos = int(greedy_ids(model, tok, prompts, 6)[0, 2])
    tok.pad_token = tok.convert_ids_to_tokens(eos)  # pad == eos: the classic way to lose the EOS token
    s = agents.sample(model, tok, prompts, max_new_tokens=10, temperature=0, eos_token_ids=[eos])
    first = int((s.completion_ids[0] == eos).nonzero()[0])
    assert s.completion_mask[0].tolist() == [1] * (first + 1) + [0] * (s.completion_ids.shape[1] - first - 1)


def test_stop_strings(tiny):
    model, tok = tiny
    prompts = ragged_prompts(tok)[:1]
    free = agents.sample(model, tok, prompts, max_new_tokens=16, temperature=0, eos_token_ids=())
    full = free.texts[0]
    # A plain-ASCII string the model writes in the middle of its completion (random byte-level tokens also
    # decode to U+FFFD pieces, which would make a fragile stop string).
    stop = next(full[i:i + 2] for i in range(6, len(full) - 1) if full[i:i + 2].isascii() and full[i:i + 2].strip())
    cut = full.find(stop)
    s = agents.sample(model, tok, prompts, max_new_tokens=16, temperature=0, eos_token_ids=(), stop=[stop])
    assert s.texts[0] == full[:cut]  # cut before the stop string
    n = int(s.completion_mask[0].sum())
    assert s.completion_ids.shape[1] == n < 16  # the row ended there, not at the token cap
    assert stop in tok.decode(s.completion_ids[0, :n]) and stop not in tok.decode(s.completion_ids[0, : n - 1])
    kept = agents.sample(model, tok, prompts, max_new_tokens=16, temperature=0, eos_token_ids=(), stop=[stop],
                         keep_stop=True)
    assert kept.texts[0].startswith(full[:cut] + stop)


def test_stop_strings_end_each_row_of_a_group_at_its_own_token(tiny):
    # Sampled rows ending by EOS, by a stop string or at the cap: each row is the same draw as without stop strings,
    # cut after the first token whose text completes one (the host-side matching must keep the rows apart).
    model, tok = tiny
    kw = dict(group_size=3, max_new_tokens=24, temperature=1.0, seed=5, eos_token_ids=list(range(3, 23)))
    free = agents.sample(model, tok, ragged_prompts(tok), **kw)
    stop = ["i", "thon"]
    s = agents.sample(model, tok, ragged_prompts(tok), stop=stop, **kw)
    lengths = free.completion_mask.sum(1).tolist()
    ends = [next((t + 1 for t in range(n) if any(x in tok.decode(row[:t + 1]) for x in stop)), n)
            for row, n in zip(free.completion_ids, lengths)]
    assert s.completion_mask.sum(1).tolist() == ends and s.completion_ids.shape[1] == max(ends)
    assert all(torch.equal(s.completion_ids[i, :e], free.completion_ids[i, :e]) for i, e in enumerate(ends))
    assert sum(e < n for e, n in zip(ends, lengths)) >= 2 and len(set(ends)) >= 3  # the stops did cut, unevenly


def test_stops_early_when_every_row_is_done(tiny):
    model, tok = tiny
    s = agents.sample(model, tok, ragged_prompts(tok), group_size=2, max_new_tokens=50,
                      eos_token_ids=list(range(tok.vocab_size)), seed=0)  # every token ends its row
    assert s.completion_ids.shape == (6, 1) and bool(s.completion_mask.all())
    assert s.texts == [""] * 6


# ------------------------------------------------------------------------------- dropping finished rows

def decode_batch_sizes(monkeypatch):
    """Spy on the rows fed to the model at each decode step (a list that fills as `sample` runs)."""
    sizes, real = [], agents.decode_one_token
    monkeypatch.setattr(agents, "decode_one_token", lambda model, fwd, token, *a: sizes.append(len(token)) or
                        real(model, fwd, token, *a))
    return sizes


def same_samples(a, b):
    return (torch.equal(a.completion_ids, b.completion_ids) and torch.equal(a.completion_mask, b.completion_mask)
            and a.texts == b.texts and a.truncated == b.truncated)


@pytest.mark.parametrize("case", ["one generator", "a generator per prompt", "unpadded"])
def test_dropping_finished_rows_samples_the_same_tokens(tiny, monkeypatch, case):
    # Rows leave the decode batch as they end (EOS is 10% of the vocabulary), yet each row keeps its own draws.
    model, tok = tiny
    prompts = ragged_prompts(tok)[1:2] if case == "unpadded" else ragged_prompts(tok)  # one prompt: no mask at all
    G = 6 if case == "unpadded" else 3
    gens = lambda: ([torch.Generator().manual_seed(i) for i in range(len(prompts))]  # noqa: E731
                    if case == "a generator per prompt" else torch.Generator().manual_seed(7))
    kw = dict(group_size=G, max_new_tokens=40, temperature=1.0, eos_token_ids=list(range(3, 43)))
    sizes = decode_batch_sizes(monkeypatch)
    kept = agents.sample(model, tok, prompts, generator=gens(), drop_finished=False, **kw)
    assert set(sizes) == {len(prompts) * G}
    sizes.clear()
    dropped = agents.sample(model, tok, prompts, generator=gens(), **kw)
    assert same_samples(dropped, kept)
    assert min(sizes) < len(prompts) * G and len(set(sizes)) >= 3  # rows really left the batch, more than once


def test_greedy_with_dropped_rows_equals_hf_generate(tiny, monkeypatch):
    model, tok = tiny
    prompts = ragged_prompts(tok)
    eos = int(greedy_ids(model, tok, prompts, 6)[1, 3])  # row 1 emits it at step 3 (maybe earlier)
    sizes = decode_batch_sizes(monkeypatch)
    ours = agents.sample(model, tok, prompts, max_new_tokens=16, temperature=0, eos_token_ids=[eos])
    enc = tok(prompts, padding=True, padding_side="left", return_tensors="pt")
    ref = model.generate(**enc, do_sample=False, max_new_tokens=16, eos_token_id=eos, pad_token_id=tok.pad_token_id)
    assert torch.equal(ours.completion_ids, ref[:, enc["input_ids"].shape[1]:])
    assert sizes[0] == 3 and min(sizes) < 3  # the early row was dropped


def test_dropping_finished_rows_keeps_stop_strings_exact(tiny, monkeypatch):
    model, tok = tiny
    kw = dict(group_size=3, max_new_tokens=24, temperature=1.0, seed=5, eos_token_ids=list(range(3, 23)),
              stop=["i", "thon"])
    kept = agents.sample(model, tok, ragged_prompts(tok), drop_finished=False, **kw)
    sizes = decode_batch_sizes(monkeypatch)
    dropped = agents.sample(model, tok, ragged_prompts(tok), **kw)
    assert same_samples(dropped, kept)
    assert min(sizes) < 9 and len(set(sizes)) >= 3


# -------------------------------------------------------------------------------------- token selection

def test_sample_token_draws_from_the_softmax():
    # The exponential race must reproduce p: 40k draws of a 4-way distribution, each frequency within 1%.
    p = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = p.log().expand(40000, 4)
    draws = agents.sample_token(logits, temperature=1.0, generator=torch.Generator().manual_seed(0))
    freq = torch.bincount(draws, minlength=4).float() / 40000
    assert torch.allclose(freq, p, atol=0.01)


def test_sample_token_at_temperature_2_draws_from_the_tempered_softmax():
    # At T = 2 the draws must follow softmax(logits / 2) = p^(1/2) renormalised, not p: a sampler that ignored T
    # would pass the T = 1 test above but not this one (0.5 vs 0.37 on the first outcome).
    p = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = p.log().expand(40000, 4)
    draws = agents.sample_token(logits, temperature=2.0, generator=torch.Generator().manual_seed(0))
    freq = torch.bincount(draws, minlength=4).float() / 40000
    want = torch.softmax(p.log() / 2.0, -1)
    assert torch.allclose(freq, want, atol=0.01) and not torch.allclose(freq, p, atol=0.05)


# -------------------------------------------------------------------------------------------- interface

@pytest.mark.parametrize("kwargs", [dict(prompts=[]), dict(prompts=[""]), dict(group_size=0),
                                    dict(max_new_tokens=0), dict(temperature=-1.0)])
def test_bad_input_is_a_clear_error(tiny, kwargs):
    model, tok = tiny
    args = dict(prompts=["hello"], group_size=1, max_new_tokens=4)
    args.update(kwargs)
    with pytest.raises(ValueError):
        agents.sample(model, tok, **args)


def test_training_mode_is_restored(tiny):
    model, tok = tiny
    model.train()
    try:
        agents.sample(model, tok, ["hello"], max_new_tokens=2, seed=0)
        assert model.training and all(m.training for m in model.modules())
    finally:
        model.eval()


def test_chat_prompt_opens_the_assistant_turn(tiny):
    _, tok = tiny
    text = agents.chat_prompt(tok, "SYS", "USER")
    assert "SYS" in text and "USER" in text and text.endswith("<|im_start|>assistant\n")


# ---------------------------------------------------------------------------------------------- real model

@pytest.mark.slow
def test_real_model_greedy_equals_hf_generate():
    real, where = real_model_dir(build=True)
    if real is None:
        pytest.skip(where)
    model, tok = agents.load_model(real, device="cpu")
    users = ["Write a Python function that reverses a string.", "What is a list comprehension?",
             "Write a function to check whether a number is prime, with a docstring and two examples.", "Hi"]
    prompts = [agents.chat_prompt(tok, "You are a helpful coding assistant.", u) for u in users]
    ours = agents.sample(model, tok, prompts, max_new_tokens=48, temperature=0)
    enc = tok(prompts, padding=True, padding_side="left", return_tensors="pt")
    ref = model.generate(**enc, do_sample=False, max_new_tokens=48)
    assert torch.equal(ours.completion_ids, ref[:, enc["input_ids"].shape[1]:])


# ---------------------------------------------------------------------------------------------- memory

def test_sampling_with_a_frozen_head_never_copies_the_output_layer(tiny_model_dir):
    # The ~20 GB evaluation peak: with a LoRA adapter loaded the base is frozen, and the model's own logits_to_keep
    # path ran the head as a batched matmul over an (n, H, V) expanded view of its weight, which bmm copies in bf16 (one
    # copy per prompt; the copy itself happens inside the kernel). The bound: no tensor or view made while sampling is
    # larger than the head's weight (these prompts' activations and KV cache are far below it).
    from torch.utils._python_dispatch import TorchDispatchMode

    import grpo

    model, tok = agents.load_model(tiny_model_dir, device="cpu", dtype="float32")
    grpo.add_lora(model, "coder")  # freezes every base weight, the head included
    largest = []

    class Largest(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            largest.extend(t.numel() for t in (out if isinstance(out, (tuple, list)) else [out])
                           if isinstance(t, torch.Tensor))
            return out

    prompts = [agents.chat_prompt(tok, "You write Python.", u) for u in ("hi", "sort a list", "add", "min")]
    with Largest():
        agents.sample(model, tok, prompts, group_size=2, max_new_tokens=4, temperature=1.0, seed=0)
    assert max(largest) <= model.get_output_embeddings().weight.numel()


# ---------------------------------------------------------------------------------------------- attention

def test_packed_gqa_decode_step_equals_sdpa_over_repeated_kv_heads():
    # What transformers <= 5.17 ran for a padded decode step (K/V repeated per query head), against ours (no copy).
    import types

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(*shape, generator=g) for shape in [(3, 4, 1, 8), (3, 2, 10, 8), (3, 2, 10, 8)])
    mask = torch.arange(10)[None, None, None, :] >= torch.tensor([0, 3, 6])[:, None, None, None]  # (3, 1, 1, 10)
    ours, _ = agents._sdpa_packed_gqa(types.SimpleNamespace(num_key_value_groups=2, is_causal=True), q, k, v, mask,
                                      scaling=0.3)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1),
                                                           attn_mask=mask, scale=0.3).transpose(1, 2)  # (3, 1, 4, 8)
    assert ours.shape == ref.shape and torch.allclose(ours, ref, atol=1e-6)


def test_loaded_models_sample_what_transformers_sdpa_samples(tiny):
    # load_model switches the model to PACKED_SDPA; the tokens sampled (T = 1, one seed) equal stock SDPA's on a
    # padded batch (the packed path is the one that runs there: GQA, one query per row, a mask).
    model, tok = tiny
    prompts = ragged_prompts(tok)
    kw = dict(group_size=2, max_new_tokens=12, temperature=1.0, seed=3, eos_token_ids=())
    assert model.config._attn_implementation == agents.PACKED_SDPA
    packed = agents.sample(model, tok, prompts, **kw)
    model.set_attn_implementation("sdpa")
    try:
        stock = agents.sample(model, tok, prompts, **kw)
    finally:
        model.set_attn_implementation(agents.PACKED_SDPA)
    assert torch.equal(packed.completion_ids, stock.completion_ids)
