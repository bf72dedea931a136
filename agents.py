"""Agents: load a causal LM, sample from it with a KV cache, and prompt it in the roles of the
CoRe-Code team.

Sections, in reading order:
  1. Loading: `load_model`, a local HF model directory or a hub id -> (model, tokenizer).
  2. Sampling: `sample`, a batched KV-cache sampler in gpt-fast's shape (prefill, decode_one_token,
     decode_n_tokens): each prompt is prefilled once and its cache copied to its G group rows; all
     rows decode together (per-row stops, temperature, seeded generators). Two
     speed paths stand beside it, each with its benchmark figure: PACKED_SDPA and DROP_AT.
  3. Roles: the prompt of each role (the Planner's one prompt, Coder, CoT, SCoT, repair; MapCoder's
     Retriever, Planner and Debugger; the reference planner, which writes a plan from the solution).
  4. Extraction: completion -> plan (`clean_plan`) and its gate label (`gate_label`), program
     (`extract_code`), retrieval, confidence.
  5. Chains: a `Team` of agents, `run_chain` (roles one after another, one `sample` call per role),
     Reflexion and MapCoder's loops on public tests, `problem_job`, and the role table `ROLES`, a
     dict of `Role` records.

Not a serving engine (no continuous batching, paged attention or beam search), never a loss or a
gradient (sampling runs under torch.no_grad() inside `sample`, never as a decorator, so the model
stays trainable), never scoring and not the evaluation methods (evaluate.py holds them and runs
hidden tests; Reflexion and MapCoder here run programs on PUBLIC tests only).

References (read, not copied): gpt-fast (prefill / decode_one_token / decode_n_tokens, the
exponential-race draw); HF `generate` (left padding, position ids = cumsum(mask) - 1; our greedy
output is tested equal to it); nanoGPT; Structured CoT (Li et al. 2023); Reflexion (Shinn et al.
2023); MapCoder (Islam et al. 2024); MBPP's wording "Your code should pass these tests" (Austin et
al. 2021). The CoRe-Code paper's prompts are not available: all are ours.
"""
import ast
import builtins
import contextlib
import dataclasses
import inspect
import itertools
import json
import os
import re
import socket
import sys
import textwrap
import urllib.parse
from dataclasses import dataclass, field

import torch

import grpo

# --------------------------------------------------------------------------------------------------
# 1. Loading: a local HF model directory or a hub id -> (model, tokenizer) in eval mode, with one
#    clear error line when the path is wrong. bf16 on CUDA and on CPUs that compute it natively,
#    else fp32.

# Accepted spellings of --dtype; "auto" means the device default chosen in `resolve_dtype`.
DTYPES = {
    "float32": torch.float32, "fp32": torch.float32,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16,
}

# A hub id is "name" or "org/name" made of word characters, dots and dashes. Anything else (a
# leading "/", "./", "~", several slashes) is a local path, and a missing local path fails at once
# rather than ask the hub.
_HUB_ID = re.compile(r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)?$")

# The model both scripts use when neither --model nor CORECODE_MODEL names one (the paper's smallest
# family member that runs on a laptop; transformers downloads it, ~1 GB, into its cache on first
# use).
DEFAULT_MODEL = "Qwen/Qwen2.5-Coder-0.5B-Instruct"

_WHAT_TO_PASS = ("pass --model DIR or CORECODE_MODEL=DIR, a local Hugging Face model directory "
                 "(config.json, weights and tokenizer files), or a hub id such as "
                 "Qwen/Qwen2.5-Coder-0.5B-Instruct")

# How long the reachability probe of the hub waits (our choice: a second or three tells a machine
# without a network from one with; the hub client itself retries for ~50 s before it gives up).
HUB_PROBE_TIMEOUT_S = 3.0


def cpu_has_native_bf16():
    """True when this CPU computes bf16 natively (x86 avx512_bf16 / AMX-BF16, read from
    /proc/cpuinfo on Linux); elsewhere bf16 is emulated, slower than fp32."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:  # not Linux: no cheap way to know, so no
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def resolve_dtype(dtype, device):
    """None / 'auto' -> bf16 on CUDA (fp16 if the GPU lacks bf16); on CPU bf16 where the processor
    computes it natively (cpu_has_native_bf16), else fp32; or parse a name.

    our choice on CPU: measured on a 2-core avx512_bf16 CPU, the 0.5B model decodes 2.5-4x faster in
    bf16 than in fp32 with the same greedy text; without native bf16 the emulation is slower than
    fp32, so fp32 there. Tests that compare numbers exactly pin float32.
    """
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype is None or dtype == "auto":
        if str(device).startswith("cuda"):
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.bfloat16 if str(device).startswith("cpu") and cpu_has_native_bf16() else torch.float32
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}: use one of {', '.join(DTYPES)} or auto")
    return DTYPES[dtype]


def check_model(name_or_path):
    """Say at once whether `name_or_path` can be loaded, before a run prints or creates anything.
    Returns local_files_only for from_pretrained: True for a cached hub id when the hub cannot be
    reached (or HF_HUB_OFFLINE=1), so the hub client does not spend ~50 s on retries. Raises
    FileNotFoundError / ValueError with one line saying what to pass: a missing path, a file, a
    directory without config.json, or a hub id that is neither cached nor reachable (checked in
    seconds: HUB_PROBE_TIMEOUT_S)."""
    path = os.path.expanduser(str(name_or_path))
    if os.path.exists(path) or not _HUB_ID.match(path):  # a local path
        if not os.path.exists(path):
            raise FileNotFoundError(f"model not found: {path!r} does not exist; {_WHAT_TO_PASS}")
        if not os.path.isdir(path):
            raise ValueError(f"model path {path!r} is a file, not a directory; {_WHAT_TO_PASS}")
        if not os.path.isfile(os.path.join(path, "config.json")):
            raise ValueError(f"model directory {path!r} has no config.json; {_WHAT_TO_PASS}")
        return False
    from huggingface_hub import try_to_load_from_cache

    if os.environ.get("HF_HUB_OFFLINE") == "1" or not _hub_reachable():
        if not isinstance(try_to_load_from_cache(path, "config.json"), str):  # not cached
            raise ValueError(f"model {path!r} is not in the local Hugging Face cache and the hub "
                             f"cannot be reached: {_WHAT_TO_PASS.split(', or a hub id')[0]}")
        return True
    return False


def _hub_reachable():
    """A TCP connection to the hub's host (HF_ENDPOINT, default huggingface.co) within
    HUB_PROBE_TIMEOUT_S."""
    url = urllib.parse.urlsplit(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    try:
        socket.create_connection((url.hostname, url.port or (443 if url.scheme == "https" else 80)),
                                 timeout=HUB_PROBE_TIMEOUT_S).close()
        return True
    except OSError:
        return False


# Speed path: the attention every loaded model runs (load_model), transformers' SDPA with a decode
# step that never copies the KV cache (`_sdpa_packed_gqa`). tests/bench/bench_sampler.py --parts
# attn measures one layer's padded decode attention at the 0.5B's head layout, B=64, L=1024, bf16:
# 748 ms with K/V repeated for every query head, 44 ms packed (README, Benchmarks).
PACKED_SDPA = "sdpa_packed_gqa"


def _sdpa_packed_gqa(module, query, key, value, attention_mask, **kwargs):
    """transformers' SDPA attention, except one decode step (one query per row) with a mask under
    grouped-query attention. transformers up to 5.17 gives SDPA `enable_gqa` only without a mask
    (CUDA's fused kernels refuse the two together) and otherwise repeats each KV head's keys and
    values for its query heads: a copy of the whole KV cache per layer per step as soon as one
    prompt is padded (~13 ms a step at B = 256, L = 1024 on an H200). Here a KV head's query heads
    become its rows (as later transformers do): the same attention, no copy (PACKED_SDPA's figures).
    query (B, H, 1, d), key / value (B, KV, L, d) -> ((B, 1, H, d), None)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    B, H, n_query, d = query.shape
    groups = H // key.shape[1]
    if n_query != 1 or groups == 1 or attention_mask is None or kwargs.get("position_bias") is not None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    # (B, KV, G, d): a KV head's query heads as its G rows
    q = query.reshape(B, H // groups, groups, d)
    # out (B, KV, G, d)
    out = torch.nn.functional.scaled_dot_product_attention(q, key, value, attn_mask=attention_mask,
                                                           dropout_p=kwargs.get("dropout", 0.0),
                                                           scale=kwargs.get("scaling"))
    return out.reshape(B, 1, H, d), None


def load_model(name_or_path, device=None, dtype=None):
    """Load (model, tokenizer) from a local HF directory or a hub id, in eval mode on `device`
    (None: cuda if visible, else cpu; MPS is untested). Errors are one line saying what to pass
    instead: FileNotFoundError for a missing local path, ValueError for the rest (see check_model;
    then broken weights or tokenizer files)."""
    import transformers
    from safetensors import SafetensorError
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = os.path.expanduser(str(name_or_path))
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    offline = check_model(path)
    # In a log file transformers' "Loading weights" bar is one 5 KB line of redraws.
    if not sys.stderr.isatty():
        transformers.utils.logging.disable_progress_bar()
    torch_dtype = resolve_dtype(dtype, device)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=offline)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype, local_files_only=offline)
    # What a corrupt or absent checkpoint raises in transformers / huggingface_hub (their errors
    # subclass these) and safetensors (its own class); turn it into one line and keep the cause
    # chained.
    except (OSError, ValueError, KeyError, RuntimeError, ImportError, SafetensorError) as e:
        first_line = (str(e).strip().splitlines() or [type(e).__name__])[0]
        where = "directory" if os.path.exists(path) else "hub id"
        raise ValueError(f"could not load model {where} {path!r}: {first_line}; {_WHAT_TO_PASS}") from e
    # Some tokenizers ship without a pad token. Reusing EOS is safe here because `sample` derives
    # the completion mask from its own "finished" state, never by comparing tokens with the pad id.
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    # Decoder-only generation needs left padding so that every row's last prompt token is at the
    # end.
    tokenizer.padding_side = "left"
    # SDPA's masks with our attention (not eager / flash ones).
    if model.config._attn_implementation == "sdpa":
        transformers.AttentionInterface.register(PACKED_SDPA, _sdpa_packed_gqa)
        transformers.masking_utils.AttentionMaskInterface.register(PACKED_SDPA, transformers.masking_utils.sdpa_mask)
        model.set_attn_implementation(PACKED_SDPA)
    model.to(device).eval()
    return model, tokenizer


# --------------------------------------------------------------------------------------------------
# 2. Sampling. Token choice is a pure function of the logits (`sample_token`); the model side
#    follows gpt-fast: prefill once per prompt, expand the cache to the group, decode n tokens one at
#    a time. No top-k or top-p: GRPO's loss takes the log-probs of softmax(logits / T), so the
#    tokens must be drawn from exactly that distribution (a filter would make them disagree).

def sample_token(logits, temperature=1.0, generator=None, rows=None, batch=None):
    """Pick one token per row from (B, V) logits -> (B,) int64. temperature == 0 is greedy (argmax).

    The draw is the exponential race argmax(p / q), q ~ Exp(1) i.i.d.: exactly a sample from p, with
    no host sync on CUDA. Each row gets its own q, so the rows of a GRPO group draw independently.
    generator: one, or a list with one per equal block of rows (per prompt: its draws then do not
    depend on the other prompts in the batch, which data-parallel training relies on).
    rows, batch: when the logits hold only rows `rows` (b,) of a batch of `batch` (the sampler drops
    finished rows), q is still drawn for the whole batch, in the same calls, and only these rows'
    part is used: every row then gets the same random numbers whichever other rows are still
    decoding.
    """
    if temperature == 0:
        return logits.argmax(dim=-1)
    probs = torch.softmax(logits.float() / temperature, dim=-1)  # (b, V)
    B, V = (probs.shape[0] if rows is None else batch), probs.shape[1]
    if isinstance(generator, (list, tuple)):
        per = B // len(generator)
        # (B, V)
        q = torch.cat([probs.new_empty(per, V).exponential_(1.0, generator=g) for g in generator])
    else:
        q = probs.new_empty(B, V).exponential_(1.0, generator=generator)  # (B, V)
    return (probs / (q if rows is None else q[rows])).argmax(dim=-1)


@dataclass
class Samples:
    """What `sample` returns. B = n_prompts * G, row i*G+g is sample g of prompt i; T steps."""
    prompt_ids: torch.Tensor       # (B, P) left-padded prompts
    prompt_mask: torch.Tensor      # (B, P) 1 on prompt tokens, 0 on left padding
    completion_ids: torch.Tensor   # (B, T) generated tokens, right-padded with the pad id
    completion_mask: torch.Tensor  # (B, T) 1 on generated tokens INCLUDING the EOS token, 0 after
    # B decoded completions (no EOS; no stop string unless keep_stop)
    texts: list = field(default_factory=list)
    # B bools: the row reached its token limit, max_new_tokens (no EOS, no stop string)
    truncated: list = field(default_factory=list)


def _forward_kwargs(model, cache):
    """The decoder body's forward keywords for the cache: past_key_values in transformers 5.0-5.2x,
    cache later (the old name is then deprecated). Passing the wrong one is silent: it lands in
    **kwargs and the cache is ignored."""
    key = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    return {key: cache, "use_cache": True}


def _last_logits(model, fwd, input_ids, attention_mask, position_ids):
    """One forward through the cache; each row's next-token logits in float32. (B, S) -> (B, V).

    The decoder body, then the output layer on each row's last hidden state as a (B, H) matrix: one
    matmul. Not the model's own forward with logits_to_keep=1: that hands the head a strided
    (B, 1, H) slice, which torch's matmul does not fold into one matmul when the head weight does
    not require grad (a frozen base, i.e. whenever a LoRA adapter is loaded); it runs a batched
    matmul over a (B, H, V) COPY of the weight instead: B x 272 MB on the 0.5B in bf16, the ~20 GB
    peak of evaluation at batch 64 with an adapter (tests/test_sampler.py, allocation bound)."""
    hidden = model.base_model(input_ids=input_ids, attention_mask=attention_mask,
                              position_ids=position_ids, **fwd).last_hidden_state[:, -1]  # (B, H)
    return model.get_output_embeddings()(hidden).float()  # (B, V)


def prefill(model, fwd, prompt_ids, prompt_mask):
    """Run the n distinct prompts once, filling the cache in `fwd`. (n, P) -> next logits (n, V)."""
    # Position of each real token = how many real tokens precede it; pads get 0 (masked anyway).
    position_ids = (prompt_mask.cumsum(-1) - 1).clamp(min=0)  # (n, P)
    return _last_logits(model, fwd, prompt_ids, prompt_mask, position_ids)


def decode_one_token(model, fwd, token, attention_mask, position_ids):
    """Feed one token per row: token (B,), attention_mask (B, P+t+1), positions (B,) -> (B, V)."""
    return _last_logits(model, fwd, token[:, None], attention_mask, position_ids[:, None])


# Speed path: finished rows leave the decode batch (decode_n_tokens: KV cache, mask, positions,
# logits); the returned (B, T) still give them pad / mask 0 and `sample_token` still draws their
# noise, so the tokens are exactly those of decoding every row, as HF generate does (it feeds
# finished rows pad tokens, compute thrown away). tests/bench/bench_sampler.py --parts drop measures
# one Planner-stage rollout on the 0.5B: the Coder call 708.7 -> 603.5 s, the Planner's 410.8 ->
# 401.5 s (README, Benchmarks). our choice: rows leave once an eighth of the batch has finished. On
# the 0.5B (fp32, 2 CPU threads) a drop (a copy of the KV cache) costs ~0.23 s and a decode step
# ~1.7 s + 0.035 s per row, so a dropped row pays for its copy within ~7 steps; replaying a
# rollout's row lengths with these costs, 1/8 is within 1% of dropping each row as it ends (coder
# 1.22x, planner 1.04x) with half the copies (1/4: 1.21x, 1/2: 1.18x).
DROP_AT = 0.125


def decode_n_tokens(model, fwd, tokenizer, logits, full_mask, positions, n_prompt, max_new_tokens,
                    eos_ids, pad_id, stop, temperature, generator, progress=None, drop_at=DROP_AT):
    """The decode loop: from the first logits (B, V), up to max_new_tokens steps -> ids, mask (B,T).
    full_mask (B, P + N): the prompt mask then ones (None: nothing is padded); step t attends to a
    view of its first P + t + 1 columns. drop_at: the share of finished rows at which they leave the
    decode batch (DROP_AT; None: never). The host reads each step's tokens (`_to_host`) once the
    next step is queued: the one source of which rows still run (EOS, stop strings, rows to drop).
    """
    B, device = logits.shape[0], logits.device
    cache = fwd.get("cache", fwd.get("past_key_values"))
    rows = torch.arange(B)  # (b,) the decode batch's rows on the host (b = B until rows leave)
    rows_dev = rows.to(device)  # (b,) the same on the model's device
    ids = torch.full((B, max_new_tokens), pad_id, dtype=torch.long, device=device)  # (B, N)
    mask = torch.zeros((B, max_new_tokens), dtype=torch.long, device=device)  # (B, N)
    finished = torch.zeros(B, dtype=torch.bool, device=device)  # (B,)
    # Step-major, so each step's copy is one contiguous row; pinned on CUDA, so it does not block.
    host_ids = torch.full((max_new_tokens, B), pad_id, dtype=torch.long, pin_memory=logits.is_cuda)
    running = torch.ones(B, dtype=torch.bool)  # (B,) the host's ~finished
    eos_host = eos_ids.cpu()  # (E,)
    # A token adds >= 1 character except for partial UTF-8 bytes, so 4 tokens per character of the
    # longest stop string (+ slack) always cover a stop string that ends in the newest token.
    window = 4 * max(map(len, stop), default=0) + 4
    for t in range(max_new_tokens):
        token = sample_token(logits, temperature, generator, rows_dev if len(rows) < B else None, B)
        if len(rows) < B:  # (b,) -> (B,): the dropped rows are finished, they get pad below
            token = torch.full((B,), pad_id, device=device).index_copy_(0, rows_dev, token)  # (B,)
        # The mask is "this row was still running when it produced this token", so it includes the
        # EOS token itself; it is never recomputed from the pad id (pad == eos is common).
        alive = ~finished  # (B,)
        token = torch.where(alive, token, pad_id)  # (B,) finished rows only ever emit pad
        ids[:, t], mask[:, t] = token, alive
        finished |= torch.isin(token, eos_ids)
        copied = _to_host(host_ids[t], token)
        if t + 1 == max_new_tokens:
            break
        if progress is not None and (t + 1) % 16 == 0:
            progress(t + 1, max_new_tokens)
        step_mask = None if full_mask is None else full_mask[:, : n_prompt + t + 1]  # (b, P+t+1)
        step_token = token if len(rows) == B else token[rows_dev]  # (b,)
        logits = decode_one_token(model, fwd, step_token, step_mask, positions)  # (b, V), queued
        positions = positions + 1
        if copied is not None:
            copied.synchronize()  # this step's tokens; the queued forward keeps the device busy
        running &= ~torch.isin(host_ids[t], eos_host)
        hit = _hit_stop(tokenizer, host_ids, running, t, window, stop) if stop else None  # (B,)
        if hit is not None and hit.any():  # once per row at most: the one host-to-device write
            running &= ~hit
            finished |= hit.to(device, non_blocking=True)
        live = running[rows]  # (b,) host
        if not live.any():
            break
        # The DROP_AT speed path: finished rows leave every tensor that has one row per decode row.
        if drop_at is not None and len(rows) - int(live.sum()) >= max(1, drop_at * len(rows)):
            keep, rows = live.nonzero()[:, 0], rows[live]  # (b',) old batch places, (b',) rows
            keep, rows_dev = keep.to(device, non_blocking=True), rows.to(device, non_blocking=True)
            cache.batch_select_indices(keep)
            logits, positions = logits[keep], positions[keep]  # (b', V), (b',)
            full_mask = None if full_mask is None else full_mask[keep]  # (b', P+N)
    T = int(mask.any(0).sum())  # each row runs in a prefix of the steps, so all rows together do
    return ids[:, :T], mask[:, :T]


def _to_host(dst, src):
    """Copy device tensor `src` into host tensor `dst` (pinned on CUDA) without blocking the host.
    Returns the event to wait on before reading dst, or None where the copy is already done (a CPU).

    Speed path: on a GPU a decode step is bound by kernel launches, so the host queues the next step
    while the device runs this one and never waits for a step whose successor it has not queued; a
    blocking copy (`.cpu()`) would wait for the step just queued. Not measured on its own:
    tests/test_gpu_paths.py checks only that the decode loop makes no blocking read.
    The event is recorded on the stream the copy ran on, the current stream of src's device:
    `Event.record()` without a stream records on the current DEVICE's stream, which with --device
    cuda:1 outside torchrun is cuda:0's: it would not wait for the copy, and the host could read the
    buffer's fill value (pad, often an EOS id: rows wrongly finished)."""
    dst.copy_(src, non_blocking=src.device.type == "cuda")
    if src.device.type != "cuda":
        return None
    done = torch.cuda.Event()
    done.record(torch.cuda.current_stream(src.device))
    return done


def _hit_stop(tokenizer, host_ids, running, t, window, stop):
    """(B,) bool on the host: running rows whose decoded tail (their last `window` tokens up to
    step t) contains a stop string. host_ids (N, B) and running (B,) are host tensors: nothing here
    touches the device."""
    rows = running.nonzero().flatten()
    tails = tokenizer.batch_decode(host_ids[max(0, t + 1 - window): t + 1, rows].T.tolist()) if len(rows) else []
    hit = torch.zeros_like(running)
    hit[rows] = torch.tensor([any(s in text for s in stop) for text in tails], dtype=torch.bool)
    return hit


@contextlib.contextmanager
def _eval_mode(model):
    """Dropout off while sampling (rollouts come from the policy itself); then modes restored."""
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for m, was_training in modes:
            m.training = was_training


def stop_token_ids(model, tokenizer):
    """Every id that ends a completion: the tokenizer's EOS and the generation config's ones."""
    ids = {int(tokenizer.eos_token_id)} if tokenizer.eos_token_id is not None else set()
    gen = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    return sorted(ids | set([gen] if isinstance(gen, int) else gen or []))


def sample(model, tokenizer, prompts, group_size=1, max_new_tokens=256, temperature=1.0, stop=None,
           generator=None, seed=None, eos_token_ids=None, keep_stop=False, progress=None,
           drop_finished=True):
    """Sample `group_size` completions for each prompt -> `Samples` (B = len(prompts) * group_size).
    prompts: non-empty, chat-formatted strings (`chat_prompt`). temperature 0 is greedy. stop:
    strings; a row stops after the token completing one.
    generator / seed: the torch.Generator for the draws (on the model's device), or a list of one
    per prompt (each prompt's samples then depend on its generator only), or a seed to make one;
    with neither, a seed is drawn from torch's global RNG, so torch.manual_seed reproduces runs.
    eos_token_ids: ids that end a row; None = `stop_token_ids(model, tokenizer)`, () = none.
    keep_stop: our choice: False (texts end before the stop string) because callers extract code or
        plans from the text; the token ids and mask still hold the tokens that spelled it.
    progress: optional callable(tokens_so_far, max_new_tokens), called every 16 decode steps.
    drop_finished: the DROP_AT speed path of `decode_n_tokens`; the same tokens either way.
    """
    _check_sample_args(prompts, group_size, max_new_tokens, temperature, generator)
    stop = [s for s in ([stop] if isinstance(stop, str) else stop or []) if s]
    device = next(model.parameters()).device
    G = group_size
    if temperature > 0 and generator is None:
        seed = int(torch.randint(2**62, ()).item()) if seed is None else seed
        generator = torch.Generator(device=device).manual_seed(seed)
    eos = stop_token_ids(model, tokenizer) if eos_token_ids is None else list(eos_token_ids)
    eos_ids = torch.tensor(eos, dtype=torch.long, device=device)  # (E,)
    pad_id = tokenizer.pad_token_id  # load_model sets one (EOS's where the tokenizer has none)
    if pad_id is None:
        pad_id = eos[0] if eos else 0
    # our choice: add_special_tokens=False because the chat template already writes every special
    # token the model expects (a tokenizer adding BOS again would double it).
    enc = tokenizer(list(prompts), padding=True, padding_side="left", return_tensors="pt", add_special_tokens=False)
    prompt_ids = enc["input_ids"].to(device)  # (n, P)
    prompt_mask = enc["attention_mask"].to(device)  # (n, P)

    from transformers import DynamicCache

    with torch.no_grad(), _eval_mode(model):
        cache = DynamicCache(config=model.config)  # the config tells it about sliding-window layers
        fwd = _forward_kwargs(model, cache)
        # 1) prefill each distinct prompt once (n rows, not n*G: the group shares its prompt's KV)
        logits = prefill(model, fwd, prompt_ids, prompt_mask)  # (n, V)
        # 2) copy the cache and the logits to the G rows of each group (row i*G+g): each row then
        #    draws its own first token; one draw broadcast to the group would start its rows alike
        #    and shrink its reward variance.
        if G > 1:
            cache.batch_repeat_interleave(G)
            logits = logits.repeat_interleave(G, dim=0)  # (B, V)
        prompt_ids = prompt_ids.repeat_interleave(G, dim=0)  # (B, P)
        prompt_mask = prompt_mask.repeat_interleave(G, dim=0)  # (B, P)
        # (B, P+N). Like HF generate: no padding, no mask, so attention takes its causal fast path.
        full_mask = None if bool(prompt_mask.all()) else torch.cat(
            [prompt_mask, prompt_mask.new_ones(len(prompt_mask), max_new_tokens)], dim=1)
        positions = prompt_mask.sum(-1)  # (B,) position of the first generated token
        # 3) decode
        ids, mask = decode_n_tokens(model, fwd, tokenizer, logits, full_mask, positions, prompt_mask.shape[1],
                                    max_new_tokens, eos_ids, pad_id, stop, temperature, generator,
                                    progress, drop_at=DROP_AT if drop_finished else None)
        del cache, fwd  # free the KV cache (the largest rollout tensor) before the caller trains
    texts, truncated = _decode_texts(tokenizer, ids, mask, eos_ids, stop, keep_stop, max_new_tokens)
    return Samples(prompt_ids=prompt_ids, prompt_mask=prompt_mask, completion_ids=ids,
                   completion_mask=mask, texts=texts, truncated=truncated)


def _check_sample_args(prompts, group_size, max_new_tokens, temperature, generator):
    """`sample`'s argument checks: a ValueError that says what is wrong."""
    if not isinstance(prompts, (list, tuple)) or not prompts or not all(isinstance(p, str) and p for p in prompts):
        raise ValueError("sample() needs a non-empty list of non-empty prompt strings")
    for name, value in (("group_size", group_size), ("max_new_tokens", max_new_tokens)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    if temperature < 0:
        raise ValueError(f"need temperature >= 0, got {temperature}")
    if isinstance(generator, (list, tuple)) and len(generator) != len(prompts):
        raise ValueError(f"{len(generator)} generators for {len(prompts)} prompts: give one per prompt")


def _decode_texts(tokenizer, ids, mask, eos_ids, stop, keep_stop, max_new_tokens):
    """Decode each row's masked tokens, minus a final EOS token, ended before the first stop string
    unless keep_stop. Returns (texts, truncated): truncated[i] says row i reached max_new_tokens
    with neither EOS nor a stop string."""
    lengths = mask.sum(-1)  # (B,)
    last = ids.gather(1, (lengths - 1).clamp(min=0)[:, None])[:, 0]  # (B,) last generated token
    ends_with_eos = torch.isin(last, eos_ids) & (lengths > 0)  # (B,)
    keep = (lengths - ends_with_eos.long()).tolist()  # one host sync for the whole batch
    texts = tokenizer.batch_decode([row[:k] for row, k in zip(ids.tolist(), keep)])
    hits = [[i for i in (text.find(s) for s in stop) if i >= 0] for text in texts]
    # an EOS makes keep < length
    truncated = [k == max_new_tokens and not h for k, h in zip(keep, hits)]
    if stop and not keep_stop:
        texts = [text[: min(h)] if h else text for text, h in zip(texts, hits)]
    return texts, truncated


# --------------------------------------------------------------------------------------------------
# 3. Roles: one system message and one user template per role (module constants), rendered by the
#    role's prompt function through the tokenizer's chat template. Each returns the full prompt
#    string.

def chat_prompt(tokenizer, system, user):
    """The chat template applied to [system, user] with the assistant turn opened, as a string.

    our choice: an empty `system` is left out (the template then uses its own default, e.g. Qwen's)
    because some templates reject an empty system message.
    """
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("this tokenizer has no chat template; use an instruct/chat model directory")
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


# The Planner's prompt. The problem's restatement (restatement_plan: its statement and first
# example, the one text measured to help the untrained 0.5B Coder as a plan) is pre-filled as the
# plan's Input/Output and first step, and the Planner adds only the Conditions and Loops parts. our
# choice, made on MBPP validation (90 problems, greedy 0.5B): this prompt started highest of the
# five Planner prompts measured (38.9% planner-coder pass@1, against 36.7% for the four parts asked
# for by name, 31.1% for a Planner adding its own steps to the restatement and 24.4% for a skeleton
# with placeholders to fill in; README, "Variants that left the code"). A pre-fill, not a request,
# so every plan holds the restatement exactly and the Planner's own words are what it adds.
PLANNER_SYSTEM = (
    "You are the Planner in a two-agent team. You never write code: "
    "a Coder writes the program from your plan.\n"
    "For the given problem, write an Algorithmic Thought: "
    "four short labelled parts, in this order:\n"
    "Input/Output: the inputs in the order the function or program receives them (names, types), "
    "and the exact output.\n"
    "Steps: the ordered steps of the algorithm, numbered, one short sentence each.\n"
    "Conditions: the branches and edge cases to handle.\n"
    "Loops: what is iterated over and when it stops.\n"
    "Rules: plain English only. No code, no code blocks, no function bodies. "
    "At most 100 words. Stop right after the Loops part."
)

PLANNER_PROMPT = (
    "{problem}\n\n"
    "Write the Algorithmic Thought for this problem. The problem is restated for you as its "
    "Input/Output and first step; add only the Conditions part (the edge cases and details the "
    "program must get right) and the Loops part, each about this problem, one sentence each.\n\n"
    "No code. Stop after Loops."
)

# What the Planner's answer is pre-filled with after the restatement: the label of the part it
# writes first.
PLANNER_PREFILL_END = "\nConditions:"

# The Planner's answer starts with this text (it is part of the prompt, not of the completion).
PLAN_PREFIX = "Input/Output:"

# The four labels, in order (tests and `clean_plan` use them).
PLAN_PARTS = ("Input/Output", "Steps", "Conditions", "Loops")

# Stop strings for the Planner: the start of a code block ends a plan (everything after it is code).
PLANNER_STOP = ("```", "\ndef ", "\nclass ", "\nimport ")

CODER_SYSTEM = "You are an expert Python programmer. You write correct, efficient Python 3 code."

# How the answer must look, per test kind (the extractor relies on the fence; the "no example usage"
# rule matters because module-level calls run before the tests and can crash or wait on stdin).
CODE_FORMAT = {
    "assert": (
        "Write the Python function {entry}. Answer with one ```python code block that contains "
        "only the function and the imports or helpers it needs: no example usage, no print, no "
        "input(), no tests."
    ),
    "functional": (
        "Write the Python function {entry} (as a method of class Solution if starter code gives "
        "one). Answer with one ```python code block that contains only the code: no example usage, "
        "no print, no input()."
    ),
    "stdio": (
        "Write a complete Python 3 program that reads the input from standard input and prints the "
        "answer to standard output. Answer with one ```python code block."
    ),
}

# The direct prompt: the problem, then the restatement control's very text (restatement_plan: the
# statement again and its first example), then the answer format. our choice, made on validation:
# the restatement as a plan beat the problem alone, and the same text in the direct prompt, with no
# plan framing, was the strongest single-agent prompt of those measured (MBPP validation 90, the
# 0.5B, greedy: 42.2% against 38.9% for the problem alone, +3 / -0; README, "The direct prompt").
# The single-agent baseline, its GRPO stage and every CG start from it.
DIRECT_PROMPT = "{problem}\n\n{restated}\n\n{format}"

# The baselines that reason before they code, in one answer: CoT (chain of thought) and SCoT
# (structured CoT, the untrained form of an Algorithmic Thought: I/O + sequence / branch / loop,
# then the code).
REASONING_PROMPTS = {
    "cot": "{problem}\n\nLet's think step by step. First explain briefly how to solve the problem, "
           "then give the code. {format}",
    "scot": "{problem}\n\n"
            "First write a short structured solving process in plain English:\n"
            "Input/Output: the inputs and the output.\n"
            "Sequence: the ordered steps.\n"
            "Branch: the conditions and edge cases.\n"
            "Loop: what is iterated over.\n"
            "Then write the code that implements it. {format}",
}

CODER_PROMPT = (
    "{problem}\n\n"
    "Here is a plan for solving it:\n{plan}\n\n"
    "Follow the plan. {format}"
)

# Reflexion-style repair: reflection and rewrite in one answer. our choice: one call, where
# Reflexion makes a separate reflection call first, because it halves the sampling passes per repair
# round.
REPAIR_PROMPT = (
    "{problem}\n\n"
    "Your previous answer was:\n```python\n{code}\n```\n"
    "It failed a test:\n{feedback}\n\n"
    "First say in one or two sentences what is wrong, "
    "then write the corrected complete code. {format}"
)

NO_CODE_FEEDBACK = "Your previous answer contained no Python code."


def _truncate(s, limit):
    """Cut long example text (stdin can be megabytes) so prompts stay bounded."""
    s = str(s)
    return s if len(s) <= limit else s[:limit] + "\n... (truncated)"


def _functional_call(fn_name, case):
    """Render a functional test case {input: JSON lines, output: JSON} as `fn(args) == out` when
    possible."""
    try:
        args = [json.loads(line) for line in case["input"].splitlines() if line.strip()]
        out = json.loads(case["output"])
    except (ValueError, KeyError, TypeError, AttributeError):
        # Not valid JSON: show the raw text rather than fail (the sandbox reports the real problem).
        return (f"Input:\n{case.get('input', '')}\nOutput:\n{case.get('output', '')}"
                if isinstance(case, dict) else str(case))
    return f"{fn_name}({', '.join(repr(a) for a in args)}) == {out!r}"


def problem_text(problem, max_examples=3, max_example_chars=1000):
    """The problem as shown to every role: statement, starter code, public tests / examples.

    Only `problem.public_tests` are shown, never hidden tests. our choice: at most `max_examples`
    public examples of at most `max_example_chars` characters each, because stdio inputs can be huge
    and the 0.5B model loses the instruction in long prompts.
    """
    starter = problem.starter_code.strip()
    if starter and starter == problem.statement.strip():
        # HumanEval: the statement IS the code to complete (signature + docstring); show it once,
        # fenced.
        parts = [f"Complete the following Python code:\n```python\n{starter}\n```"]
    else:
        parts = [problem.statement.strip()]
        if starter:
            parts.append(f"Complete this starter code:\n```python\n{starter}\n```")
    tests = list(problem.public_tests)[:max_examples]
    if problem.kind == "assert" and tests:
        head = "Your code should pass this test:" if len(tests) == 1 else "Your code should pass these tests:"
        parts.append(head + "\n" + "\n".join(_truncate(t, max_example_chars) for t in tests))
    elif problem.kind == "functional" and tests:
        calls = [_truncate(_functional_call(problem.entry_point, t), max_example_chars) for t in tests]
        parts.append("Examples:\n" + "\n".join(calls))
    elif problem.kind == "stdio" and tests:
        for k, t in enumerate(tests, 1):
            parts.append(
                f"Example {k}\nInput:\n{_truncate(t['input'], max_example_chars).rstrip()}\n"
                f"Output:\n{_truncate(t['output'], max_example_chars).rstrip()}"
            )
    return "\n\n".join(parts)


def code_format(problem):
    """The answer-format instruction for the problem's test kind (names the function when known)."""
    entry = f"`{problem.entry_point}`" if problem.entry_point else "that solves the problem"
    return CODE_FORMAT[problem.kind].format(entry=entry)


def _coder_answer(template, tokenizer, problem, **fields):
    """The Coder's system message + `template` filled with the problem, its answer format and
    `fields`."""
    user = template.format(problem=problem_text(problem), format=code_format(problem), **fields)
    return chat_prompt(tokenizer, CODER_SYSTEM, user)


def restatement_plan(problem):
    """The problem's restatement: its statement and first example, mechanically, in the plan's
    format. It tells the Coder nothing the problem does not, yet it is about the problem. Three
    uses: the restatement control (a Planner that only restates earns this), the pre-filled start of
    every Planner answer (plan_prefix), and the second half of the direct prompt (DIRECT_PROMPT)."""
    words = " ".join(problem.statement.split())
    first = list(problem.public_tests)[:1]
    example = ""
    if first and problem.kind == "functional":
        example = _functional_call(problem.entry_point, first[0])
    elif first and problem.kind == "assert":
        example = str(first[0])
    shown = f" Example: {_truncate(example, 300)}" if example else ""
    return f"Input/Output: as in the problem: {words}{shown}\nSteps: 1. {words}"


def plan_prefix(problem):
    """The text the Planner's answer is pre-filled with: the problem's restatement as Input/Output
    and step 1, then the label of the part the Planner writes (PLANNER_PREFILL_END)."""
    return restatement_plan(problem) + PLANNER_PREFILL_END


def planner_prompt(tokenizer, problem):
    """Planner: problem -> Algorithmic Thought. The answer is pre-filled with plan_prefix."""
    user = PLANNER_PROMPT.format(problem=problem_text(problem))
    return chat_prompt(tokenizer, PLANNER_SYSTEM, user) + plan_prefix(problem)


# The reference planner (evaluate.py --method reference-plan): a plan written from the benchmark's
# reference solution, to measure how much a plan known to be right can help the Coder (the ceiling
# of what a trained Planner could give it). our choice of wording: the Planner's own format and
# rules, the solution shown once, and every way of passing the program on forbidden; what the model
# does anyway is stripped (strip_reference_plan).
REFERENCE_PLAN_PROMPT = (
    "{problem}\n\n"
    "A correct solution:\n```python\n{reference}\n```\n\n"
    "Write the Algorithmic Thought this solution follows, for a programmer who will not see it: "
    "the method in plain English (what is computed, in which order, which cases are handled, what "
    "the loops run over). Do not copy or quote code, and do not use the solution's variable "
    "names: name only what the problem names.\n\n"
    "No code. Stop after Loops."
)


def reference_plan_prompt(tokenizer, problem):
    """Reference planner: problem + its reference solution -> Algorithmic Thought (pre-filled with
    PLAN_PREFIX)."""
    if not problem.reference.strip():
        raise ValueError(f"{problem.id}: no reference solution (reference plans need one: MBPP)")
    user = REFERENCE_PLAN_PROMPT.format(problem=problem_text(problem), reference=problem.reference)
    return chat_prompt(tokenizer, PLANNER_SYSTEM, user) + PLAN_PREFIX


def coder_prompt(tokenizer, problem, plan):
    """Coder: problem + plan -> one fenced program."""
    return _coder_answer(CODER_PROMPT, tokenizer, problem, plan=plan.strip() or "(no plan)")


def direct_prompt(tokenizer, problem, template=DIRECT_PROMPT):
    """Coder alone (no plan): the baseline that Collaboration Gain compares against. template:
    DIRECT_PROMPT, or REASONING_PROMPTS' CoT / SCoT."""
    return _coder_answer(template, tokenizer, problem, restated=restatement_plan(problem))


def repair_prompt(tokenizer, problem, code, feedback):
    """Reflexion-style repair: the previous program + feedback from a failing PUBLIC test -> new
    program."""
    return _coder_answer(REPAIR_PROMPT, tokenizer, problem, code=code.rstrip() or "# (no code)",
                         feedback=feedback.strip())


# MapCoder's agents (Islam et al. 2024): a Retriever recalls k similar problems with plans and names
# the algorithm; the Planner writes one plan per exemplar and rates its confidence; the Coder codes
# the most confident plan; a Debugger repairs it from the failing SAMPLE test, up to t rounds, then
# the next plan is tried. Our prompts use the Planner's labelled-text style (small models follow
# "Label: ..." lines better than XML). our choice: k = 3 and t = 5, MapCoder's defaults.
MAPCODER_K = 3
MAPCODER_T = 5

RETRIEVER_SYSTEM = (
    "You are the Retrieval agent in a team that solves programming problems. You do not solve the "
    "given problem: you recall similar problems you know and the algorithm behind them, so that a "
    "Planner can learn from them.\n"
    "Rules: plain English only, short sentences. "
    "Keep exactly the labels you are given, in their order."
)

RETRIEVER_PROMPT = (
    "{problem}\n\n"
    "Name the algorithm that solves this problem, explain it briefly, then recall {k} different "
    "problems that are solved with the same idea, each with the plan that solves it. Answer in "
    "exactly this format, replacing each <...>:\n"
    "{format}\n\n"
    "{code_rule} Stop after Plan {k}."
)

# The answer starts with this text (part of the prompt, like PLAN_PREFIX for the Planner).
RETRIEVAL_PREFIX = "Algorithm:"


def retriever_stop(k=MAPCODER_K):
    """Stop strings of the Retrieval agent: the label of exemplar k+1 (the untrained 0.5B kept
    recalling until the token limit; `parse_retrieval` also keeps only k)."""
    return [f"\nSimilar problem {k + 1}", f"\nExample {k + 1}"]


def retriever_prompt(tokenizer, problem, k=MAPCODER_K):
    """Retrieval agent: problem -> algorithm, tutorial and k similar problems with plans (pre-filled
    RETRIEVAL_PREFIX).

    our choice: exemplars are problem + plan, no code, because the Planner only reads the exemplars'
    problems and plans (as in MapCoder's planning prompt) and code would triple the length of the
    retrieval (`parse_retrieval` still reads "Code i:" blocks when a model writes them).
    """
    skeleton = ["Algorithm: <the name of the algorithm or technique>",
                "Tutorial: <two to four sentences: how the algorithm works and when to use it>"]
    for i in range(1, k + 1):
        skeleton.append(f"Similar problem {i}: <another problem solved with the same idea, in one sentence>")
        skeleton.append(f"Plan {i}: <the numbered steps that solve it>")
    user = RETRIEVER_PROMPT.format(problem=problem_text(problem), k=k, format="\n".join(skeleton),
                                   code_rule="No code at all: the plans are in words.")
    return chat_prompt(tokenizer, RETRIEVER_SYSTEM, user) + RETRIEVAL_PREFIX


def retrieval_text(retrieval, exemplar=None, max_field_chars=600):
    """Render a parsed retrieval for the Planner: the exemplars (all, or only index `exemplar`) and
    the algorithm.

    our choice: each field clipped to `max_field_chars` so a rambling retrieval cannot crowd out the
    problem.
    """
    exemplars = retrieval.get("exemplars") or []
    if exemplar is not None:
        exemplars = exemplars[exemplar:exemplar + 1]
    parts = [f"Similar problem {i}: "
             f"{_truncate(ex.get('problem') or '(not given)', max_field_chars)}\n"
             f"Its plan: {_truncate(ex.get('plan') or '(not given)', max_field_chars)}"
             for i, ex in enumerate(exemplars, 1)]
    algorithm, tutorial = retrieval.get("algorithm", ""), retrieval.get("tutorial", "")
    if algorithm or tutorial:
        parts.append(f"Relevant algorithm: {_truncate(algorithm or '(not named)', 200)}"
                     + (f"\n{_truncate(tutorial, max_field_chars)}" if tutorial else ""))
    return "\n\n".join(parts) or "(nothing recalled)"


# The four parts as a skeleton to fill in, for MapCoder's Planner (its plan has no pre-filled
# restatement).
PLANNER_FORMAT = (
    "Input/Output: <the inputs, in order, with names and types>; <the exact output>.\n"
    "Steps: 1. <first step>. 2. <next step>. 3. <...>\n"
    "Conditions: <the branches and edge cases>.\n"
    "Loops: <what is iterated over, and when it stops>."
)

# The Planner with a retrieval writes the same Algorithmic Thought (so a trained Planner adapter
# keeps its format) and then rates its confidence, which orders the plans (MapCoder's confidence
# generation, folded into the planning answer: our choice, one call instead of two per plan).
RETRIEVAL_PLANNER_SYSTEM = PLANNER_SYSTEM.replace(
    "Stop right after the Loops part.",
    "After the Loops part write one line 'Confidence: N', N from 0 to 100: how sure you are that "
    "the plan solves the problem. Stop right after it.")

RETRIEVAL_PLANNER_PROMPT = (
    "{problem}\n\n"
    "A teammate recalled this (it may be imperfect: use what helps):\n{retrieval}\n\n"
    "Write the Algorithmic Thought for this problem in exactly this format, replacing each <...>:\n"
    "{format}\n"
    "Confidence: <0 to 100>\n\n"
    "No code. Stop after the Confidence line."
)


def retrieval_planner_prompt(tokenizer, problem, retrieval, exemplar=None):
    """Planner given a retrieval (MapCoder planning): problem + recalled exemplars/algorithm -> plan
    + confidence.

    exemplar: None shows every recalled exemplar (train.py's retriever stage: one plan per
    retrieval, so all of the retrieval counts for its reward); an index shows only that exemplar
    (the pipeline: one plan per exemplar).
    """
    user = RETRIEVAL_PLANNER_PROMPT.format(problem=problem_text(problem), retrieval=retrieval_text(retrieval, exemplar),
                                           format=PLANNER_FORMAT)
    return chat_prompt(tokenizer, RETRIEVAL_PLANNER_SYSTEM, user) + PLAN_PREFIX


DEBUGGER_SYSTEM = (
    "You are the Debugging agent in a team that solves programming problems. A teammate's program "
    "fails a sample test; you find the mistake and write the corrected program."
)

DEBUGGER_PROMPT = (
    "{problem}\n\n"
    "{plan_part}"
    "A teammate wrote this program:\n```python\n{code}\n```\n"
    "It fails a sample test:\n{feedback}\n\n"
    "First write 'Corrected plan:' and a few numbered steps in plain English that fix the mistake, "
    "then the corrected complete code. {format}"
)


def debugger_prompt(tokenizer, problem, code, feedback, plan=""):
    """Debugging agent: problem (+ the plan followed) + failing program + feedback from a PUBLIC
    test -> program."""
    plan_part = f"The plan it followed:\n{plan.strip()}\n\n" if plan and plan.strip() else ""
    user = DEBUGGER_PROMPT.format(problem=problem_text(problem), plan_part=plan_part,
                                  code=code.rstrip() or "# (no code)", feedback=feedback.strip() or "(no details)",
                                  format=code_format(problem))
    return chat_prompt(tokenizer, DEBUGGER_SYSTEM, user)


# --------------------------------------------------------------------------------------------------
# 4. Extraction: a raw completion -> what the next role or the sandbox needs. One fence scanner
#    (`_segments`) serves plans, programs and retrievals. None of these raise: a malformed answer
#    gives an empty field.

# A fence line: ``` or ~~~ (3+), an optional language tag, an info string (e.g. ```python:sol.py).
_FENCE = re.compile(r"^\s*(`{3,}|~{3,})\s*([\w+#.-]*)(.*)$")
# Tags treated as Python; an untagged block counts only if it looks like Python.
_PY_LANGS = {"", "python", "py", "python3", "py3", "python2"}
# Lines that only Python code starts with (used to tell code from prose in unfenced / untagged
# text).
_PY_LINE = re.compile(
    r"^\s*(def\s+\w+\s*\(|class\s+\w+|import\s+\w|from\s+[\w.]+\s+import\s|@\w|if\s+__name__\s*==|"
    r"(for\s+.+\s+in|while|if|with)\s+.+:\s*$|try:\s*$|return\b|print\(|"
    r"[\w.\[\], ]+\s*[-+*/]?=\s*\S)"
)


def _segments(text):
    """Split text into prose lines (str) and fenced blocks (lang, body lines, closed), in order.

    Tolerates indented fences, an info string after the tag (```python title="x.py"), ``` glued to
    the last code line, and an unterminated last block (a truncated completion).
    """
    out, lines = [], iter(text.split("\n"))
    for line in lines:
        m = _FENCE.match(line)
        if not m:
            out.append(line)
            continue
        body, closed = [], False
        # The block's lines, from the same iterator: after it, the outer loop goes on.
        for line in lines:
            if _FENCE.match(line):
                closed = True
                break
            if line.rstrip().endswith("```"):  # "    return x```": the fence glued to the code
                body.append(line.rstrip()[:-3])
                closed = True
                break
            body.append(line)
        out.append((m.group(2).lower(), body, closed))
    return out


def _parses(code):
    try:
        ast.parse(code)
    except (SyntaxError, ValueError):  # ValueError: null bytes in the source
        return False
    return True


def _looks_like_python(code):
    """At least one line that only code would start with, and the whole of it parses."""
    return bool(code.strip()) and any(_PY_LINE.match(l) for l in code.split("\n")) and _parses(code)


# A line that starts a Python definition / import (code that leaked into a plan without a fence).
_CODE_START = re.compile(r"^\s*(def\s+\w+\s*\(|class\s+\w+\s*[(:]|import\s+\w|from\s+[\w.]+\s+import\s)")
# A label line of the Loops part (optionally numbered / bold / a heading): "4. **Loops**:", "###
# Loops".
_LOOPS_LABEL = re.compile(r"^[\s#>*\-]*(\d+[.)]\s*)?[*_]*\s*(loops?|iterations?)[*_]*\s*(:|$)", re.I | re.M)
# A heading, a typical "here is the code" transition, or a new "Label:" at column 0 (e.g. "Rules:").
_AFTER_PLAN = re.compile(
    r"^(\s*#+\s|\s*\*\*?(code|implementation|solution)|\s*(here is|here's|now,? |the code|code:|"
    r"implementation|solution:|example)|[A-Za-z][\w /-]{0,30}:)", re.I)


def clean_plan(text, prefix=PLAN_PREFIX):
    """Raw Planner completion -> Algorithmic Thought: no code, and nothing after the Loops part.

    (1) Put back the pre-filled `prefix`; (2) end at the first Python block or code-looking line (a
    prose block, e.g. the plan wrapped in ```text, is unwrapped); (3) end at the end of the Loops
    part: a blank line, heading, "Here is the code" or new "Label:" line (the 0.5B adds "Rules:").
    our choice: shorten, never rewrite, because plans with code did worse and the Coder must see what
    the Planner wrote, not our edit of it.
    """
    text = (prefix + text) if prefix and not text.lstrip().startswith(prefix) else text
    out = []
    for seg in _segments(text):
        if isinstance(seg, str):
            if _CODE_START.match(seg):
                break
            out.append(seg)
            continue
        lang, body, _ = seg
        if lang in _PY_LANGS and (lang or _looks_like_python("\n".join(body))):
            break  # real code: the plan ends here
        out.extend(body)  # a prose block: keep its text, drop the fence lines
    plan = "\n".join(out)
    # Cut after the last Loops label (an early "Loops" word inside Steps should not end the plan):
    # the part ends at a blank line or a non-plan line.
    labels = list(_LOOPS_LABEL.finditer(plan))
    if labels:
        head, tail = plan[: labels[-1].start()], plan[labels[-1].start():].split("\n")
        keep = itertools.takewhile(lambda line: line.strip() and not _AFTER_PLAN.match(line), tail[1:])
        plan = head + "\n".join([tail[0], *keep])
    return re.sub(r"\n{3,}", "\n\n", plan).strip()


# Reference plans: what must not reach the Coder is the program. A plan line holding a line of the
# reference counts as a copy when that line has at least this many characters, spaces ignored: our
# choice, so "if x % 2 == 0:" inside a sentence is one and "else:" or "i += 1" are not.
MIN_COPIED_CHARS = 8
# A line's list / part decoration ("2. ", "- ", "Steps: 1.") is not part of what is checked.
_DECORATION = re.compile(r"(?i)^[\s#>*\-]*(?:(?:\d+[.)]|[*_]*(?:" + "|".join(map(re.escape, PLAN_PARTS))
                         + r")[*_]*:)\s*)*")
_BACKTICKED = re.compile(r"`([^`\n]+)`")


def is_statement(text):
    """Whether `text` parses as Python code (a block header such as "for x in xs:" counts, colon or
    not), other than a lone name or constant ("n", "None", "nums.sort" read as words in a plan)."""
    text = text.strip()
    for source in (text, text + "\n    pass", text + ":\n    pass"):
        if text and _parses(source):
            body = ast.parse(source).body
            lone = (ast.Name, ast.Constant, ast.Attribute)
            return not (len(body) == 1 and isinstance(body[0], ast.Expr)
                        and isinstance(body[0].value, lone))
    return False


def _without_code_spans(line):
    """(line without its backticked spans that are statements, how many were removed)."""
    spans = _BACKTICKED.findall(line)
    code = [span for span in spans if is_statement(span)]
    for span in code:
        line = line.replace(f"`{span}`", "", 1)
    return line, len(code)


def strip_reference_plan(text, reference):
    """A reference planner's completion (pre-fill included) -> (plan, lines and spans removed).
    Removed: code blocks, backticked spans and lines that parse as Python statements (is_statement),
    lines that copy a line of the reference (MIN_COPIED_CHARS); then clean_plan ends the plan after
    its Loops part. Identifiers are reported, not removed (reference_leaks)."""
    copies = {re.sub(r"\s+", "", line) for line in reference.splitlines()}
    copies = {c for c in copies if len(c) >= MIN_COPIED_CHARS and not c.startswith("def")}
    kept, removed = [], 0
    for seg in _segments(text):
        if not isinstance(seg, str):
            removed += len(seg[1])  # a fenced block: the rules say no code blocks
            continue
        line, spans = _without_code_spans(seg)
        removed += spans
        squeezed = re.sub(r"\s+", "", line)
        if is_statement(_DECORATION.sub("", line)) or any(c in squeezed for c in copies):
            removed += 1
            label = _LABEL.match(line)  # the part goes on: "Steps: 1. x = 0" leaves "Steps:"
            if label:
                kept.append(label.group(0).strip())
            continue
        kept.append(line)
    return clean_plan("\n".join(kept)), removed


def reference_leaks(plan, problem):
    """The identifiers of the problem's reference solution (names and arguments) that the plan
    names (whole words) and the problem does not (its statement and shown tests): a plan passing on
    the program's own names. A local like `res` is a weak leak; reported, never stripped."""
    if not _parses(problem.reference):
        return []
    nodes = list(ast.walk(ast.parse(problem.reference)))
    names = {n.id for n in nodes if isinstance(n, ast.Name)} | {
        n.arg for n in nodes if isinstance(n, ast.arg)}
    names -= set(re.findall(r"\w+", problem_text(problem))) | set(dir(builtins))
    return sorted(n for n in names if len(n) > 1 and re.search(rf"\b{re.escape(n)}\b", plan))


# A copied format placeholder: "<...>" or "<" lowercase words with a space ">" ("<first step>",
# "<the inputs, in order, with names and types>"). "a < b", "x <= y" and "List<int>" do not match
# (space after "<", no space inside).
_PLACEHOLDER = re.compile(r"<(\.{3}|[a-z][a-z ,./'-]*\s[a-z ,./'-]*[a-z.])>")


def plan_placeholders(plan):
    """The PLANNER_FORMAT placeholders a plan copied instead of filling in (e.g. ["<first step>",
    "<...>"])."""
    return [m.group(0) for m in _PLACEHOLDER.finditer(plan)]


# A part's label at the start of a line, decorated or not: "Steps:", "2. **Steps**:", "### Loops:".
_LABEL = re.compile(r"(?im)^[\s#>*\-]*(?:\d+[.)]\s*)?[*_]*(" + "|".join(re.escape(s) for s in PLAN_PARTS)
                    + r")[*_]*\s*:")


def plan_parts(plan):
    """{label: its text} for the PLAN_PARTS labels found in a plan (text up to the next label)."""
    marks = list(_LABEL.finditer(plan))
    return {m.group(1).lower(): plan[m.end():(marks[i + 1].start() if i + 1 < len(marks) else len(plan))].strip()
            for i, m in enumerate(marks)}


_WORD = re.compile(r"\b[A-Za-z]{2,}\b")
# A numbered step that says something: three or more words ("1. Sort the list."), or a formula /
# example with a word ("1. Return n * (3 * n - 1) // 2."); not "1.", "1. [5, 'FDF']" or "1.
# Proceed." (whole words: without the \b a word of six letters counted as three).
_STEP = re.compile(r"(?m)(?:^|\s)\d+[.)]\s+(?:(?:[^\d\n]*?\b[A-Za-z]{2,}\b){3}|[^\n]*?[A-Za-z]{2,}[^\n]*?[-+*/%=<>]"
                   r"[^\n]*?\w)")

# Words any plan can say about any problem. A plan made only of these (and function words) tells the
# Coder nothing the problem did not: "1. Read the input values given. 2. Compute the required result
# value. 3. Return it." our choice of list: the planning vocabulary of the content-free plans in
# tests/test_agents.py and of the 0.5B's generic plans, plus English function words; type names
# (list, string, int), operations (sort, sum, count) and domain words (vowel, prime) are content.
GENERIC_WORDS = frozenset("""
a an the and or but if else then than when while until as at by for from in into of on onto to with
within without be is are was were been being it its this that these those there here each every all
any some no none not nothing do does done doing make makes made get gets take takes use uses using
need needs needed necessary required require requires should must can will may might would could one
first next last final finally second third step steps also input inputs output outputs value values
result results given give gives return returns returned returning read reads compute computes
computed computing calculate calculated calculation process processing processed perform performs
operation operations problem problems task tasks solution solutions solve solves solved answer
answers handle handles handled handling check checks checked case cases edge edges condition
conditions conditional loop loops iterate iterates iteration iterations iterating needed data
element elements item items variable variables initialize initialise initialized store stores stored
function functions parameter parameters argument arguments implement implementation implemented
understand follow following described description describe specified expected appropriate
appropriately accordingly correct correctly valid invalid proper properly required way ways thing
things something whatever what which who how where why based according relevant specific type types
format formatted formats print prints produce produces provided provide provides exact exactly
compute logic algorithm algorithms approach method methods code program programs write wanted want
wants necessary needed until done end ends stop stops start starts begin begins over through across
up down out just only then again more less same other another such their them they we you your our
my us i he she ask asks asked analyze analyse carefully apply applies applied special run runs
running proceed determine determines identify obtain obtained desired outcome general generic simple
some
""".split())
# Content besides words and numbers: an operator between operands ("n * (n + 1)", "x >= 0"), a call
# ("len(s)"), a list or a quoted value ("[1, 2]", "'a'"). Not an arrow, a bracketed aside or an
# apostrophe: "inputs -> output.
# 1. Return the result (as required)." says nothing, and counting "-", ">" and "(" let it through
# the gate.
_CONTENT = re.compile(r"[A-Za-z]{3,}|\d+|\w\s*(?:[-+*/%<>!]=?|==?)\s*[\w(\['\"]|\w\(|\[\s*[\w'\"-]|'[^'\s]+'")


def plan_content(plan):
    """The content tokens of a plan: its words outside GENERIC_WORDS (lower-cased, 3+ letters),
    numbers, operators, brackets and quotes (formulas and example values such as "[1, 2] -> 3"). A
    content-free plan has none or almost none, whatever its labels say."""
    # The labels ("Input/Output") are not content.
    text = " ".join(plan_parts(plan).values()) or plan
    text = re.sub(r"(?m)(?:^|(?<=\s))\d+[.)](?=\s)", " ", text)  # nor is the numbering of the steps
    return [t for t in (m.group(0).lower() for m in _CONTENT.finditer(text)) if t not in GENERIC_WORDS]


def _steps(text):
    """The numbered steps of a Steps part: ["Sort the list.", "Return the first."] for "1. Sort the
    list. 2. Return the first." (the numbers are the separators; text before the first number is not
    a step)."""
    return [t.strip() for t in re.split(r"(?:^|(?<=[.:;!?])\s|\n)\s*\d+[.)]\s+", text)[1:]]


def gate_label(plan, truncated=False, problem=None, min_steps=1, min_content=3, required=PLAN_PARTS[:2]):
    """The Planner's format gate: the label of a plan. "ok"; "truncated" (it reached its token limit
    but is well formed as far as it went); or why it is not an Algorithmic Thought: "missing parts",
    "placeholder", "repeated part", "empty part", "empty step", "no steps", "content-free",
    "restatement". rewards.planner_reward turns the label into the reward's gate.

    our choices:
    - the `required` parts (Input/Output and Steps) labelled, every part given saying something (a
      word, or a value such as "[1, 2] -> 3"), no copied placeholder: a gate on labels alone taught
      the Planner empty parts ("Steps: 1. 2. 3. 4."). An absent Conditions or Loops part reads as
      "none": the untrained 1.5B leaves one out in 66 of 90 validation plans, all of which pass once
      "Loops: none." is added, and 27 of them led to passing programs;
    - min_steps=1 numbered step of two words or a formula: a correct one-step plan ("1. Return n *
      (n + 1) // 2") is a plan; "1." and "1. Proceed." are not ("empty step");
    - min_content=3 content tokens (`plan_content`): a plan of generic planning words ("Compute the
      required result value") lets the Coder code alone, and a gate that accepts it pays for saying
      nothing;
    - truncated=True: "truncated" when the plan stopped before all four parts, so a long plan is
      scored by its programs less a truncation penalty; it still needs the required parts;
    - a part labelled twice is "repeated part": a plan that completes its four parts and then
      repeats itself to the limit would otherwise read as finished and escape the truncation
      penalty;
    - problem given: fewer than min_content content tokens that the problem as shown (problem_text)
      does not already hold is a "restatement": it tells the Coder nothing it did not read.
    What no text rule catches, a fixed plan of jargon (evaluate.GENERIC_PLAN passes), the
    generic-plan control does.
    """
    parts = plan_parts(plan)
    if plan_placeholders(plan):
        return "placeholder"
    reached = [s.lower() for s in PLAN_PARTS if s.lower() in parts]
    if any(s.lower() not in parts for s in required):
        return "missing parts"
    if len(_LABEL.findall(plan)) > len(parts):
        return "repeated part"
    if not all(_WORD.search(t) or re.search(r"\d", t) for t in (parts[s] for s in reached)):
        return "empty part"
    if any(len(_WORD.findall(t)) < 2 and not _STEP.search("1. " + t) for t in _steps(parts["steps"])):
        return "empty step"
    if len(_STEP.findall(parts["steps"])) < min_steps:
        return "no steps"
    if len(plan_content(plan)) < min_content:
        return "content-free"
    if problem is not None:
        new_content = set(plan_content(plan)) - set(plan_content(problem_text(problem)))
        if len(new_content) < min_content:
            return "restatement"
    if truncated and len(reached) < len(PLAN_PARTS):
        return "truncated"
    return "ok"


def plan_stats(plans, truncated=None):
    """Format of a batch of plans (the plan-collapse watch; train.py's log and evaluate.py's
    summary): shares with all four parts, with a copied placeholder, passing the gate ("ok" or
    "truncated"), truncated, content-free; mean length in characters. truncated: per plan (default:
    none was)."""
    if not plans:
        return {}
    truncated = truncated or [False] * len(plans)
    labels = [gate_label(p, truncated=t) for p, t in zip(plans, truncated)]
    stats = {"plan_parts_frac": [len(plan_parts(p)) == 4 for p in plans],
             "plan_placeholder_frac": [bool(plan_placeholders(p)) for p in plans],
             "plan_ok_frac": [label in ("ok", "truncated") for label in labels],
             "plan_truncated_frac": truncated,
             "plan_content_free_frac": [label == "content-free" for label in labels],
             "plan_chars": [len(p) for p in plans]}
    return {k: sum(map(float, v)) / len(v) for k, v in stats.items()}


# The control plan of evaluate.py's content-free-plan method: one fixed text for every problem, well
# formed and saying nothing about the problem. Plan information = pass@1(own plan) -
# pass@1(this plan): what the Planner's plans tell the Coder beyond the problem itself. The format
# gate refuses it (gate_label: "content-free").
CONTENT_FREE_PLAN = (
    "Input/Output: the inputs as the problem gives them; the output it asks for.\n"
    "Steps: 1. Read the input values given. 2. Compute the required result value. "
    "3. Return the computed result value.\n"
    "Conditions: handle the edge cases.\n"
    "Loops: iterate where needed."
)


def _parsing_prefix(code, max_tries=64):
    """The longest prefix of whole lines that parses (drops a truncated statement, trailing prose).

    At most `max_tries` parses (then ""), so long prose cannot make extraction quadratic.
    """
    lines = code.split("\n")
    end = len(lines)
    for _ in range(max_tries):
        if end <= 0:
            break
        try:
            ast.parse("\n".join(lines[:end]))
            return "\n".join(lines[:end]).rstrip()
        except (SyntaxError, ValueError) as e:
            # Jump below the reported line when that shrinks the prefix, else drop one line (the
            # prefix strictly shrinks); usually one jump lands on the last good line. A ValueError
            # (null bytes) reports no line: one line is dropped.
            bad = (getattr(e, "lineno", None) or end) - 1
            end = bad if 0 < bad < end else end - 1
    return ""


def _unfenced_code(text):
    """Code written without fences: the whole text if it is Python, else from the first line that
    only code starts with (at its indentation, so code indented inside prose works), up to the
    longest part that parses."""
    stripped = textwrap.dedent(text).strip()
    if _looks_like_python(stripped):
        return stripped
    lines = text.split("\n")
    # A lone `return` / `print(` line in prose is not where code starts. our choice: try at most 10
    # start lines, because prose full of "x = y" phrases would otherwise cost a parse search per
    # line.
    starts = [k for k, l in enumerate(lines) if _PY_LINE.match(l) and not l.strip().startswith(("return", "print("))]
    for k in starts[:10]:
        indent = len(lines[k]) - len(lines[k].lstrip())
        # The code runs until a line dedented below its own level: back to prose.
        body = itertools.takewhile(lambda nxt: not nxt.strip() or len(nxt) - len(nxt.lstrip()) >= indent, lines[k + 1:])
        code = _parsing_prefix(textwrap.dedent("\n".join([lines[k], *body])))
        if code and any(_PY_LINE.match(l) for l in code.split("\n")):
            return code
    return ""


# Calls that are example usage / interaction when they appear at module level in assert-style code.
_USAGE_CALLS = {"print", "input", "exit", "quit", "breakpoint", "help"}
_USAGE_ATTRS = {"testmod", "main"}  # doctest.testmod(), unittest.main()


def _is_usage(node, targets):
    """A module-level statement that exercises the code instead of defining it."""
    if isinstance(node, ast.Assert):
        return True
    # if __name__ == "__main__": (either order)
    if isinstance(node, ast.If) and isinstance(node.test, ast.Compare):
        if any(isinstance(n, ast.Name) and n.id == "__name__" for n in [node.test.left, *node.test.comparators]):
            return True
    for sub in ast.walk(node):
        if isinstance(sub, ast.Attribute) and sub.attr == "stdin":
            return True  # sys.stdin.read() / readline()
        if not isinstance(sub, ast.Call):
            continue
        f = sub.func
        if isinstance(f, ast.Name) and (f.id in _USAGE_CALLS or f.id in targets):
            return True
        if isinstance(f, ast.Attribute) and (f.attr in _USAGE_ATTRS or f.attr in targets):
            return True
    return False


def _bare_call(node):
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)


def strip_example_usage(code, entry_point=""):
    """Drop module-level example usage from assert / functional code; keep imports, defs, classes,
    constants.

    It drops asserts, `if __name__ == "__main__":` blocks, top-level statements that call print /
    input / exit, read stdin, or call the function under test (`entry_point`, else any function or
    class defined here), and bare calls of any defined function (a demo). Code that does not parse
    is returned unchanged (the sandbox reports the syntax error, which Reflexion feeds back).
    """
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return code
    defs = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Import, ast.ImportFrom)
    defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    # our choice: with a known entry point only its calls count as usage, because an assignment that
    # calls a helper (`PRIMES = sieve(10**6)`) is usually precomputation the solution needs.
    targets = {entry_point} if entry_point else defined
    drop = [node for node in tree.body if not isinstance(node, defs)
            and (_is_usage(node, targets) or (_bare_call(node) and _is_usage(node, defined)))]
    if not drop:
        return code
    lines = code.split("\n")
    dead, kept_lines = set(), set()
    for node in drop:
        dead.update(range(node.lineno - 1, node.end_lineno))
        k = node.lineno - 2
        # Also the comments right above ("# Example usage:").
        while k >= 0 and lines[k].strip().startswith("#"):
            dead.add(k)
            k -= 1
    kept = [node for node in tree.body if node not in drop]
    for node in kept:
        first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        kept_lines.update(range(first - 1, node.end_lineno))
    if dead & kept_lines:
        # Two statements on one line (`x = 1; print(x)`): rebuild from the AST (comments are lost).
        return ast.unparse(ast.Module(body=kept, type_ignores=[]))
    out = "\n".join(l for k, l in enumerate(lines) if k not in dead)
    return re.sub(r"\n{3,}", "\n\n", out).strip()


def extract_code(text, kind="assert", entry_point=""):
    """A model completion -> the program to run ("" when it holds no code).

    Block policy (our choice, from what instruct models write): among the Python blocks (an untagged
    one only if it looks like Python) take the LAST that defines `entry_point` (a later block is
    usually the corrected one, and demos do not define the function); else the longest with a
    def/class (assert, functional) or the longest (stdio), later wins ties. No fence:
    `_unfenced_code`. An unterminated block (a truncated completion) is reduced to its longest
    parsing prefix. Assert / functional code loses its example usage; a stdio program's top level is
    the program.
    """
    if not isinstance(text, str) or not text.strip():
        return ""
    cands = []  # (code, closed)
    for lang, body, closed in (s for s in _segments(text) if isinstance(s, tuple)):
        body = textwrap.dedent("\n".join(body)).strip("\n")
        if not body.strip() or lang not in _PY_LANGS:
            continue
        if lang == "" and not any(_PY_LINE.match(l) for l in body.split("\n")):
            continue  # an untagged block of sample input / output, not code
        cands.append((body, closed))
    defines = re.compile(rf"^\s*(async\s+)?(def|class)\s+{re.escape(entry_point)}\b", re.M) if entry_point else None
    if cands:
        defining = [c for c in cands if defines and defines.search(c[0])]
        with_defs = [c for c in cands if re.search(r"^\s*(def|class)\s", c[0], re.M)]
        pool = defining[-1:] or (with_defs if (with_defs and kind != "stdio") else cands)
        # max() keeps the first of equal keys: search reversed so the later block wins ties.
        code, closed = max(reversed(pool), key=lambda c: len(c[0]))
    else:
        code, closed = _unfenced_code(text), True
    if not closed and not _parses(code):
        code = _parsing_prefix(code)
    if kind != "stdio":
        code = strip_example_usage(code, entry_point)
    return code.strip()


def reasoning_before_code(text):
    """The prose before the first fence of a CoT / SCoT answer (kept as the Attempt's plan)."""
    return "\n".join(itertools.takewhile(lambda seg: isinstance(seg, str), _segments(text))).strip()


# A label line of a retrieval answer, decorated or not: "Similar problem 2:", "**Plan 1:** ...",
# "### Example 1", "2. Problem: ...". A label needs a colon unless it stands alone on its line
# (a heading), so prose such as "Plan the loop first" is not a label.
_RETRIEVAL_LABEL = re.compile(
    r"^\s*(?:#+\s*|>\s*|[-*+]\s+)?(?:\d+[.)]\s*)?[*_]*\s*"
    r"(?P<label>(?:relevant\s+)?algorithm(?:\s+name)?|tutorial|example(?:\s+problem)?|"
    r"similar\s+problem|problem|planning|plan|code)"
    r"(?:\s*#?\s*(?P<num>\d+))?\s*[*_]*\s*(?:(?P<colon>:)[*_]*\s*(?P<rest>.*?)|)\s*$",
    re.I,
)
_EXEMPLAR_FIELDS = ("problem", "plan", "code")


def _retrieval_key(label):
    """The field a _RETRIEVAL_LABEL label fills: the first of these words it contains ("planning" ->
    "plan"), else "problem" (example, example problem, similar problem, problem)."""
    return next((key for key in ("algorithm", "plan", "tutorial", "code") if key in label.lower()), "problem")


def _exemplar_for(exemplars, current, key, num):
    """The exemplar that a "problem" / "plan" / "code" label numbered `num` writes to (appended when
    new)."""
    # The exemplar with this number, if it still lacks this field ("Example 1..3" then "Plan 1..3").
    match = next((e for e in exemplars if num is not None and e["num"] == num and not e[key]), None)
    if match is not None:
        current = match
    elif current is None or (key == "problem" and any(current[f] for f in _EXEMPLAR_FIELDS)):
        # (A heading "### Example 1" then "Problem: ..." stays one exemplar.)
        current = {"num": num, "problem": [], "plan": [], "code": []}
        exemplars.append(current)
    # Otherwise a plan / code label belongs to the current exemplar, even when numbered otherwise or
    # repeated: small models number the steps of one plan "Plan 1:", "Plan 2:", ... (seen on the
    # 0.5B).
    if current["num"] is None:
        current["num"] = num
    return current


def parse_retrieval(text, prefix=RETRIEVAL_PREFIX, k=None):
    """A Retrieval agent's raw answer -> {"algorithm", "tutorial", "exemplars": [{"problem", "plan",
    "code"}]}.

    Every field is a stripped string ("" when missing). Rules (our choice, for small models that
    drift from the format): the `prefix` is put back; the algorithm is its label's line, later
    unlabelled lines are tutorial; "Similar problem i" / "Example i" / "Problem i" starts an
    exemplar, "Plan i" / "Code i" fill one (`_exemplar_for`); a fenced block inside an exemplar is
    its code; text before the first label, blocks outside exemplars and exact repeats are dropped.
    At most `k` exemplars (None = all) are kept.
    """
    text = text if isinstance(text, str) else ""
    text = (prefix + text) if prefix and not text.lstrip().startswith(prefix) else text
    algorithm, tutorial, exemplars = [], [], []
    current = target = None  # the exemplar being written; the list receiving unlabelled lines
    for seg in _segments(text):
        if isinstance(seg, tuple):
            if current is not None:
                current["code"].append(textwrap.dedent("\n".join(seg[1])).strip("\n"))
            continue
        m = _RETRIEVAL_LABEL.match(seg)
        if m is None:
            if target is not None:
                target.append(seg)
            continue
        key, rest = _retrieval_key(m.group("label")), m.group("rest") or ""
        if key == "algorithm":
            # The algorithm is a name: its label line; what follows unlabelled is tutorial text.
            algorithm.append(rest)
            target = tutorial
            continue
        if key == "tutorial":
            target = tutorial
        else:
            current = _exemplar_for(exemplars, current, key, int(m.group("num")) if m.group("num") else None)
            target = current[key]
        if rest:
            target.append(rest)
    unique = {}  # each exemplar's text up to whitespace -> the first exemplar with that text
    for e in exemplars:
        ex = {f: "\n".join(e[f]).strip() for f in _EXEMPLAR_FIELDS}
        # our choice: an exact repeat (up to whitespace) is dropped, because it would only cost a
        # duplicate plan; small models often repeat one exemplar until the token limit.
        if any(ex.values()):
            unique.setdefault(tuple(" ".join(v.split()) for v in ex.values()), ex)
    return {"algorithm": " ".join(" ".join(algorithm).split()),
            "tutorial": "\n".join(tutorial).strip(), "exemplars": list(unique.values())[:k]}


# A confidence line: "Confidence: 85", "**Confidence score**: 0.9", "confidence = 8/10", "Confidence
# 70%".
_CONFIDENCE = re.compile(
    r"^[\s#>*\-]*[*_]*\s*(?:self[- ]rated\s+)?confidence(?:\s+(?:score|level|rating))?\s*[*_]*\s*"
    r"(?:[:=]|(?=\d))[*_]*\s*(?P<value>.*)$", re.I | re.M)
_CONFIDENCE_WORDS = {"very high": 90.0, "high": 80.0, "medium": 50.0, "moderate": 50.0, "low": 20.0, "very low": 10.0}


def parse_confidence(value):
    """The text after "Confidence:" -> a number in [0, 100], or None when it is missing or nonsense.

    Accepted (our choice, from what small models write): "85", "85%", "85/100", "8/10", "4 out of
    5", "0.85" (a decimal <= 1 is a fraction), and the words very low / low / medium / moderate /
    high / very high. Anything above 100 after scaling is nonsense -> None.
    """
    if not isinstance(value, str):
        return None
    s = value.strip().strip("*_ ").lower()
    m = re.match(r"(\d+(?:\.\d+)?)\s*(?:(%)|/\s*(\d+)|out\s+of\s+(\d+))?", s)
    if m:
        x = float(m.group(1))
        denom = m.group(3) or m.group(4)
        if denom:
            x = 100.0 * x / float(denom) if float(denom) > 0 else float("nan")
        elif not m.group(2) and "." in m.group(1) and x <= 1.0:
            x *= 100.0
        return x if 0.0 <= x <= 100.0 else None
    words = sorted(_CONFIDENCE_WORDS, key=len, reverse=True)  # "very high" before "high"
    return next((_CONFIDENCE_WORDS[word] for word in words if s.startswith(word)), None)


def plan_with_confidence(text, prefix=PLAN_PREFIX):
    """A Planner completion -> (plan, confidence or None). The plan is `clean_plan` of the text
    before the first confidence line; without a confidence line it is exactly `clean_plan(text)`
    (the plain Planner's behaviour)."""
    if not isinstance(text, str):
        return "", None
    m = _CONFIDENCE.search(text)
    if m is None:
        return clean_plan(text, prefix), None
    return clean_plan(text[:m.start()], prefix), parse_confidence(m.group("value"))


def rank_plans(plans, unrated=0.0):
    """[(plan, confidence or None)] -> plans, most confident first; ties keep their retrieval order.

    unrated: our choice 0, the score of a plan without a usable confidence: it goes after every
    rated plan (a plan that ignores the format is more often a degenerate one) but keeps its order
    among the unrated.
    """
    # sorted is stable: ties keep their order.
    ranked = sorted(plans, key=lambda pc: -(pc[1] if pc[1] is not None else unrated))
    return [plan for plan, _ in ranked]


# --------------------------------------------------------------------------------------------------
# 5. The team and its one role chain. A `Team` holds what every role needs; `run_chain` runs roles
#    one after the other over problems, one `sample` call per role for all of them. train.py's
#    rollout and every evaluate.py method are chains (METHODS); the plan controls differ only by
#    which text the Coder is given as its plan. `problem_job` is where a Problem becomes a
#    sandbox.Job (public or hidden tests).

@dataclass
class Team:
    """The loaded agents (state only). model: the shared base; adapters: the roles that carry a
    loaded LoRA adapter (the others act as the bare base); the token limits of code-writing and
    plan-writing roles; pool: a sandbox.SandboxPool for methods that run public tests (Reflexion,
    MapCoder); repair_rounds, mapcoder_k, mapcoder_t: those methods' rounds and exemplars."""
    model: object
    tokenizer: object
    adapters: frozenset = frozenset()
    max_new_tokens: int = 512
    plan_max_new_tokens: int = 256
    pool: object = None
    repair_rounds: int = 2
    mapcoder_k: int = 3
    mapcoder_t: int = 5


def acting(team, role):
    """The context in which `role` acts, yielding the model: the role's adapter on, or every adapter
    off when the role has none. cot / scot / repair act as the Coder."""
    adapter = ROLES[role].adapter or role
    if adapter in team.adapters:
        return grpo.use_adapter(team.model, adapter)
    return grpo.adapters_off(team.model)


def token_limit(team, kind):
    """The token limit of a role's completion: "plan", "code", or "both" (CoT / SCoT reason and code
    in one)."""
    if kind == "plan":
        return team.plan_max_new_tokens
    if kind == "both":
        return team.max_new_tokens + team.plan_max_new_tokens
    return team.max_new_tokens


def run_chain(team, chain, problems, ctxs=None, generator=None, show=lambda text: None):
    """Run `chain` = ((role, k, temperature), ...) over problems: each role writes k outputs per
    context in one `sample` call, and each output becomes a context that carries everything the
    roles before it wrote ("plan", "program", "retrieval", ...), its raw text ("raw") and, after a
    plan, whether it was truncated ("plan_truncated").

    ctxs: a starting context per problem (default {}; e.g. {"plan": text} for a Coder given a plan).
    generator: one torch.Generator for all rows, or one per problem (every row descending from a
    problem then draws from its own).
    show(text): progress. Returns (problems, contexts, {role: Samples}) of the leaves,
    problem-major: problem i's k1 * k2 * ... leaves are consecutive.
    """
    probs = list(problems)
    ctxs = [dict(c) for c in ctxs] if ctxs is not None else [{} for _ in probs]
    gens = generator if isinstance(generator, list) else None
    samples = {}
    for role, k, temperature in chain:
        spec = ROLES[role]
        prompts = [spec.prompt(team.tokenizer, p, c) for p, c in zip(probs, ctxs)]
        limit = token_limit(team, spec.limit)
        stop = spec.stop
        if callable(stop):
            stop = stop(ctxs[0] if ctxs else {})
        what = f"sampling {role}: {len(prompts) * k} x <= {limit} tokens"
        show(what)
        with acting(team, role) as m:
            s = sample(m, team.tokenizer, prompts, group_size=k, max_new_tokens=limit,
                       temperature=temperature, stop=stop, generator=gens if gens is not None else generator,
                       progress=lambda t, n: show(f"{what} ({t}/{n} tokens)"))
        samples[role] = s
        # Row i*k+j: sample j of context i (Samples' order).
        probs = [p for p in probs for _ in range(k)]
        ctxs = [dict(c) for c in ctxs for _ in range(k)]
        gens = [g for g in gens for _ in range(k)] if gens is not None else None
        for c, p, text, truncated in zip(ctxs, probs, s.texts, s.truncated or [False] * len(s.texts)):
            c.update(spec.parse(text, p, c), raw=text)
            if spec.limit == "plan":
                c["plan_truncated"] = truncated
    return probs, ctxs, samples


@dataclass
class Attempt:
    """One candidate program for one problem."""
    program: str = ""  # extracted code ("" when the completion had none)
    raw: str = ""  # the coder's raw completion
    # The plan it came from (planner-coder: the Planner's; a control's text; CoT / SCoT: the
    # reasoning).
    plan: str = ""
    plan_truncated: bool = False  # the Planner's completion reached its token limit
    rounds: int = 0  # Reflexion / MapCoder debugging rounds used to reach this program
    # Reference plans: lines and code spans stripped, the reference's identifiers it names.
    plan_stripped: int = 0
    plan_leaks: list = field(default_factory=list)


def attempt(ctx):
    """The Attempt a chain's leaf context holds (its entries of the same names)."""
    return Attempt(**{f.name: ctx[f.name] for f in dataclasses.fields(Attempt) if f.name in ctx})


def problem_job(problem, program, cases, repeat=1, stop_on_failure=False):
    """The sandbox Job that runs `program` on `cases` (the problem's public or hidden tests) under
    its limits.

    The one place a data.Problem becomes a sandbox.Job (Reflexion, MapCoder, train.py, evaluate.py),
    as the benchmark's harness would: its prelude and program prefix (LiveBench completion: partial
    solution + answer, unless the answer repeats it). repeat / stop_on_failure: see sandbox.Job.
    """
    import sandbox  # lazy: sampling never executes code; sandbox.py does not import torch

    if problem.program_prefix and not program.startswith(problem.program_prefix):
        program = problem.program_prefix + "\n" + program
    return sandbox.Job(program=program, kind=problem.kind, cases=list(cases), setup=problem.setup,
                       fn_name=problem.entry_point, time_limit_s=problem.time_limit_s,
                       memory_limit_mb=problem.memory_limit_mb, repeat=repeat,
                       prelude=problem.prelude, stop_on_failure=stop_on_failure)


def feedback(job, result, max_cases=1):
    """What a repair prompt is told of a judged program (Reflexion, Debugger, MapCoder): its first
    failing cases (the test, or input and expected output; the verdict, what the program produced,
    the error), each part clipped at 400 characters, as valid UTF-8 (a lone surrogate would make the
    tokenizer raise). Computed in this process from the job, which holds the expected values, and
    the sandbox's result."""
    bad = [(case, t) for case, t in zip(job.cases, result.tests) if t.verdict != "passed"]
    if not bad:
        failed = f"The program failed: {result.error}" if result.error else "No tests were run."
        return "All tests passed." if result.tests else failed
    parts = []
    for case, t in bad[:max_cases]:
        lines = ([f"Test: {_truncate(case, 400)}"] if job.kind == "assert" else
                 [f"Input:\n{_truncate(case['input'], 400)}", f"Expected output:\n{_truncate(case['output'], 400)}"])
        lines += [f"Verdict: {t.verdict}"] + [f"{name}: {_truncate(text, 400)}" for name, text in
                                              (("Got", t.got), ("Error", t.error)) if text]
        parts.append("\n".join(lines))
    text = "\n\n".join(parts) + (f"\n({len(bad) - max_cases} more failing tests)" if len(bad) > max_cases else "")
    return re.sub("[\ud800-\udfff]", "\ufffd", text)


def check_public(problems, programs, pool):
    """Run each program on its problem's PUBLIC tests only: a list of (passed, feedback text).

    A program with no code is not run (feedback says so). A problem with no public tests counts as
    passed: there is nothing to repair from, and hidden tests must never leak into a prompt.
    """
    # The result without a run; the entries of the programs that do run are replaced below.
    out = [(True, "") if not p.public_tests else (False, NO_CODE_FEEDBACK) for p in problems]
    where = [k for k, (p, prog) in enumerate(zip(problems, programs)) if p.public_tests and prog.strip()]
    jobs = [problem_job(problems[k], programs[k], problems[k].public_tests) for k in where]
    for k, job, res in zip(where, jobs, pool.run(jobs) if jobs else []):
        ok = res.verdict == "passed"
        out[k] = (ok, "" if ok else feedback(job, res))
    return out


def reflexion(team, problems, ctxs, n, temperature, generator):
    """Direct coding, then up to team.repair_rounds rounds of repair from PUBLIC-test feedback. Each
    of the n attempts of a problem is repaired on its own; only attempts still failing go to the
    next round (one `sample` call per round for all of them). The last round's program is kept
    whether or not it passes."""
    probs, leaves, _ = run_chain(team, (("coder", n, temperature),), problems, ctxs, generator)
    pending = list(range(len(leaves)))
    for r in range(1, team.repair_rounds + 1):
        checks = check_public([probs[i] for i in pending], [leaves[i]["program"] for i in pending], team.pool)
        failing = [(i, fb) for i, (ok, fb) in zip(pending, checks) if not ok]
        if not failing:
            break
        _, fixed, _ = run_chain(team, (("repair", 1, temperature),), [probs[i] for i, _ in failing],
                                [dict(leaves[i], feedback=fb) for i, fb in failing], generator)
        for (i, _), c in zip(failing, fixed):
            leaves[i] = {"program": c["program"], "raw": c["raw"], "rounds": r}
        pending = [i for i, _ in failing]
    return leaves


def _mapcoder_plans(team, problems, ctxs, n, temperature, generator):
    """MapCoder's stages 1-2: n retrievals per problem, then one plan per recalled exemplar (a
    single plan from the algorithm alone when none was parsed), ranked by confidence. -> (problem,
    context, ranked plans) per run."""
    probs, runs, _ = run_chain(team, (("retriever", n, temperature),), problems, ctxs, generator)
    jobs = [(r, e) for r, c in enumerate(runs) for e in (list(range(len(c["retrieval"]["exemplars"]))) or [None])]
    _, planned, _ = run_chain(team, (("planner", 1, temperature),), [probs[r] for r, _ in jobs],
                              [dict(runs[r], exemplar=e) for r, e in jobs], generator)
    rated = [[] for _ in runs]
    for (r, _), c in zip(jobs, planned):
        rated[r].append((c["plan"], c["confidence"]))
    return [(p, c, rank_plans(ps)) for p, c, ps in zip(probs, runs, rated)]


def mapcoder(team, problems, ctxs, n, temperature, generator):
    """MapCoder: n independent runs per problem of Retrieval -> Planning (`_mapcoder_plans`) ->
    Coding -> Debugging: the current plan is coded and run on the PUBLIC tests; a failing program is
    repaired from the failing case's feedback, up to team.mapcoder_t rounds, then the next plan is
    coded, until a program passes or the plans run out. One `sample` call per role and round for all
    active runs. The last program is kept even if it fails (as in MapCoder); "rounds" counts
    debugging rounds over all plans. Hidden tests never enter a prompt."""
    runs = _mapcoder_plans(team, problems, ctxs, n, temperature, generator)
    # Per run: which plan, its program (None = not coded yet), its failing public test's feedback,
    # the debugging rounds spent on this plan and in total, and whether it is finished.
    state = [dict(plan_index=0, program=None, raw="", feedback="", this_plan=0, rounds=0, done=False) for _ in runs]
    while any(not s["done"] for s in state):
        active = [r for r, s in enumerate(state) if not s["done"]]
        to_code = [r for r in active if state[r]["program"] is None]
        for role, group in (("coder", to_code), ("debugger", [r for r in active if r not in to_code])):
            if group:
                _, out, _ = run_chain(team, ((role, 1, temperature),), [runs[r][0] for r in group],
                                      [dict(state[r], plan=runs[r][2][state[r]["plan_index"]]) for r in group],
                                      generator)
                for r, c in zip(group, out):
                    state[r].update(program=c["program"], raw=c["raw"])
                    if role == "debugger":
                        state[r]["this_plan"] += 1
                        state[r]["rounds"] += 1
        checks = check_public([runs[r][0] for r in active], [state[r]["program"] for r in active], team.pool)
        for r, (ok, fb) in zip(active, checks):
            s = state[r]
            if not ok and s["this_plan"] < team.mapcoder_t:
                s["feedback"] = fb  # debug this program next round
            elif not ok and s["plan_index"] + 1 < len(runs[r][2]):
                s.update(plan_index=s["plan_index"] + 1, this_plan=0, feedback="", program=None)
            else:
                s["done"] = True  # it passed, or its rounds and plans are spent
    # A run that moved to a new plan is always coded in the next round, so `program` is the last
    # program written.
    return [dict(program=s["program"] or "", raw=s["raw"], plan=runs[r][2][s["plan_index"]], rounds=s["rounds"])
            for r, s in enumerate(state)]


# The roles, one entry each: its prompt given the problem and what the roles before it wrote
# (`ctx`), the parse of its completion into ctx entries, its stop strings, its token limit ("plan" =
# --plan-max-new-tokens, "code" = --max-new-tokens, "both": CoT / SCoT write their reasoning and
# code in one answer, so they get both limits, as Planner + Coder do) and whose adapter it acts
# with. A new agent is one more entry.
@dataclass(frozen=True)
class Role:
    prompt: object          # (tokenizer, problem, ctx) -> the full prompt string
    parse: object           # (completion text, problem, ctx) -> the ctx entries it writes
    limit: str = "code"     # which token limit: "plan", "code" or "both"
    stop: tuple = ()        # stop strings (or a function of ctx giving them)
    adapter: str = ""       # whose adapter it acts with ("" = its own)


def _program(text, problem, ctx):
    return {"program": extract_code(text, problem.kind, problem.entry_point)}


def _retriever_prompt(tok, problem, ctx):
    # ctx["k"]: the exemplars asked for (MapCoder's k; --mapcoder-k), also where its answer is
    # stopped.
    return retriever_prompt(tok, problem, ctx.get("k", MAPCODER_K))


def _retriever_parse(text, problem, ctx):
    return {"retrieval": parse_retrieval(text, k=ctx.get("k", MAPCODER_K))}


def _retriever_stop(ctx):
    return retriever_stop(ctx.get("k", MAPCODER_K))


def _planner_prompt(tok, problem, ctx):
    """After a Retriever the Planner plans MapCoder-style from the recalled exemplars and algorithm
    (all of them, or only ctx["exemplar"] when set) and rates its confidence; otherwise it writes
    the Algorithmic Thought."""
    if "retrieval" in ctx:
        return retrieval_planner_prompt(tok, problem, ctx["retrieval"], ctx.get("exemplar"))
    return planner_prompt(tok, problem)


def _planner_parse(text, problem, ctx):
    """The plan is the pre-fill + the completion, cleaned (clean_plan); after a Retriever also its
    confidence."""
    prefix = PLAN_PREFIX if "retrieval" in ctx else plan_prefix(problem)
    plan, confidence = plan_with_confidence(text, prefix)
    return {"plan": plan, "confidence": confidence}


def _reference_prompt(tok, problem, ctx):
    return reference_plan_prompt(tok, problem)


def _reference_parse(text, problem, ctx):
    plan, removed = strip_reference_plan(PLAN_PREFIX + text, problem.reference)
    return {"plan": plan, "plan_stripped": removed, "plan_leaks": reference_leaks(plan, problem)}


def _coder_prompt(tok, problem, ctx):
    """With a plan (a Planner's, or a control's text) the Coder codes from it; without one,
    directly."""
    if "plan" in ctx:
        return coder_prompt(tok, problem, ctx["plan"])
    return direct_prompt(tok, problem)


def _reasoner_prompt(tok, problem, ctx):
    return direct_prompt(tok, problem, REASONING_PROMPTS[ctx["template"]])


def _reasoner_parse(text, problem, ctx):
    return {"program": extract_code(text, problem.kind, problem.entry_point), "plan": reasoning_before_code(text)}


def _repair_prompt(tok, problem, ctx):
    return repair_prompt(tok, problem, ctx["program"], ctx["feedback"])


def _debugger_prompt(tok, problem, ctx):
    # ctx["feedback"] is the failing PUBLIC test of ctx["program"] (train.py's needs_public_failure
    # stages).
    return debugger_prompt(tok, problem, ctx["program"], ctx["feedback"], ctx.get("plan", ""))


ROLES = {
    "retriever": Role(_retriever_prompt, _retriever_parse, stop=_retriever_stop),
    "planner": Role(_planner_prompt, _planner_parse, limit="plan", stop=PLANNER_STOP),
    # A plan written from the reference solution (evaluate.py's reference-plan), stripped of code.
    "reference-planner": Role(_reference_prompt, _reference_parse, limit="plan", stop=PLANNER_STOP,
                              adapter="planner"),
    "coder": Role(_coder_prompt, _program),
    # CoT and SCoT: the Coder reasons, then codes, in one answer
    # (REASONING_PROMPTS[ctx["template"]]).
    "reasoner": Role(_reasoner_prompt, _reasoner_parse, limit="both", adapter="coder"),
    # Reflexion: the Coder repairs its program from ctx["feedback"] of a failing PUBLIC test.
    "repair": Role(_repair_prompt, _program, adapter="coder"),
    "debugger": Role(_debugger_prompt, _program),
}
