"""The CUDA-only branches of train.py, grpo.py and agents.py, reached on a CPU through stubs.

No GPU here: torch.cuda and torch.distributed calls are monkeypatched to record what they were given, and the meta
device stands in for a GPU where a tensor's device is what matters (a tensor made on the CPU by mistake then shows).
What only a real GPU can show (speed, nccl itself, bf16 numerics) is listed in README ("What holds on CUDA").
"""
import random
import time
import types

import numpy as np
import pytest
import torch

import agents
import grpo
import train


class Collective(Exception):
    """Raised by a stub collective once it has recorded its input: meta tensors hold no values to sum."""


def torchrun_env(monkeypatch, rank=1, world=2, cuda=True):
    """What torchrun's environment and a CUDA machine look like to dist_setup; returns the recorded calls."""
    calls = []
    monkeypatch.setenv("WORLD_SIZE", str(world))
    monkeypatch.setenv("LOCAL_RANK", str(rank))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: calls.append(("set_device", str(d))))
    monkeypatch.setattr(grpo.dist, "is_initialized", lambda: False)
    monkeypatch.setattr(grpo.dist, "init_process_group", lambda backend, **kw: calls.append(("init", backend)))
    monkeypatch.setattr(grpo.dist, "get_rank", lambda: rank)
    monkeypatch.setattr(grpo.dist, "get_world_size", lambda: world)
    return calls


def test_dist_setup_runs_a_cuda_rank_on_nccl_and_its_local_gpu(monkeypatch):
    calls = torchrun_env(monkeypatch)
    assert grpo.dist_setup(None) == (1, 2, "cuda:1")
    assert calls == [("set_device", "cuda:1"), ("init", "nccl")]


def test_dist_setup_puts_a_bare_cuda_device_on_the_local_rank(monkeypatch):
    torchrun_env(monkeypatch)
    assert grpo.dist_setup("cuda")[2] == "cuda:1"


@pytest.mark.parametrize("device", ["cuda:0", "cuda:1"])
def test_dist_setup_puts_an_explicit_cuda_device_on_the_local_rank(monkeypatch, device):
    # --device cuda:0 kept as given put both ranks on one GPU: nccl fails at the first collective.
    calls = torchrun_env(monkeypatch, rank=1)
    assert grpo.dist_setup(device) == (1, 2, "cuda:1") and calls[0] == ("set_device", "cuda:1")


def test_dist_setup_runs_a_cpu_run_on_gloo_even_where_cuda_is_visible(monkeypatch):
    calls = torchrun_env(monkeypatch)
    assert grpo.dist_setup("cpu") == (1, 2, "cpu")
    assert calls == [("init", "gloo")]  # nccl would get CPU gradients; no GPU is claimed either


def test_sum_gradients_gives_collectives_only_tensors_on_the_run_device(monkeypatch):
    # The torchrun + nccl crash: the skipped-step flag was made on the CPU, and nccl has no CPU backend.
    seen = []

    def all_reduce(t, *a, **kw):
        seen.append(t.device)
        raise Collective

    monkeypatch.setattr(grpo, "rank_and_world", lambda: (0, 2))
    monkeypatch.setattr(grpo.dist, "all_reduce", all_reduce)
    meta = torch.device("meta")
    params = [torch.nn.Parameter(torch.zeros(3, 2, device=meta)) for _ in range(2)]
    params[0].grad = torch.zeros(3, 2, device=meta)  # the other has none yet (a rank without rows)
    run = types.SimpleNamespace(world=2, device=meta, params=params)
    with pytest.raises(Collective):
        train.sum_gradients(run, False)
    assert seen == [meta]


def test_read_eval_gives_every_rank_rank_zeros_rows(monkeypatch, tmp_path):
    # Rank 1 cannot see rank 0's step-0 file (no shared filesystem); it must still take rank 0's branch.
    sent = {"direct": {"mbpp/601": True}}

    def broadcast(box, src):
        assert src == 0 and box == [{}]  # rank 1 reads nothing itself
        box[0] = sent

    monkeypatch.setattr(grpo, "rank_and_world", lambda: (1, 2))
    monkeypatch.setattr(grpo.dist, "broadcast_object_list", broadcast)
    assert train.read_eval(str(tmp_path), 0) == sent


def test_main_leaves_the_process_group_even_when_it_fails(monkeypatch, tmp_path):
    left = []
    monkeypatch.setattr(grpo, "dist_setup", lambda device: (0, 2, "cpu"))
    monkeypatch.setattr(grpo, "dist_teardown", lambda: left.append(True))
    with pytest.raises(SystemExit):  # 1 problem per step for 2 ranks: refused after the group is up
        train.main(["--stage", "toy", "--problems-per-step", "1", "--out", str(tmp_path)])
    assert left == [True]


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
