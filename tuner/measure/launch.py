"""Launchables: what the gate and the timing loop call.

A launchable has ``name``, ``label``, ``writes_lse``, ``prepare(shape, stream) -> host ms`` and
``forward(bufs, stream)`` (one launch, enqueued on ``stream``, reading bufs.q/k/v). fa-tune's own
kernel is ``tuner.runtime.KernelModule`` (the one binding of the C ABI), wrapped here only to
give it a name. A peer (FlashAttention-3, cuDNN, ...; ``tuner.peers``) is a torch callable;
``PeerLaunch`` puts it on the same path: torch views alias the very device buffers the oracle
filled, torch runs on the measurement stream, and ``collect`` copies the peer's output into
bufs.o / bufs.lse (outside any timed region) so the same GPU-side gate checks it.

Torch is imported only by ``PeerLaunch``: ``fa-tune run`` and the search never need it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tuner.runtime import AttnBuffers, DeviceBuffer, KernelModule, ShapeLike, Stream, stream_handle


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

    def prepare(self, shape: ShapeLike, stream: Stream | int | None) -> float:
        return self.module.prepare(shape, stream)

    def forward(self, bufs: AttnBuffers, stream: Stream | int | None) -> None:
        self.module.forward(bufs, stream)

    def collect(self, bufs: AttnBuffers, stream: Stream | int | None) -> None:
        """The kernel writes bufs.o itself: nothing to copy."""

    def details(self) -> dict[str, Any]:
        from tuner.build import sha256_file

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
    """q, k, v, o ([B, S, H, 128] bf16) and lse ([B, H, S] fp32) torch tensors aliasing bufs."""
    import torch

    s = bufs.shape
    bshd = (s.B, s.S, s.H, bufs.n // (s.B * s.S * s.H))

    def bf16(buf: DeviceBuffer) -> Any:  # CAI has no bf16 typestr: alias as int16, reinterpret
        return torch.as_tensor(_Cai(buf, bshd, "<i2"), device="cuda").view(torch.bfloat16)

    lse = torch.as_tensor(_Cai(bufs.lse, (s.B, s.H, s.S), "<f4"), device="cuda")
    return bf16(bufs.q), bf16(bufs.k), bf16(bufs.v), bf16(bufs.o), lse


class PeerLaunch:
    """A ``tuner.peers.Peer`` on the measurement path (same buffers, stream, gate, timing)."""

    role = "peer"

    def __init__(self, peer: Any) -> None:
        self.peer = peer
        self.name = peer.name
        self.label = peer.label
        self._bound: tuple[int, ...] | None = None  # buffers' pointers and shape, stream
        self._views: tuple[Any, ...] | None = None
        self._ext: Any = None
        self._out: Any = None
        self.writes_lse = False  # known once bound: whether the peer returns a [B, H, S] LSE

    def _stream_ctx(self, stream: Stream | int | None) -> Any:
        import torch

        h = stream_handle(stream)
        if self._ext is None or self._ext_handle != h:
            self._ext = torch.cuda.ExternalStream(h) if h else torch.cuda.default_stream()
            self._ext_handle = h
        return torch.cuda.stream(self._ext)

    def bind(self, bufs: AttnBuffers, stream: Stream | int | None) -> None:
        """Alias bufs as torch tensors and let the peer do its one-time work (JIT, autotune)
        now, outside any timed region; learns whether it returns an LSE we can check."""
        s = bufs.shape
        key = (bufs.q.ptr, bufs.k.ptr, bufs.v.ptr, bufs.o.ptr, bufs.lse.ptr, s.B, s.H, s.S,
               stream_handle(stream))
        if self._bound == key:
            return
        self._views = torch_views(bufs)
        q, k, v, _, lse = self._views
        with self._stream_ctx(stream):
            self.peer.prepare(q, k, v)
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
