"""On the GPU, whatever the kernel: the op's varlen path on real CUDA tensors, through the real
generated dispatcher over stub buckets (tests/dispatch_stub.py: they record the call and launch
nothing). Every pointer, length and the stream reach the library; out, lse and the workspace
come from torch's allocator, and the call is legal inside a CUDA graph capture from its first
use (no host sync, no allocation outside PyTorch); transformers' packed batches reach it from
a real Llama model. The varlen kernel's numbers are not checked here."""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest
from dispatch_stub import build_stub_library

from tuner import dispatch
from tuner.workload import workload_from_dict

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch", reason="the op tests need PyTorch with CUDA")
if not torch.cuda.is_available():  # pragma: no cover - a GPU host without CUDA torch
    pytest.skip("torch has no CUDA here (pip install torch with CUDA)", allow_module_level=True)
ops = pytest.importorskip("tuner.fa_tune_ops")

BF16 = torch.bfloat16
HQ, HKV, D = 32, 8, 128
TWO = {  # stub bucket 0 serves max_seqlen <= 2048, bucket 1 the rest (workspace 1000(i+1)+n)
    "name": "two",
    "attention": {"Hq": HQ, "Hkv": HKV, "head_dim": D, "causal": True},
    "buckets": [{"name": "short", "max_s": 2048}, {"name": "long", "max_s": None}],
    "traffic": {"shapes": [{"B": 1, "S": 1024}]},
}


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory):
    """The stub library loaded as the op's; returns a function giving its last varlen call."""
    w = workload_from_dict(TWO)
    t = dispatch.table_for_workload(w, dispatch.bucket_sources(w, default="preset:default"))
    lib = ops.load(str(build_stub_library(t, Path(tmp_path_factory.mktemp("stub")))))
    fn = lib._lib.stub_varlen
    fn.restype, fn.argtypes = ctypes.c_longlong, [ctypes.c_int]
    return lambda: [fn(j) for j in range(15)]


def _packed(total: int) -> tuple[torch.Tensor, ...]:
    return (torch.empty(total, HQ, D, device="cuda", dtype=BF16),
            torch.empty(total, HKV, D, device="cuda", dtype=BF16),
            torch.empty(total, HKV, D, device="cuda", dtype=BF16))


def test_varlen_arguments_reach_the_library(recorded) -> None:
    q, k, v = _packed(5000)
    cu = torch.tensor([0, 1000, 3000, 5000], dtype=torch.int32, device="cuda")
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        out, lse = ops.attention(q, k, v, True, 0.1, cu, 2000)
    got = recorded()
    assert got[:6] == [q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), lse.data_ptr(),
                       cu.data_ptr()]
    assert got[6] != 0 and got[7] == side.cuda_stream  # torch's workspace, torch's stream
    assert got[8:] == [3, 5000, 2000, HQ, HKV, 100, 1003]  # bucket 0's workspace for 3 seqs
    assert out.shape == q.shape and out.dtype == BF16
    assert lse.shape == (HQ, 5000) and lse.dtype == torch.float32


def test_varlen_is_captured_on_first_use(recorded) -> None:
    """No prepare, no sync: the first varlen call of a shape may be inside a capture."""
    q, k, v = _packed(4321)
    cu = torch.tensor([0, 4000, 4321], dtype=torch.int32, device="cuda")
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = ops.attention(q, k, v, True, None, cu, 4000)
    got = recorded()
    assert got[3:5] == [out.data_ptr(), lse.data_ptr()] and got[8:11] == [2, 4321, 4000]
    assert got[14] == 2002  # bucket 1's workspace
    graph.replay()
    torch.cuda.synchronize()


def test_transformers_packed_batches_reach_varlen(recorded) -> None:
    """A Llama layer with attn_implementation="fa_tune": sequences packed by position_ids, and
    by FlashAttention's kwargs, run the varlen path with their lengths."""
    transformers = pytest.importorskip("transformers", reason="pip install transformers")
    ops.register_hf()
    cfg = transformers.LlamaConfig(hidden_size=HQ * D, num_attention_heads=HQ,
                                   num_key_value_heads=HKV, head_dim=D, intermediate_size=256,
                                   vocab_size=64, num_hidden_layers=1)
    model = transformers.LlamaForCausalLM(cfg).to("cuda", BF16).eval()
    model.set_attn_implementation("fa_tune")
    lengths = [5, 3, 8]
    ids = torch.randint(0, 64, (1, sum(lengths)), device="cuda")
    pos = torch.cat([torch.arange(n, device="cuda") for n in lengths])[None]
    with torch.no_grad():
        model(input_ids=ids, position_ids=pos, use_cache=False)
        assert recorded()[8:11] == [3, 16, 8]
        cu = torch.tensor([0, 10, 16], dtype=torch.int32, device="cuda")
        model(input_ids=ids, position_ids=torch.cat([torch.arange(10), torch.arange(6)])[None]
              .to("cuda"), cu_seq_lens_q=cu, cu_seq_lens_k=cu.clone(), max_length_q=10,
              max_length_k=10, use_cache=False)
        assert recorded()[8:11] == [2, 16, 10]
