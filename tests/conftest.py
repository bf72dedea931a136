"""Shared pytest fixtures: a tiny random Qwen2 model directory built in-process (nothing downloaded)."""
import os
import sys

import pytest

# Tests import the top-level modules (agents, grpo, ...) and the tiny-model helper directly.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from tiny_model import build_tiny_model  # noqa: E402

MBPP_PATH = os.path.join(ROOT, "..", "shared", "data", "mbpp.jsonl")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """Path of a tiny random Qwen2 model dir (config.json, model.safetensors, tokenizer files)."""
    return build_tiny_model(str(tmp_path_factory.mktemp("tiny-qwen2")))


@pytest.fixture(scope="session")
def mbpp_path():
    """Path of the shared MBPP file; tests that need it skip cleanly when it is absent."""
    path = os.environ.get("CORECODE_MBPP", MBPP_PATH)
    if not os.path.exists(path):
        pytest.skip(f"MBPP not found at {path}")
    return path
