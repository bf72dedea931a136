"""A tiny random Qwen2 causal LM + byte-level BPE tokenizer with a chat template, built offline.

What it is: the one helper every test and benchmark uses to get a model directory that loads through
exactly the same code path as a real HF model (config.json + model.safetensors + tokenizer files).
What it is not: a model that can do anything useful; its weights are random (seeded).
"""
import os

# The alphabet the tokenizer is trained on: enough Python and prose that any text round-trips
# (byte-level BPE can encode any string anyway; training only decides which merges exist).
_CORPUS = [
    "def add(a, b):\n    return a + b\n",
    "assert add(1, 2) == 3\n",
    "Write a function to find the minimum of a list.\n",
    "```python\nprint(sum(map(int, input().split())))\n```\n",
    "Input/Output: Steps: Conditions: Loops: for i in range(n): if x > 0: while True: break\n",
    "The quick brown fox jumps over the lazy dog. 0123456789 ()[]{}<>=+-*/%,.:;'\"#_!?\n",
]

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def build_tokenizer(vocab_size=400):
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(_CORPUS * 4, vocab_size=vocab_size, min_frequency=1, special_tokens=specials)
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer)
    # Qwen2 style: <|im_end|> ends an assistant turn, <|endoftext|> pads.
    tok.eos_token = "<|im_end|>"
    tok.pad_token = "<|endoftext|>"
    tok.chat_template = CHAT_TEMPLATE
    return tok


def build_tiny_model(path, seed=0, num_layers=2, hidden=64, tie=True, init_std=0.02):
    """Write a tiny random Qwen2 model directory to `path` and return `path`.

    init_std: the weights' init scale. HF's default 0.02 leaves a tiny model's logits nearly flat (a frozen
    small output layer caps how peaked LoRA can make them); the learning test uses a larger one so that a
    few GRPO steps can visibly change what the model samples.
    """
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    os.makedirs(path, exist_ok=True)
    tok = build_tokenizer()
    config = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=tie,
        initializer_range=init_std,
        bos_token_id=None,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


def build_random_like(src, path, seed=0):
    """Write to `path` a model with the architecture, tokenizer and chat template of the model directory `src` and
    RANDOM weights (bf16, built on the GPU when one is visible), and return `path`.

    For timing where the real weights cannot be had (a machine without the hub, a copy limit): sampling and training
    cost depend on shapes, not values. Random weights never emit EOS, so every row runs to its token budget, and no
    program passes: not for any figure about quality.
    """
    import shutil

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(src), dtype=torch.bfloat16)
    model.save_pretrained(path)
    for name in os.listdir(src):  # tokenizer, chat template, generation config: everything but config and weights
        if name != "config.json" and ".safetensors" not in name and not name.endswith(".bin"):
            shutil.copy(os.path.join(src, name), path)
    return str(path)


def copy_arch_files(src, path):
    """Copy a model directory's small files (config.json, tokenizer, chat template, generation config) to `path`,
    without its weights: what build_random_like needs, small enough to carry with a checkout (.ci/gpu)."""
    import shutil

    os.makedirs(path, exist_ok=True)
    for name in os.listdir(src):
        if not name.startswith(".") and ".safetensors" not in name and not name.endswith((".bin", ".pt", ".gguf")):
            shutil.copy(os.path.join(src, name), path)
    return str(path)


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Build a random model directory: the tiny test model, or (--like "
                                     "DIR) one with a real model's architecture and tokenizer, for timing only; or "
                                     "(--arch-files DIR) copy DIR's config and tokenizer files.")
    parser.add_argument("out", nargs="?", default="/tmp/tiny-qwen2")
    parser.add_argument("--like", metavar="DIR", help="a model dir (config.json + tokenizer files; weights unused)")
    parser.add_argument("--arch-files", metavar="DIR", help="only copy DIR's config and tokenizer files to OUT")
    a = parser.parse_args()
    if a.arch_files:
        print(copy_arch_files(a.arch_files, a.out))
    else:
        print(build_random_like(a.like, a.out) if a.like else build_tiny_model(a.out))


# ---------------------------------------------------------------------------------------------- real models

REAL_MODEL_NAME = "qwen2.5-coder-0.5b-instruct"
GET_MODEL = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                         "shared", "models", "get-model")


def real_model_dir(name=REAL_MODEL_NAME, build=False):
    """Where slow tests and benchmarks find a real model, the way the scripts do: $CORECODE_MODEL when it is a
    directory, else the directory `../shared/models/get-model NAME` writes ($CORECODE_MODELS/NAME or
    ~/.cache/corecode/models/NAME). With build=True and get-model present, it is run to build the model (minutes
    the first time). Returns (path or None, a line saying where it looked)."""
    env = os.environ.get("CORECODE_MODEL")
    if env and os.path.isdir(env):
        return env, f"CORECODE_MODEL={env}"
    root = os.environ.get("CORECODE_MODELS") or os.path.join(os.path.expanduser("~"), ".cache", "corecode", "models")
    path = os.path.join(root, name)
    if os.path.isfile(os.path.join(path, "config.json")):
        return path, path
    if build and os.path.isfile(GET_MODEL):
        import subprocess
        import sys

        r = subprocess.run([sys.executable, GET_MODEL, name], capture_output=True, text=True)
        built = r.stdout.strip().splitlines()[-1] if r.returncode == 0 and r.stdout.strip() else ""
        if built and os.path.isdir(built):
            return built, built
    how = f"set CORECODE_MODEL=DIR, or build it with {GET_MODEL} {name}" if os.path.isfile(GET_MODEL) else \
        "set CORECODE_MODEL=DIR to a local Hugging Face model directory"
    return None, f"no real model: not in $CORECODE_MODEL, not at {path}; {how}"
