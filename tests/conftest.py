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


@pytest.fixture(scope="session")
def toy_mbpp(tmp_path_factory):
    """A small MBPP-format file of our own (train split, task ids 601-632) for tests that only need prompts: the
    toy stage rewards characters of the raw text, so the problems' content does not matter. It keeps those tests
    independent of where the real MBPP lives (CI's clean clone has no ../shared and no internet)."""
    import json

    path = tmp_path_factory.mktemp("toy-mbpp") / "mbpp.jsonl"
    with open(path, "w") as f:
        for i in range(32):
            f.write(json.dumps({"task_id": 601 + i, "text": f"Write a function to add {i} to a number.",
                                "code": f"def add_{i}(x):\n    return x + {i}\n", "test_setup_code": "",
                                "test_list": [f"assert add_{i}(1) == {1 + i}"], "challenge_test_list": []}) + "\n")
    return str(path)
