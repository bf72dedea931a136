"""GRPO for CoRe-Code: LoRA by hand, gradient checkpointing, token log-probs and the GRPO loss.

What it is: `LoRALinear` wraps a frozen nn.Linear and holds several named adapters, so one base
model serves every agent and "all adapters off" is the KL reference (the same weights, no second
copy); adapters are saved and loaded in PEFT's file format. Per-layer activation checkpointing,
active only while training with grad. The objective as pure tensor functions: per-token log-probs
of completions (never the full (B, T, V) float32 logits), group-normalised advantages, the k3 KL
and the clipped surrogate in DeepSeekMath's form.

What it is not: a trainer (train.py glues problems, sampling, rewards and the optimizer); no
quantisation, no LoRA variants (DoRA, rsLoRA, biases), no merging for export (the saved adapter is
PEFT's, so `PeftModel.from_pretrained(base, dir).merge_and_unload()` merges it).

One step (B = prompts x G rows; ids = left-padded prompt of P columns + completion):

    add_lora(model, "coder")
    enable_checkpointing(model)
    opt = AdamW(lora_parameters(model, "coder"))
    with use_adapter(model, "coder"):
        with torch.no_grad(), adapters_off(model):
            ref = token_logprobs(model, ids, attn, P)  # (B, T) the reference: base weights
        adv, stats = group_advantages(rewards, G)      # (B,)
        logp = token_logprobs(model, ids, attn, P)     # (B, T) with grad, checkpointed
        loss, stats = grpo_loss(logp, logp.detach(), ref, adv, completion_mask)
        loss.backward()
        opt.step()

References: LoRA (Hu et al. 2021, arXiv:2106.09685); minLoRA (github.com/cccntu/minLoRA) for the
test checklist; PEFT (github.com/huggingface/peft) for the file format and A's init; GRPO (Shao et
al. 2024, "DeepSeekMath", arXiv:2402.03300, eq. 3); DAPO (arXiv:2503.14476) and Dr. GRPO
(arXiv:2503.20783) for the token-level mean; the k3 KL estimator (J. Schulman 2020, "Approximating
KL Divergence", joschu.net/blog/kl-approx.html).
"""
import contextlib
import json
import math
import os
import re
import types

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch.utils.checkpoint import checkpoint

# The attention and MLP projections of Llama/Qwen-style decoders: PEFT's usual "all linear layers
# but the head".
DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# PEFT stores keys relative to PeftModel -> LoraModel -> the HF model: this prefix on every key.
PEFT_PREFIX = "base_model.model."
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"

# ---- 1. LoRA: one wrapper per targeted nn.Linear, several named adapters, one (or none) active


class LoRALinear(nn.Module):
    """y = base(x) + (dropout(x) @ A^T @ B^T) * alpha / r, for the active adapter.

    `active` may name an adapter this module does not hold (adapters may target different
    modules): the module then acts as its base layer."""

    def __init__(self, base: nn.Linear):
        super().__init__()
        self.base_layer = base  # PEFT's attribute name too; the base stays frozen
        self.lora_A = nn.ParameterDict()  # name -> (r, in_features)
        self.lora_B = nn.ParameterDict()  # name -> (out_features, r)
        self.lora_dropout = nn.ModuleDict()  # name -> nn.Dropout or nn.Identity
        # name -> hyper-parameter, kept for adapter_config.json
        self.r, self.lora_alpha, self.scaling = {}, {}, {}
        self.active = None

    def add_adapter(self, name, r, alpha, dropout, dtype=torch.float32):
        w = self.base_layer.weight  # (out, in)
        # PEFT's default init: A ~ Kaiming-uniform (the nn.Linear default) and B = 0, so a new
        # adapter is a no-op.
        A = torch.empty(r, w.shape[1], device=w.device, dtype=dtype)  # (r, in)
        nn.init.kaiming_uniform_(A, a=math.sqrt(5))
        B = torch.zeros(w.shape[0], r, device=w.device, dtype=dtype)  # (out, r)
        self.lora_A[name] = nn.Parameter(A)
        self.lora_B[name] = nn.Parameter(B)
        self.lora_dropout[name] = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.r[name], self.lora_alpha[name], self.scaling[name] = r, alpha, alpha / r

    def forward(self, x):
        out = self.base_layer(x)  # (..., out)
        name = self.active
        if name is None or name not in self.lora_A:
            return out
        A, B = self.lora_A[name], self.lora_B[name]
        # The adapter runs in its own dtype (float32 by default) so that small updates are not
        # rounded away in bf16; it costs 2 * r * (in + out) flops per token, noise next to the
        # base layer. Sampling and the loss run this same computation, so the tokens are drawn
        # from exactly the policy whose log-probs the loss takes.
        h = self.lora_dropout[name](x).to(A.dtype)  # (..., in)
        delta = F.linear(F.linear(h, A), B) * self.scaling[name]  # (..., out)
        return out + delta.to(out.dtype)


def _matches(module_name, targets):
    """PEFT's rule: a list matches the module name or its dotted suffix; a string is a regex on the
    full name."""
    if isinstance(targets, str):
        return re.fullmatch(targets, module_name) is not None
    return any(module_name == t or module_name.endswith("." + t) for t in targets)


def _targeted(model, targets):
    """[(qualified name, module)] of the nn.Linear / LoRALinear modules `targets` selects.

    A wrapper's base_layer is not a target in its own right; the wrapper itself is (its name is
    the layer's)."""
    return [(n, m) for n, m in model.named_modules() if isinstance(m, (nn.Linear, LoRALinear))
            and not n.endswith(".base_layer") and _matches(n, targets)]


def lora_modules(model):
    """[(qualified name, LoRALinear)] in model order."""
    return [(n, m) for n, m in model.named_modules() if isinstance(m, LoRALinear)]


def adapter_names(model):
    """Names of all adapters on the model, in the order they were added."""
    return list(dict.fromkeys(name for _, m in lora_modules(model) for name in m.lora_A))


def _known(model, name):
    if name not in adapter_names(model):
        raise ValueError(f"unknown adapter {name!r}; this model has adapters {adapter_names(model)}")


def add_lora(model, name, r=16, alpha=32, dropout=0.0, targets=DEFAULT_TARGETS,
             dtype=torch.float32):
    """Add adapter `name` to every nn.Linear whose name matches `targets`; freeze every non-LoRA
    parameter.

    r=16, alpha=32 (scaling 2): our choice, because it is a common LoRA setting for 0.5B-14B code
    models and the paper's values are unknown. dtype=float32: our choice, because LoRA updates at
    lr ~1e-5 vanish in bf16 (PEFT's autocast_adapter_dtype does the same). The first adapter added
    becomes active (like peft.get_peft_model); later ones do not (like PeftModel.add_adapter):
    select them with `use_adapter`.
    """
    # Adapter names become keys of nn.ParameterDict: no dots, and not one of the dict's own
    # attribute names.
    well_formed = isinstance(name, str) and re.fullmatch(r"[A-Za-z_]\w*", name, re.ASCII)
    if not well_formed or hasattr(nn.ParameterDict, name):
        raise ValueError(f"bad adapter name {name!r}: "
                         "use letters, digits and '_' (e.g. 'planner', 'coder')")
    if not (isinstance(r, int) and r > 0):
        raise ValueError(f"LoRA rank r must be a positive int, got {r!r}")
    if name in adapter_names(model):
        raise ValueError(f"adapter {name!r} already exists on this model "
                         f"(adapters: {adapter_names(model)})")
    # Read before the new wrappers exist (they start with no adapter active).
    previous = active_adapter(model) if adapter_names(model) else name
    found = _targeted(model, targets)  # a list, so a snapshot: we replace modules while walking it
    if not found:
        raise ValueError(f"add_lora({name!r}): "
                         f"no nn.Linear module name matched targets {targets!r}")
    for full, child in found:
        if isinstance(child, nn.Linear):
            parent_name, _, child_name = full.rpartition(".")
            child = LoRALinear(child)
            setattr(model.get_submodule(parent_name), child_name, child)
        child.add_adapter(name, r, alpha, dropout, dtype)
    # Only the LoRA A and B matrices (of any adapter) are trainable.
    for pname, p in model.named_parameters():
        p.requires_grad_(".lora_A." in pname or ".lora_B." in pname)
    _set_active(model, previous)  # every wrapper, old or new, agrees on the active adapter again


def active_adapter(model):
    """The name of the active adapter, or None when adapters are off (or there are none)."""
    return next((m.active for _, m in lora_modules(model)), None)


def _set_active(model, name):
    if name is not None:
        _known(model, name)
    for _, m in lora_modules(model):
        m.active = name


@contextlib.contextmanager
def use_adapter(model, name):
    """Context manager: only adapter `name` is active inside (None: all off); the previous state
    comes back on exit."""
    previous = active_adapter(model)
    _set_active(model, name)
    try:
        yield model
    finally:
        _set_active(model, previous)



def adapters_off(model):
    """Context manager: every adapter off, so the model computes the frozen base (the GRPO
    reference policy)."""
    return use_adapter(model, None)


def lora_parameters(model, name):
    """The trainable parameters of adapter `name` (A and B of every wrapped module), for its
    optimizer."""
    _known(model, name)
    return [p for _, m in lora_modules(model) if name in m.lora_A
            for p in (m.lora_A[name], m.lora_B[name])]


# ---- 2. Save / load in PEFT's format: adapter_config.json + adapter_model.safetensors ------------

# The LoraConfig fields we write as constants.
_PEFT_FIXED = dict(peft_type="LORA", task_type="CAUSAL_LM", bias="none", fan_in_fan_out=False,
                   inference_mode=True, init_lora_weights=True, use_rslora=False, use_dora=False,
                   modules_to_save=None, rank_pattern={}, alpha_pattern={},
                   layers_to_transform=None, layers_pattern=None, revision=None)
# The LoraConfig fields that, when set, ask for what this file does not implement.
_PEFT_UNSUPPORTED = ("use_dora", "use_rslora", "fan_in_fan_out", "rank_pattern", "alpha_pattern",
                     "modules_to_save", "exclude_modules", "target_parameters",
                     "trainable_token_indices", "layer_replication", "lora_bias")


def _peft_config(model, name, base_model_name_or_path):
    """The adapter_config.json PEFT needs to rebuild the same adapter."""
    wrapped = {n: m for n, m in lora_modules(model) if name in m.lora_A}  # modules holding it
    m0 = next(iter(wrapped.values()))
    alpha = m0.lora_alpha[name]
    if float(alpha).is_integer():
        alpha = int(alpha)
    dropout = m0.lora_dropout[name]
    # Target modules: the leaf names, PEFT's usual form, when they select exactly our modules;
    # otherwise an exact regex of the full names (PEFT full-matches a string target), so a reload
    # never wraps a different set.
    targets = sorted({n.rsplit(".", 1)[-1] for n in wrapped})
    if {n for n, _ in _targeted(model, targets)} != set(wrapped):
        targets = "^(" + "|".join(re.escape(n) for n in sorted(wrapped)) + ")$"
    base = base_model_name_or_path or getattr(model, "name_or_path", "") or ""
    return dict(_PEFT_FIXED, r=m0.r[name], lora_alpha=alpha,
                lora_dropout=dropout.p if isinstance(dropout, nn.Dropout) else 0.0,
                target_modules=targets, base_model_name_or_path=base)


def save_adapter(model, name, directory, base_model_name_or_path=""):
    """Write adapter `name` to `directory` in PEFT's format, so that
    `peft.PeftModel.from_pretrained(base, directory)` loads it.

    Keys: base_model.model.<module>.lora_A.weight (r, in) and .lora_B.weight (out, r), without
    the adapter name (as PEFT writes them).
    """
    _known(model, name)
    tensors = {f"{PEFT_PREFIX}{full}.lora_{ab}.weight": getattr(m, f"lora_{ab}")[name]
               for full, m in lora_modules(model) if name in m.lora_A for ab in "AB"}
    tensors = {key: t.detach().cpu().contiguous() for key, t in tensors.items()}
    os.makedirs(directory, exist_ok=True)
    save_file(tensors, os.path.join(directory, ADAPTER_WEIGHTS), metadata={"format": "pt"})
    with open(os.path.join(directory, ADAPTER_CONFIG), "w") as f:
        json.dump(_peft_config(model, name, base_model_name_or_path), f, indent=2, sort_keys=True)


def load_adapter(model, name, directory):
    """Load a PEFT-format LoRA adapter from `directory` as adapter `name` (added first if the model
    lacks it).

    Refuses, with a clear message, the PEFT features this file does not implement (DoRA, rsLoRA,
    biases, per-module ranks, modules_to_save, transposed weights, ...) rather than loading
    something that computes otherwise.
    """
    path = os.path.join(directory, ADAPTER_CONFIG)
    if not os.path.exists(path):
        raise FileNotFoundError(f"no {ADAPTER_CONFIG} in {directory}: not a PEFT adapter directory")
    with open(path) as f:
        cfg = json.load(f)
    bad = [k for k in _PEFT_UNSUPPORTED if cfg.get(k)]
    bad += [k for k, ok in [("peft_type", cfg.get("peft_type", "LORA") == "LORA"),
                            ("bias", cfg.get("bias", "none") == "none"),
                            ("layers_to_transform", cfg.get("layers_to_transform") is None)]
            if not ok]
    if bad:
        raise ValueError(f"{directory}: unsupported PEFT adapter settings {bad} "
                         "(only plain LoRA is implemented)")
    if name not in adapter_names(model):
        add_lora(model, name, r=cfg["r"], alpha=cfg["lora_alpha"],
                 dropout=cfg.get("lora_dropout", 0.0), targets=cfg["target_modules"])
    modules = {n: m for n, m in lora_modules(model) if name in m.lora_A}
    expected = {f"{PEFT_PREFIX}{n}.lora_{ab}.weight" for n in modules for ab in "AB"}
    tensors = load_file(os.path.join(directory, ADAPTER_WEIGHTS))
    # Some PEFT versions keep the adapter name in the key (lora_A.default.weight): drop it.
    tensors = {re.sub(r"\.(lora_[AB])\.[^.]+\.weight$", r".\1.weight", k): v
               for k, v in tensors.items()}
    missing = sorted(expected - tensors.keys())
    unexpected = sorted(tensors.keys() - expected)
    if missing or unexpected:
        raise ValueError(f"{directory}: adapter keys do not fit this model: missing {missing[:3]} "
                         f"({len(missing)}), unexpected {unexpected[:3]} ({len(unexpected)})")
    with torch.no_grad():
        for key, value in tensors.items():
            module_name, ab = key[len(PEFT_PREFIX):].rsplit(".", 2)[:2]
            param = getattr(modules[module_name], ab)[name]
            if param.shape != value.shape:
                raise ValueError(f"{directory}: {key} has shape {tuple(value.shape)}, "
                                 f"model wants {tuple(param.shape)}")
            param.copy_(value)


# ---- 3. Gradient checkpointing of the decoder layers --------------------------------------------


def _checkpointed_forward(self, *args, **kwargs):
    """A decoder layer's forward that keeps no activations and recomputes them in backward."""
    inner = self._corecode_inner_forward
    # The sampler (no_grad) and evaluation (eval mode) run the layer as is: nothing to recompute,
    # and the KV cache is allowed.
    if not (self.training and torch.is_grad_enabled()):
        return inner(*args, **kwargs)
    # A KV cache would be written twice (forward, then the recompute): drop it as HF's own
    # checkpointing does (both names: transformers 5 renamed past_key_values).
    kwargs.update({k: None for k in ("cache", "past_key_values") if kwargs.get(k) is not None})
    if kwargs.get("use_cache"):
        kwargs["use_cache"] = False
    # The recompute runs in backward, possibly after `use_adapter` has exited and another adapter is
    # active: it must replay the adapters active NOW, or it computes another graph (wrong gradients,
    # or torch's "different number of tensors" error). So pin them for the recompute.
    loras = [m for m in self.modules() if isinstance(m, LoRALinear)]
    active = [m.active for m in loras]

    def replay(*a, **k):
        current = [m.active for m in loras]
        for m, name in zip(loras, active):
            m.active = name
        try:
            return inner(*a, **k)
        finally:
            for m, name in zip(loras, current):
                m.active = name

    # use_reentrant=False: gradients reach the LoRA parameters even though the layer's input may not
    # require grad (frozen embeddings), keyword arguments pass through, and the RNG state is
    # replayed for dropout.
    return checkpoint(replay, *args, use_reentrant=False, **kwargs)


def enable_checkpointing(model, on=True):
    """Per-layer activation checkpointing of the decoder layers on (or off), active only while
    `model.training and torch.is_grad_enabled()`: one extra forward of the decoder in backward,
    only each layer's input kept."""
    # HF causal LMs keep the decoder body under `base_model` (Qwen2/Llama: model.model) and its
    # blocks in `.layers`.
    layers = getattr(getattr(model, "base_model", model), "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise ValueError(f"{type(model).__name__}: "
                         "no decoder layers found at model.base_model.layers")
    for layer in layers:
        enabled = "_corecode_inner_forward" in layer.__dict__
        if on and not enabled:
            # Keep whatever forward the layer had (its class's, or e.g. an accelerate hook's) and
            # put ours in front as an instance attribute; a bound method survives copy.deepcopy
            # (it rebinds to the copy).
            layer._corecode_inner_forward = layer.forward
            layer.forward = types.MethodType(_checkpointed_forward, layer)
        elif not on and enabled:
            inner = layer.__dict__.pop("_corecode_inner_forward")
            del layer.forward
            if getattr(inner, "__func__", None) is not getattr(type(layer), "forward", None):
                layer.forward = inner  # it was an instance-level forward before us: put it back


# ---- 4. Token log-probabilities of completions: a chunked output layer --------------------------


def token_logprobs(model, input_ids, attention_mask, completion_start, chunk=256, temperature=1.0):
    """log p(token) of every completion token given everything before it: (B, T), T = L - P.

    input_ids (B, L) = left-padded prompts (P = completion_start columns) + right-padded
    completions; attention_mask (B, L) is 1 on real tokens. Positions come from the mask
    (cumsum - 1, as HF generate), so left padding does not shift a prompt; padding positions are
    not scored and hold 0. temperature: softmax(logits / T), the distribution the sampler drew
    from; policy, old and reference log-probs must all use it (as TRL and verl do), or tokens
    drawn at T != 1 bias the gradient.

    Compute: one forward of the decoder over the whole (B, L) batch; callers cut the columns that
    are padding in every row (train.micro_batches). Memory: the output layer and log-softmax see
    at most `chunk` real completion tokens at a time. chunk=256: our choice, because on the 0.5B
    model (152k vocabulary) its float32 buffer is 156 MB whatever the batch, where full logits of
    8 x 512 tokens are 2.5 GB per copy (chunking takes a LoRA step over 8 x 512 tokens from
    15.5 GB to 9.4 GB with the same gradient), and 256 rows keep the matmuls at full speed.
    Assumes logits = lm_head(hidden): no soft-capping (Qwen2/Llama have none).
    """
    if not temperature > 0:
        raise ValueError(f"token_logprobs needs temperature > 0, got {temperature}")
    P = int(completion_start)
    L = input_ids.shape[1]
    if not 1 <= P <= L:
        raise ValueError(f"completion_start must be in [1, {L}] for input of length {L}, "
                         f"got {completion_start}")
    head = model.get_output_embeddings()
    if not isinstance(head, nn.Linear):
        raise ValueError("token_logprobs needs a plain nn.Linear output layer, "
                         f"got {type(head).__name__}")
    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)  # (B, L)
    out = model.base_model(input_ids=input_ids, attention_mask=attention_mask,
                           position_ids=position_ids, use_cache=False)
    hidden = out.last_hidden_state  # (B, L, H)
    valid = attention_mask[:, P:].bool()  # (B, T)
    h = hidden[:, P - 1:L - 1][valid]  # (N, H): position j predicts token j + 1
    targets = input_ids[:, P:][valid]  # (N,)
    lp = _ChunkedHeadLogprob.apply(h, head.weight, head.bias, targets, max(1, int(chunk)),
                                   float(temperature))  # (N,)
    # Scatter back to (B, T); masked_scatter keeps the result connected to the graph even when
    # N == 0.
    return lp.new_zeros(valid.shape).masked_scatter(valid, lp)  # (B, T)


class _ChunkedHeadLogprob(torch.autograd.Function):
    """log softmax((h W^T + b) / T)[target] for N rows, `rows` at a time: never more than (rows, V)
    logits alive.

    Forward keeps only h, the targets and the per-row logsumexp; backward recomputes each chunk's
    logits and turns them in place into d logp / d logits = (onehot(target) - softmax) / T:
    autograd's gradient, one buffer alive.
    """

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, rows, temperature):
        # hidden (N, H), weight (V, H), bias (V,) or None, targets (N,)
        logp = hidden.new_empty(hidden.shape[0], dtype=torch.float32)  # (N,)
        lse = torch.empty_like(logp)  # (N,)
        for s in range(0, hidden.shape[0], rows):
            logits = F.linear(hidden[s:s + rows], weight, bias).float().div_(temperature)
            # logits (n_c, V), picked (n_c,)
            picked = logits.gather(1, targets[s:s + rows, None]).squeeze(1)
            # logsumexp by hand, in place, so the chunk costs one (n_c, V) buffer rather than two.
            top = logits.amax(dim=-1, keepdim=True)  # (n_c, 1)
            lse[s:s + rows] = logits.sub_(top).exp_().sum(dim=-1).log_() + top.squeeze(1)
            logp[s:s + rows] = picked - lse[s:s + rows]
        ctx.save_for_backward(hidden, weight, bias, targets, lse)
        ctx.rows, ctx.temperature = rows, temperature
        return logp

    @staticmethod
    def backward(ctx, grad_logp):
        hidden, weight, bias, targets, lse = ctx.saved_tensors
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        grad_h = torch.zeros_like(hidden) if need_h else None  # (N, H)
        grad_w = torch.zeros_like(weight, dtype=torch.float32) if need_w else None  # (V, H)
        grad_b = torch.zeros_like(bias, dtype=torch.float32) if need_b else None  # (V,)
        rows = ctx.rows
        for s in range(0, hidden.shape[0], rows):
            h = hidden[s:s + rows]  # (n_c, H)
            # g: (n_c, V), turned in place from logits / T into d loss / d logits.
            g = F.linear(h, weight, bias).float().div_(ctx.temperature)  # recomputed logits / T
            g.sub_(lse[s:s + rows, None]).exp_()  # softmax
            g.neg_().scatter_add_(1, targets[s:s + rows, None], g.new_ones(h.shape[0], 1))
            g.mul_(grad_logp[s:s + rows, None].float() / ctx.temperature)  # chain rule through / T
            if need_h:
                grad_h[s:s + rows] = g.to(weight.dtype) @ weight  # (n_c, H)
            if need_w:
                grad_w.addmm_(g.t(), h.float())  # (V, H)
            if need_b:
                grad_b += g.sum(0)
        grad_w = grad_w.to(weight.dtype) if need_w else None
        grad_b = grad_b.to(bias.dtype) if need_b else None
        return grad_h, grad_w, grad_b, None, None, None


# ---- 5. The GRPO objective: pure functions of rewards and log-probs -----------------------------


def group_advantages(rewards, group_size, eps=1e-4, unbiased=True, std_floor=0.0):
    """A_i = (r_i - mean(group)) / (max(std(group), std_floor) + eps), where rows i*G .. i*G+G-1
    form group i.

    A group whose rewards all tie (all fail or all pass, frequent in code RL) gets exactly zero
    advantage and no policy gradient; the fraction of such groups is returned as zero_var_frac.
    eps=1e-4: DeepSeekMath's normalisation as in TRL. unbiased=True: our choice (the sample std,
    torch's and TRL's default), because the paper does not say which.

    std_floor: the smallest scale a group's differences are divided by (0 = plain GRPO). Plain
    std-normalisation makes any difference a full +-1 advantage: a group whose programs all pass
    and differ only by an efficiency bonus (at most 0.1 in rewards.py) gets the same push as one
    where half the programs fail. A floor keeps small reward differences small advantages (Dr.
    GRPO drops the division altogether).

    Returns (advantages (B,) float32 on CPU, stats dict: reward_mean, reward_std, zero_var_frac,
    adv_std).
    """
    r = torch.as_tensor(rewards, dtype=torch.float32).flatten()  # (B,)
    if group_size < 1 or r.numel() == 0 or r.numel() % group_size:
        raise ValueError(f"{r.numel()} rewards do not split into groups of {group_size}")
    g = r.view(-1, group_size)  # (n_groups, G)
    tied = g.amax(1, keepdim=True) == g.amin(1, keepdim=True)  # (n_groups, 1)
    mean = g.mean(1, keepdim=True)  # (n_groups, 1)
    std = g.std(1, keepdim=True, unbiased=unbiased) if group_size > 1 else torch.zeros_like(mean)
    # torch.where, not arithmetic: mean() of equal floats can differ from them in the last bit, and
    # that difference divided by eps would be a non-zero advantage for a group without signal.
    scale = std.clamp(min=std_floor) + eps  # (n_groups, 1)
    adv = torch.where(tied, torch.zeros_like(g), (g - mean) / scale).flatten()  # (B,)
    stats = {
        "reward_mean": r.mean().item(),
        "reward_std": r.std().item() if r.numel() > 1 else 0.0,
        "zero_var_frac": tied.float().mean().item(),
        "adv_std": adv.std().item() if adv.numel() > 1 else 0.0,
    }
    return adv, stats


def kl_k3(logp, ref_logp):
    """Per-token k3 estimate of KL(pi || ref) from samples of pi: exp(d) - d - 1, d = ref - logp.

    Unbiased, always >= 0 and exactly 0 where the two agree (Schulman 2020); DeepSeekMath's GRPO
    uses it.
    """
    d = ref_logp - logp
    return torch.exp(d) - d - 1


def grpo_loss(logp, old_logp, ref_logp, advantages, mask, beta=0.04, clip_eps=0.2):
    """The GRPO loss in DeepSeekMath's form:
        -mean_i [ (1/|o_i|) sum_t ( min(rho A_i, clip(rho) A_i) - beta KL_t ) ]

    logp (B, T): log-probs under the policy being optimised (with grad). old_logp (B, T):
    log-probs at sampling time. ref_logp (B, T) or None (allowed when beta == 0): log-probs with
    all adapters off. advantages (B,). mask (B, T): 1 on completion tokens INCLUDING the EOS (the
    model is credited for stopping), 0 on padding. beta=0.04 (DeepSeekMath), clip_eps=0.2
    (PPO/GRPO): defaults from the literature, because the paper's are unknown.

    With one optimisation pass per batch, old_logp == logp.detach(), so rho == 1 everywhere,
    clipping never binds and the gradient is REINFORCE with the group baseline (plus the KL term).
    Ratio and clipping only matter when the same batch is optimised more than once (several passes
    or mini-batches). Returns (loss scalar, stats dict of floats: loss, kl, clip_frac, ratio_mean,
    adv_std, entropy).
    """
    if beta != 0 and ref_logp is None:
        raise ValueError("grpo_loss: beta != 0 needs ref_logp (log-probs with adapters_off)")
    m = mask.bool()  # (B, T)
    A = advantages.to(device=logp.device, dtype=logp.dtype)[:, None]  # (B, 1); it comes on CPU
    # Zero the exponent on padding BEFORE exp: padding may hold anything, and exp(inf) * 0 would be
    # NaN in the gradient even though the value is masked out afterwards.
    ratio = torch.exp(torch.where(m, logp - old_logp, 0.0))  # (B, T)
    clipped = ratio.clamp(1 - clip_eps, 1 + clip_eps)  # (B, T)
    surrogate = torch.minimum(ratio * A, clipped * A)  # (B, T)
    kl = None
    if ref_logp is not None:
        kl = kl_k3(torch.where(m, logp, 0.0), torch.where(m, ref_logp, 0.0))  # (B, T)
    per_token = surrogate  # (B, T)
    if beta != 0:
        per_token = surrogate - beta * kl
    lengths = m.sum(1).clamp(min=1)  # (B,) an empty completion scores 0 instead of 0/0
    per_seq = torch.where(m, per_token, 0.0).sum(1) / lengths  # (B,)
    # DeepSeekMath: each completion weighs the same, whatever its length. DAPO / Dr. GRPO divide the
    # sum over all tokens by the token count (or a constant) so long completions are not diluted:
    #   loss = -torch.where(m, per_token, 0.0).sum() / m.sum().clamp(min=1)
    loss = -per_seq.mean()

    with torch.no_grad():
        n_tok = m.sum().clamp(min=1)

        def tok_mean(x):
            return (torch.where(m, x, 0.0).sum() / n_tok).item()

        # Clipping binds where it zeroes the gradient: ratio above 1+eps with A > 0, or below 1-eps
        # with A < 0.
        binds = ((ratio > 1 + clip_eps) & (A > 0)) | ((ratio < 1 - clip_eps) & (A < 0))  # (B, T)
        stats = {
            "loss": loss.item(),
            "kl": tok_mean(kl) if kl is not None else 0.0,
            "clip_frac": tok_mean(binds.float()),
            "ratio_mean": tok_mean(ratio),
            "adv_std": advantages.float().std().item() if advantages.numel() > 1 else 0.0,
            # Mean -log p of the sampled tokens: a Monte-Carlo estimate of the policy's entropy
            # (exact in expectation only for tokens sampled from this policy at temperature 1),
            # not the full-vocabulary sum.
            "entropy": tok_mean(-logp),
        }
    return loss, stats
