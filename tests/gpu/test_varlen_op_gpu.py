"""On the GPU, whatever the kernel: the op on real CUDA tensors through the real generated
dispatcher over stub buckets (tests/dispatch_stub.py: they record the C ABI argument struct
and launch nothing). Every pointer, stride, length, the status words and the stream reach the
library; strided views go as they are, a layout TMA cannot read is copied (said once); out,
lse and the workspace come from torch's allocator, and a call with device metadata is legal
inside a CUDA graph capture from its first use (no host sync, no allocation outside PyTorch);
bad metadata (the stub writes the status words as the kernel does) raises at the next call, at
check(), or at once in sync-check mode; transformers' packed batches reach the varlen path from
a real Llama model. The kernel's numbers are not checked here (test_inference_op_gpu.py)."""

from __future__ import annotations

import ctypes
import warnings
from pathlib import Path

import pytest
from dispatch_stub import build_stub_library, last_args

from tuner.ship import dispatch
from tuner.ship.workload import workload_from_dict

pytestmark = pytest.mark.gpu
from op_exports import cuda_torch  # noqa: E402

torch = cuda_torch()
ops = pytest.importorskip("tuner.ship.fa_tune_ops")
from tuner.ship.fa_tune_ops import abi, checks, status  # noqa: E402

BF16 = torch.bfloat16
HQ, HKV, D = 32, 8, 128
TWO = {  # stub bucket 0 serves S_q <= 2048, bucket 1 the rest (workspace 1000 (i + 1) + batch)
    "name": "two",
    "attention": {"Hq": HQ, "Hkv": HKV, "head_dim": D, "causal": True},
    "buckets": [{"name": "short", "max_s": 2048}, {"name": "long", "max_s": None}],
    "traffic": {"shapes": [{"B": 1, "S": 1024}]},
}


@pytest.fixture(scope="module")
def lib(tmp_path_factory: pytest.TempPathFactory):
    """The stub library loaded as the op's."""
    w = workload_from_dict(TWO)
    t = dispatch.table_for_workload(w, dispatch.bucket_sources(w, default="preset:default"))
    loaded = ops.load(str(build_stub_library(t, Path(tmp_path_factory.mktemp("stub")))))
    loaded._lib.stub_last_stream.restype = ctypes.c_void_p
    return loaded


def _got(lib):
    return last_args(lib._lib)


def _t(*shape: int) -> torch.Tensor:
    return torch.empty(*shape, device="cuda", dtype=BF16)


def _ints(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32, device="cuda")


def test_packed_q_and_k_reach_the_library(lib) -> None:
    q, k, v = _t(5000, HQ, D), _t(9000, HKV, D), _t(9000, HKV, D)
    cu_q, cu_k = _ints([0, 1000, 3000, 5000]), _ints([0, 3000, 6000, 9000])
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        out, lse = ops.attention(q, k, v, True, 0.1, cu_q, cu_k, 2000, 3000)
    a = _got(lib)
    assert (a.q, a.k, a.v, a.o, a.lse) == (q.data_ptr(), k.data_ptr(), v.data_ptr(),
                                           out.data_ptr(), lse.data_ptr())
    assert (a.cu_seqlens_q, a.cu_seqlens_k, a.seqused_k) == (cu_q.data_ptr(), cu_k.data_ptr(),
                                                             None)
    assert list(a.q_stride)[1:] == [HQ * D, D] and list(a.k_stride)[1:] == [HKV * D, D]
    assert (a.batch, a.total_q, a.total_k, a.seqlen_q, a.seqlen_k) == (3, 5000, 9000, 2000, 3000)
    assert (a.heads_q, a.heads_kv, a.head_dim, a.causal) == (HQ, HKV, D, 1)
    assert abs(a.softmax_scale - 0.1) < 1e-7 and a.abi_version == abi.ABI_VERSION
    assert a.status == status._status[torch.cuda.current_device()][0].data_ptr()
    assert a.workspace and a.workspace_bytes == 1003  # bucket 0's, from torch's allocator
    assert lib._lib.stub_last_stream() == side.cuda_stream
    assert out.shape == q.shape and lse.shape == (HQ, 5000)


def test_strided_views_go_as_they_are(lib) -> None:
    """Fused QKV views and a [B, H, S, D] cache read as BSHD: their pointers and strides."""
    fused = _t(2, 512, (HQ + 2 * HKV) * D).view(2, 512, HQ + 2 * HKV, D)
    q, k, v = fused[:, :, :HQ], fused[:, :, HQ:HQ + HKV], fused[:, :, HQ + HKV:]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no copy, so no CopyWarning
        out, _ = ops.attention(q, k, v)
        a = _got(lib)
        assert (a.q, a.k, a.v) == (q.data_ptr(), k.data_ptr(), v.data_ptr())
        assert list(a.q_stride) == list(q.stride()[:3]) and list(a.v_stride) == list(
            v.stride()[:3])
        assert out.is_contiguous() and out.shape == q.shape
        cache = _t(2, HKV, 4096, D)  # transformers' DynamicCache memory
        qc = _t(2, 300, HQ, D)
        ops.attention(qc, cache.transpose(1, 2), cache.transpose(1, 2))
        a = _got(lib)
        assert a.k == cache.data_ptr() and list(a.k_stride) == [HKV * 4096 * D, D, 4096 * D]
        assert (a.seqlen_q, a.seqlen_k) == (300, 4096)
        # A cache with per-entry lengths (flash_attn_with_kvcache's cache_seqlens).
        lens = _ints([3000, 17])
        ops.attention(qc, cache.transpose(1, 2), cache.transpose(1, 2), cache_seqlens=lens)
        a = _got(lib)
        assert a.seqused_k == lens.data_ptr() and not a.cu_seqlens_q and a.batch == 2
        assert a.workspace_bytes == 1002 and a.status


def test_a_misaligned_view_is_copied_and_said_once(lib) -> None:
    q, v = _t(1, 256, HQ, D), _t(1, 256, HKV, D)
    odd = _t(1 * 256 * HKV * D + 1).narrow(0, 1, 256 * HKV * D).view(1, 256, HKV, D)
    checks._warned.clear()
    with pytest.warns(checks.CopyWarning, match="copies k .*16-byte boundary"):
        ops.attention(q, odd, v)
    assert _got(lib).k not in (odd.data_ptr(), 0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ops.attention(q, odd, v)  # copied again, silently


def test_metadata_calls_are_captured_on_first_use(lib) -> None:
    """No prepare, no sync: the first call with device metadata of a bucket may be inside a
    capture (the device's status words exist from its first call of any kind)."""
    q, k, v = _t(4321, HQ, D), _t(4321, HKV, D), _t(4321, HKV, D)
    cu = _ints([0, 4000, 4321])
    ops.attention(_t(1, 64, HQ, D), _t(1, 64, HKV, D), _t(1, 64, HKV, D))
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = ops.attention(q, k, v, True, None, cu, cu, 4000, 4000)
    a = _got(lib)
    assert (a.o, a.lse) == (out.data_ptr(), lse.data_ptr()) and a.batch == 2
    assert a.workspace_bytes == 2002  # bucket 1's
    graph.replay()
    torch.cuda.synchronize()


def test_bad_metadata_raises_at_the_next_call(lib) -> None:
    """The stub writes FA_TUNE_BAD_CU_SEQLENS_K and sequence 5 when max_seqlen_q is 666, as
    the kernel's schedule does for bad metadata."""
    q, k, v = _t(1000, HQ, D), _t(1000, HKV, D), _t(1000, HKV, D)
    cu = _ints([0, 500, 1000])
    ops.attention(q, k, v, True, None, cu, cu, 666, 666)  # no sync: returns
    with pytest.raises(ValueError) as e:
        ops.attention(q, k, v, True, None, cu, cu, 600, 600)
    assert str(e.value).startswith(
        "fa_tune::attention: an earlier call on cuda:0 had bad device metadata: cu_seqlens_k "
        "does not run from 0, non-decreasing, within the key rows (first at sequence 5); "
        "its out and lse are NaN")
    ops.attention(q, k, v, True, None, cu, cu, 600, 600)  # cleared: the next one runs
    ops.attention(q, k, v, True, None, cu, cu, 666, 666)
    with pytest.raises(ValueError, match="a call on cuda:0 had bad device metadata"):
        ops.check()
    ops.check()
    ops.set_sync_check(True)
    try:
        with pytest.raises(ValueError, match="this call on cuda:0 had bad device metadata"):
            ops.attention(q, k, v, True, None, cu, cu, 666, 666)
        ops.attention(q, k, v, True, None, cu, cu, 600, 600)
    finally:
        ops.set_sync_check(False)


def test_stats_count_the_kernel_calls(lib) -> None:
    ops.reset_stats()
    q, k = _t(1, 128, HQ, D), _t(1, 128, HKV, D)
    for _ in range(3):
        ops.attention(q, k, k)
    assert ops.stats() == {"fa_tune": 3}


def test_transformers_packed_batches_reach_varlen(lib) -> None:
    """A Llama layer with attn_implementation="fa_tune": sequences packed by position_ids, and
    by FlashAttention's kwargs, run the varlen path with their lengths."""
    transformers = pytest.importorskip("transformers", reason="pip install transformers")
    ops.register_hf()
    cfg = transformers.LlamaConfig(hidden_size=HQ * D, num_attention_heads=HQ,
                                   num_key_value_heads=HKV, head_dim=D, intermediate_size=256,
                                   vocab_size=64, num_hidden_layers=1)
    model = transformers.LlamaForCausalLM(cfg).to("cuda", BF16).eval()
    model.set_attn_implementation("fa_tune")
    lengths = [70, 64, 80]
    ids = torch.randint(0, 64, (1, sum(lengths)), device="cuda")
    pos = torch.cat([torch.arange(n, device="cuda") for n in lengths])[None]
    with torch.no_grad():
        model(input_ids=ids, position_ids=pos, use_cache=False)
        a = _got(lib)
        assert (a.batch, a.total_q, a.total_k, a.seqlen_q, a.seqlen_k) == (3, 214, 214, 80, 80)
        cu = torch.tensor([0, 150, 214], dtype=torch.int32, device="cuda")
        model(input_ids=ids, position_ids=torch.cat([torch.arange(150), torch.arange(64)])[None]
              .to("cuda"), cu_seq_lens_q=cu, cu_seq_lens_k=cu.clone(), max_length_q=150,
              max_length_k=150, use_cache=False)
        a = _got(lib)
        assert (a.batch, a.total_q, a.seqlen_q) == (2, 214, 150)
