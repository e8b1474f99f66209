"""Peer backends for ``fa-tune compare``: what a user would otherwise run.

Each module wraps one implementation behind ``tuner.measure.peers.base.Peer``. None of them imports
torch, triton or flash_attn at module level, so this package (and the CLI) import without them;
a peer whose packages are missing reports ``available() == (False, reason)``.

Install the optional ones with ``pip install 'fa-tune[peers]'`` (FA3 on an offline host:
lab/h200/fa3_stage1.sh and lab/h200/fa3_stage2.sh); FlashInfer with ``pip install
flashinfer-python`` (offline: lab/h200/flashinfer_stage.sh).
"""

from __future__ import annotations

from tuner.measure.peers.base import Peer

# Order is the order of the table rows; "fa3" is the reference the ratios are taken against.
# FlashInfer is not a default: its first run on a host builds its kernel (nvcc, minutes).
PEER_NAMES: tuple[str, ...] = ("fa3", "cudnn", "fa2", "triton", "mem_efficient", "flashinfer")
DEFAULT_PEERS: tuple[str, ...] = ("fa3", "cudnn", "fa2", "triton")
REFERENCE_PEER = "fa3"


def make_peer(name: str) -> Peer:
    """A fresh peer object for ``name`` (one of PEER_NAMES); imports nothing heavy."""
    if name == "fa3":
        from tuner.measure.peers.fa3 import FA3Peer

        return FA3Peer()
    if name in ("cudnn", "fa2", "mem_efficient"):
        from tuner.measure.peers.sdpa import SdpaPeer

        return SdpaPeer(name)
    if name == "triton":
        from tuner.measure.peers.triton_fa import TritonPeer

        return TritonPeer()
    if name == "flashinfer":
        from tuner.measure.peers.flashinfer import FlashInferPeer

        return FlashInferPeer()
    raise ValueError(f"unknown peer {name!r}; choose from {', '.join(PEER_NAMES)}")


__all__ = ["DEFAULT_PEERS", "PEER_NAMES", "REFERENCE_PEER", "Peer", "make_peer"]
