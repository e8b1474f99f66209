"""Launchables: what the gate and the timing loop call.

A launchable has ``name``, ``label``, ``writes_lse``, ``supports(problem) -> reason | None``,
``prepare(shape, stream) -> host ms`` and ``forward(bufs, stream)`` (one launch, enqueued on
``stream``, reading bufs.q/k/v). ``launch_supports`` asks a launchable (None = it can run the
problem; launchables without ``supports`` are taken to run everything). fa-tune's own
kernel is ``tuner.kernel.runtime.KernelModule`` (the one binding of the C ABI), wrapped here only to
give it a name. A peer (FlashAttention-3, cuDNN, ...; ``tuner.measure.peers``) is a torch callable;
``PeerLaunch`` puts it on the same path: torch views alias the very device buffers the oracle
filled, torch runs on the measurement stream, and ``collect`` copies the peer's output into
bufs.o / bufs.lse (outside any timed region) so the same GPU-side gate checks it.

Torch is imported only by ``PeerLaunch``: ``fa-tune run`` and the search never need it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tuner.kernel.runtime import (
    AttnBuffers,
    DeviceBuffer,
    KernelModule,
    ShapeLike,
    Stream,
    as_problem,
    problem_dims,
    stream_handle,
    tensor_view,
)
from tuner.measure.peers.base import PeerMasks, PeerPages


def launch_supports(launch: Any, problem: ShapeLike) -> str | None:
    """Why ``launch`` cannot run ``problem`` (a one-line reason), or None when it can."""
    supports = getattr(launch, "supports", None)
    return None if supports is None else supports(problem)


def default_launches(so_for: Any = None) -> Any:
    """The default config's launchable per problem (the default preset of its head dim,
    tuner.kernel.config.default_preset, built for its class through the cache: once per class),
    for ``Bench(default_launch=...)``; None for a problem it cannot serve (a build error says
    nothing about the candidate). ``so_for(pclass) -> path``: where the library comes from
    instead of building it (the search's parent builds it and tells the worker)."""
    from tuner.errors import FaTuneError
    from tuner.problem import class_of

    made: dict[Any, KernelLaunch | None] = {}

    def build(pclass: Any) -> str | None:
        from tuner.kernel.build import build_config
        from tuner.kernel.config import default_preset, load_preset

        art = build_config(load_preset(default_preset(pclass)), pclass=pclass)
        return None if getattr(art, "unfit", None) else str(art.so_path)

    def get(problem: Any) -> KernelLaunch | None:
        pclass = class_of([problem])
        if pclass not in made:
            try:
                so = (so_for or build)(pclass)
                made[pclass] = None if so is None else KernelLaunch(so, label="default")
            except (FaTuneError, OSError, KeyError):
                made[pclass] = None
        launch = made[pclass]
        return None if launch is None or launch.supports(problem) else launch

    return get


class KernelLaunch:
    """fa-tune's kernel ``.so`` through its C ABI, with a row name for reports."""

    role = "kernel"

    def __init__(self, so_path: str | Path, label: str | None = None) -> None:
        self.module = KernelModule(so_path)
        self.path = Path(so_path)
        self.label = label or "fa-tune"
        self.name = self.label

    @property
    def writes_lse(self) -> bool:
        return self.module.writes_lse

    def supports(self, problem: ShapeLike) -> str | None:
        """The library's rule (KernelModule.forward refuses the rest): its compiled head dim
        and mask; any Hkv that divides Hq."""
        return self.module.unsupported(problem)

    def prepare(self, shape: ShapeLike, stream: Stream | int | None) -> float:
        return self.module.prepare(shape, stream)

    def forward(self, bufs: AttnBuffers, stream: Stream | int | None) -> None:
        self.module.forward(bufs, stream)

    def check_status(self) -> None:
        """After a synchronised launch: raise KernelError if the device rejected a packed
        batch's metadata (the gate reports it as the set's reason)."""
        self.module.check_status()

    def collect(self, bufs: AttnBuffers, stream: Stream | int | None) -> None:
        """The kernel writes bufs.o itself: nothing to copy."""

    def details(self) -> dict[str, Any]:
        from tuner.kernel.build import sha256_file

        return {"so_path": str(self.path), "sha256": sha256_file(self.path),
                "config": self.module.config, "smem_bytes": self.module.smem_bytes()}

    def release(self) -> None:
        """Nothing held per shape."""


class _Cai:
    """A bare ``__cuda_array_interface__`` over one of our device buffers (no copy)."""

    def __init__(self, buf: DeviceBuffer, shape: tuple[int, ...], typestr: str) -> None:
        self.__cuda_array_interface__ = {
            "shape": shape, "typestr": typestr, "data": (int(buf.ptr), False),
            "version": 3, "strides": None,
        }


def torch_views(bufs: AttnBuffers) -> tuple[Any, Any, Any, Any, Any]:
    """q ([B, S_q, Hq, D] bf16), k, v ([B, S_k, Hkv, D] bf16), o ([B, S_q, Hq, D] bf16, dense)
    and lse ([B, Hq, S_q] fp32) torch tensors aliasing bufs (a packed batch: its as_fixed
    tensors, B = 1, S = the totals); returned as (q, k, v, o, lse). q, k and v are where the
    problem's layout puts them (``Problem.view``): ``torch.as_strided`` over the layout buffer
    (the fused QKV tensor, the [B, H, S, D] cache), so a peer reads the very memory, offsets and
    strides the kernel is given."""
    import torch

    B, hq, _, Sq, _, _, _ = problem_dims(bufs.shape)
    problem = as_problem(bufs.shape)
    bases: dict[str, Any] = {}

    def bf16(name: str) -> Any:
        tv = problem.view(name)
        base = bases.get(tv.buffer)
        if base is None:
            buf = (getattr(bufs, "layout_bufs", None) or {}).get(tv.buffer) or getattr(
                bufs, tv.buffer)
            # CAI has no bf16 typestr: alias the whole buffer as int16, reinterpret
            base = bases[tv.buffer] = torch.as_tensor(
                _Cai(buf, (buf.nbytes // 2,), "<i2"), device="cuda").view(torch.bfloat16)
        return torch.as_strided(base, tv.dims, (*tv.strides, 1), tv.offset)

    lse = torch.as_tensor(_Cai(bufs.lse, (B, hq, Sq), "<f4"), device="cuda")
    return bf16("q"), bf16("k"), bf16("v"), bf16("o"), lse


def peer_masks(bufs: AttnBuffers) -> PeerMasks:
    """The models' masks of the problem in bufs as a peer takes them: the window, the softcap,
    and the sinks as an FP32 [Hq] torch tensor aliasing bufs.sinks."""
    problem = as_problem(bufs.shape)
    sinks = None
    if problem.sinks:
        import torch

        buf = getattr(bufs, "sinks", None)
        if buf is None:
            raise ValueError(f"buffers of {problem} hold no sinks")
        sinks = torch.as_tensor(_Cai(buf, (problem.Hq,), "<f4"), device="cuda")
    return PeerMasks(problem.window, problem.softcap, sinks)


def _i32(buf: DeviceBuffer, shape: tuple[int, ...]) -> Any:
    """An int32 torch tensor aliasing one of our device buffers (cu_seqlens, the block table,
    the key counts)."""
    import torch

    return torch.as_tensor(_Cai(buf, shape, "<i4"), device="cuda")


def peer_pages(bufs: AttnBuffers) -> PeerPages:
    """A paged problem's block table and key counts as a peer takes them (torch int32 views of
    bufs.block_table [B, max_pages] and bufs.seqused_k [B]; the pools' unused rows are zero:
    AttnBuffers zeroes them at allocation)."""
    problem = as_problem(bufs.shape)
    layout = problem.pages
    table, used = getattr(bufs, "block_table", None), getattr(bufs, "seqused_k", None)
    if table is None or used is None:
        raise ValueError(f"buffers of {problem} hold no block table")
    return PeerPages(layout.page_size, _i32(table, tuple(layout.block_table.shape)),
                     _i32(used, (problem.B,)), problem.S_k)


class PeerLaunch:
    """A ``tuner.measure.peers.Peer`` on the measurement path (same buffers, stream, gate,
    timing)."""

    role = "peer"
    _ext_handle: int  # the stream _ext wraps (set with it)

    def __init__(self, peer: Any) -> None:
        self.peer = peer
        self.name = peer.name
        self.label = peer.label
        self._bound: tuple[object, ...] | None = None  # buffers' pointers, problem, stream
        self._views: tuple[Any, ...] | None = None
        self._ext: Any = None
        self._out: Any = None
        self.writes_lse = False  # known once bound: whether the peer returns a [B, Hq, S_q] LSE

    def supports(self, problem: ShapeLike) -> str | None:
        """The peer's own answer (tuner.measure.peers.base.Peer.supports)."""
        return self.peer.supports(as_problem(problem))

    def _stream_ctx(self, stream: Stream | int | None) -> Any:
        import torch

        h = stream_handle(stream)
        if self._ext is None or self._ext_handle != h:
            self._ext = torch.cuda.ExternalStream(h) if h else torch.cuda.default_stream()
            self._ext_handle = h
        return torch.cuda.stream(self._ext)

    def bind(self, bufs: AttnBuffers, stream: Stream | int | None) -> None:
        """Alias bufs as torch tensors and let the peer do its one-time work (JIT, autotune)
        now, outside any timed region; learns whether it returns an LSE we can check. The peer
        is told the problem's mask (``causal``) and the models' masks, if any (``masks``: the
        sinks as a view of bufs.sinks, so each input set's draw reaches it) and, for a paged
        problem, its block table and key counts (``pages``: ``peer_pages``; k and v are then
        the page pools); Hkv and D are in the views' shapes. A problem the peer does not
        support raises ValueError with its reason."""
        problem = as_problem(bufs.shape)
        key = (*(tensor_view(bufs, n)[0] for n in ("q", "k", "v")), bufs.o.ptr, bufs.lse.ptr,
               problem, stream_handle(stream))
        if self._bound == key:
            return
        why = self.supports(bufs.shape)
        if why is not None:
            raise ValueError(f"{self.name} cannot run {as_problem(bufs.shape)}: {why}")
        self._views = torch_views(bufs)
        q, k, v, _, lse = self._views
        masks = peer_masks(bufs)
        kw: dict[str, Any] = {"masks": masks} if masks.any else {}  # plain: the call it was
        with self._stream_ctx(stream):
            if problem.is_paged:  # k, v are the page pools; the block table beside them
                kw["pages"] = peer_pages(bufs)
            if problem.is_varlen:  # packed: the views are [1, total, H, D]; cu_seqlens beside
                assert bufs.cu_q is not None and bufs.cu_k is not None
                cu_q, cu_k = (_i32(c, (problem.B + 1,)) for c in (bufs.cu_q, bufs.cu_k))
                self.peer.prepare(q, k, v, problem.causal,
                                  (cu_q, cu_k, problem.S_q, problem.S_k), **kw)
            else:
                self.peer.prepare(q, k, v, problem.causal, **kw)
            peer_lse = self.peer.lse()
        self.writes_lse = peer_lse is not None and tuple(peer_lse.shape) == tuple(lse.shape)
        self._bound = key

    def prepare(self, shape: ShapeLike, stream: Stream | int | None) -> float:
        return 0.0  # the peer's own setup happens in bind(), which needs the buffers

    def forward(self, bufs: AttnBuffers, stream: Stream | int | None) -> None:
        self.bind(bufs, stream)
        with self._stream_ctx(stream):
            self._out = self.peer.run()

    def collect(self, bufs: AttnBuffers, stream: Stream | int | None) -> None:
        """Copy the last output (and LSE) into bufs.o / bufs.lse for the gate."""
        assert self._views is not None and self._out is not None, "forward() first"
        _, _, _, o, lse = self._views
        with self._stream_ctx(stream):
            o.copy_(self._out)
            if self.writes_lse:
                lse.copy_(self.peer.lse())

    def details(self) -> dict[str, Any]:
        return self.peer.details()

    def release(self) -> None:
        self.peer.release()
        self._views = self._out = None
        self._bound = None
