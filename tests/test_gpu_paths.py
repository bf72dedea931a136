"""The CUDA-only branches of train.py, grpo.py and agents.py, reached on a CPU through stubs.

No GPU here: torch.cuda calls are monkeypatched to record what they were given, and the meta device stands in
for a GPU where a tensor's device is what matters (a tensor made on the CPU by mistake then shows). What only a
real GPU can show (speed, bf16 numerics) is listed in README ("What holds on CUDA").
"""
import random
import time
import types

import numpy as np
import pytest
import torch

import agents
import train


@pytest.mark.parametrize("bf16", [True, False])
def test_resolve_dtype_on_cuda_is_bf16_else_fp16(monkeypatch, bf16):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **kw: bf16)
    assert agents.resolve_dtype("auto", "cuda:0") == (torch.bfloat16 if bf16 else torch.float16)


def test_training_refuses_fp16_in_one_line(monkeypatch, tmp_path, capsys):
    # --dtype auto on a GPU without bf16 gives fp16, and train.py has no loss scaler.
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **kw: False)
    with pytest.raises(SystemExit) as e:
        train.main(["--stage", "toy", "--device", "cuda", "--out", str(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and "\n" not in err and "loss scaling" in err


def test_rng_round_trip_includes_the_run_cuda_device(monkeypatch):
    gpu = {"cuda:1": torch.tensor([7], dtype=torch.uint8)}  # a stand-in for cuda:1's generator state
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda d: gpu[str(d)].clone())
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda s, d: gpu.__setitem__(str(d), s))
    device = torch.device("cuda:1")
    state = train.rng_states(device)
    draws = (random.random(), np.random.rand(), torch.rand(1), gpu["cuda:1"].fill_(9))
    train.set_rng_states(state, device)
    assert (random.random(), np.random.rand(), torch.rand(1)) == draws[:3]
    assert gpu["cuda:1"].tolist() == [7] and len(state["cuda"]) == 1  # only the run's device was saved


def test_seconds_since_waits_for_the_cuda_device(monkeypatch):
    synced = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda d: synced.append(str(d)))
    t0 = time.time()
    train.seconds_since(t0, torch.device("cpu"))
    assert train.seconds_since(t0, torch.device("cuda:1")) >= 0 and synced == ["cuda:1"]


def test_token_copy_is_waited_for_on_the_sampling_device_s_stream(monkeypatch):
    # Event.record() without a stream records on the CURRENT device's stream: with --device cuda:1 outside torchrun
    # that is cuda:0's, which does not order the copy running on cuda:1; the host then read the pinned buffer's fill.
    recorded, copies = [], []

    class Event:
        def record(self, stream=None):
            recorded.append(stream)

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: f"stream of {device}")
    dst = types.SimpleNamespace(copy_=lambda src, non_blocking=False: copies.append(non_blocking))
    assert isinstance(agents._to_host(dst, types.SimpleNamespace(device=torch.device("cuda:1"))), Event)
    assert copies == [True] and recorded == ["stream of cuda:1"]


def test_the_decode_loop_reads_the_device_only_through_the_token_copy(tiny_model_dir, monkeypatch):
    # "All rows finished" was a blocking .cpu() of the device's flags after the next forward was queued: on a GPU
    # the host waited for that forward. Now every host read inside the loop is the step's non-blocking token copy.
    model, tok = agents.load_model(tiny_model_dir, device="cpu", dtype="float32")
    in_loop, real_cpu, real_step = [], torch.Tensor.cpu, agents.decode_one_token

    def cpu(t, *a, **kw):
        assert not in_loop, "a blocking device-to-host read inside the decode loop"
        return real_cpu(t, *a, **kw)

    monkeypatch.setattr(torch.Tensor, "cpu", cpu)
    monkeypatch.setattr(agents, "decode_one_token", lambda *a: in_loop.append(1) or real_step(*a))
    prompts = [agents.chat_prompt(tok, "You write Python.", u) for u in ("hi", "Write a function to sort a list.")]
    s = agents.sample(model, tok, prompts, group_size=3, max_new_tokens=32, temperature=1.0, seed=0,
                      eos_token_ids=list(range(3, 203)))  # half the vocabulary ends a row
    assert in_loop and s.completion_mask.shape[1] < 32  # the loop ran, and it stopped when every row had ended
