"""Kernel configs: every compile-time knob of the FlashAttention forward template.

A ``KernelConfig`` is a frozen, hashable value with one canonical JSON form (sorted keys, compact)
and a short content id. Presets are partial YAML dicts over the defaults in
``search_spaces/presets/``. ``validate`` rejects configs that cannot fit or cannot work on
sm_90a before anything is compiled, with one sentence saying why. KernelConfig's fields are the
knob table: tuner/kernel/knobs.py derives ``KNOBS``, the template's ``struct Config`` and
docs/ARCHITECTURE.md's table from them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tuner import _paths
from tuner.errors import ConfigError
from tuner.kernel import knobs
from tuner.kernel.knobs import Knob, knob
from tuner.problem import DEFAULT_HEAD_DIM, HEAD_DIMS, ProblemClass
from tuner.yaml_file import load_yaml, parse_yaml

HEAD_DIM = DEFAULT_HEAD_DIM  # the head dim studies meant before the kernel family
ELEM_BYTES = 2  # BF16

# sm_90: an SM's 228 KB of shared memory, less 1 KB each resident CTA takes for itself, so 227 KB
# (232448 bytes) for a CTA alone.
SM_SMEM_BYTES = 233472
SMEM_PER_CTA_RESERVED = 1024
SMEM_LIMIT_BYTES = SM_SMEM_BYTES - SMEM_PER_CTA_RESERVED
# Barriers and the 1024-byte alignment the TMA/WGMMA swizzled tiles need.
SMEM_OVERHEAD_BYTES = 1024
REGISTER_FILE = 65536  # 32-bit registers per SM, shared by its resident CTAs (ctas_per_sm)
THREADS_PER_WARPGROUP = 128
# Per-thread registers a consumer warpgroup needs beyond its accumulators (addresses, softmax
# state, loop counters, temporaries). With intra-warpgroup overlap at D 128: recalibrated on
# 2026-12-01 (nvcc 13.0, 21 builds, scripts/reg_calibration.py --head-dim 128, docs/PERF.md step
# 35; its 4 early_next_qk builds are step 36's), both masks, grid and multicast: block_n 144,
# 160 and 176 compile clean at 240 registers and 176 at 232, block_n 192 puts 8 B on the stack
# at 240 (causal) and 112 B at 224; so (32, 36]. (The 72 of 2026-11-29 came from an older
# consumer, whose 144-176 builds spilled.)
# Serial kernels (no overlap) hold S, P and O: below S + P + O (+ Q) + 28 ptxas serialized their
# wgmma ("insufficient register resources", C7511/C7512) in all 14 such builds of the CPU knob
# sample and the H200 search of 2026-11-29 (slack 0-24 registers), and kept it asynchronous at
# slack 28, 36 and 112; so 28. The post-compile checks (build.py: local memory, serialized
# wgmma) back both estimates.
CONSUMER_REG_OVERHEAD = 36
CONSUMER_REG_OVERHEAD_SERIAL = 28
# q_in_regs: the Q fragment, 32 registers at D 128 (D / 4), counted in full. With overlap at
# D 128 (2026-12-01): 144 fit at 240 (estimate 240), 160 spilled at 240 (252), 176 at 240 (264).
Q_IN_REGS = 32
# The persistent producer (tile loop, scheduler, Q handoff) runs on the whole warp, its state
# warp-uniform (uniform registers), one elected lane issuing TMA: static, dynamic, multicast and
# varlen compiled clean at 24 registers at D 64, 128 and 256 (nvcc 13.0, 2026-12-01, docs/PERF.md
# step 33; with the loop on one lane it had spilled at 24 and 32 and needed 40). With block_m 64
# (one consumer warpgroup, registers to spare) a D 256 varlen build still had 32 B of stack at
# 24, so block_m 64 asks for 56 above D 64. At D 64 the fixed-length and varlen (window, sinks)
# kernels of three CTAs an SM built clean at 24 (nvcc 13.0, 2026-12-06; docs/PERF.md step 63),
# and three CTAs leave 80 registers a thread: 24 + 136, not 56 + 104.
# Head-dim corrections to the overheads above (calibrated at D 128), keyed (D, overlap): what
# ptxas did with 22 builds around the boundary (scripts/reg_calibration.py, nvcc 13.0,
# 2026-11-30; docs/PERF.md step 26), as overheads beyond S + P + O (+ Q in full). D 64,
# overlap: 192x128 fit at 160 registers, 192x176 spilled, 128x192 fit at 240: 32 (36 - 4).
# D 64, serial: 192x128 fit at 160, 192x176 serialized its wgmma: 28. D 256, overlap: 128x80
# fit at 240, 128x96 spilled 64 B: 48 (36 + 12). D 256, serial: 128x80 fit, 128x96 spilled 8 B:
# 44 (28 + 16). At D 64, 192x112 with Q in registers spilled 72 B at 152 registers (H200 lab,
# 2026-12-01) and 192x96 fit at 152: Q counts in full there too.
CONSUMER_REG_OVERHEAD_D: dict[tuple[int, bool], int] = {
    (64, True): -4, (64, False): 0, (256, True): 12, (256, False): 16,
}
# A persistent serial kernel at D 128 also holds its tile loop's state: with the operands
# written by hand (nvcc 13.0, 2026-12-05, docs/PERF.md step 57) 128x192 at 240 put 4-24 B of it
# on the stack with the static and dynamic schedulers (either k_release, with and without lazy
# rescale, tree_reduce, LSE), where the grid one compiled clean; 128x176 was clean; D 64
# 192x128 at 160 and D 256 128x80 at 240 stayed clean (static and dynamic).
CONSUMER_REG_OVERHEAD_SERIAL_PERSISTENT_D128 = 5
# A multicast pair of two-warpgroup CTAs holds its rank and skip counts beside Q's per-thread
# descriptors: 128 x 80 pairs at 160 registers put 8 B on the stack in 6 builds (D 128, k 2 or
# 3 stages, either k_release, with and without lazy rescale and head_cluster 2; nvcc 13.0,
# 2026-12-03), the same kernel unpaired compiled clean. Three-warpgroup pairs (Q's descriptors
# uniform, kernel.cuh) compiled clean at 160 with block_n 64 and 80.
CONSUMER_REG_OVERHEAD_PAIR2 = 4
# early_next_qk holds the next tile's first QK across the epilogue's branches: with block_n
# 160 and 176 at D 128 ptxas put ~1.1 KB on the stack and serialized the wgmma (C7520, "WG.AR
# in divergent path") at 232 and 240 registers alike, so this is no register budget; 128 and
# 144 compiled clean (nvcc 13.0, 2026-12-01, docs/PERF.md step 36; a search trial had hit it).
EARLY_NEXT_QK_MAX_BLOCK_N = 144
# pack_gqa's causal fixed-length kernel at D 64 fit block_n 80 at 136 registers (three CTAs an
# SM, Q in registers: the window, window + sinks and plain causal classes, with and without
# tree_reduce, all clean; nvcc 13.0, 2026-12-07, docs/PERF.md step 76) where the estimate says
# 140; its unpacked twin and the non-causal class put 8-16 B on the stack, so only this case
# moves (block_n 96 spilled packed; with lazy_rescale 80 did too, which the build refuses).
PACK_GQA_CAUSAL_REG_OVERHEAD_D64 = -4
PERSISTENT_PRODUCER_REGS = 24
PERSISTENT_PRODUCER_REGS_BLOCK_M64 = 56
# The varlen producer without intra_wg_overlap (both rings' cursors live beside the 32-byte
# task) spilled one int at 24 registers (fa_tune/kernel.cuh, RegSplit).
VARLEN_SERIAL_PRODUCER_REGS = 32
# Clusters share K/V tiles through TMA multicast (fa_tune/config.cuh): each CTA loads 1 /
# cluster of a tile, whole 64-column boxes or, with fewer boxes than CTAs, row slices of them
# that must hold a multiple of 8 rows (the 128-byte swizzle's period).
SWIZZLE_ROWS = 8


def persistent_producer_regs(block_m: int, head_dim: int) -> int:
    """Registers the persistent producer loop needs (kernel.cuh's RegSplit mirrors it)."""
    if block_m == 64 and head_dim > 64:
        return PERSISTENT_PRODUCER_REGS_BLOCK_M64
    return PERSISTENT_PRODUCER_REGS


_HINTS = ("none", "evict_first", "evict_last", "evict_normal")
_HINT_DOC = "L2 eviction hint of the {} TMA {} (none: no hint)."


@dataclass(frozen=True)
class KernelConfig:
    """Every knob of templates/fa_fwd_sm90.cu: the knob table (its machinery: kernel/knobs.py).

    One field per knob, in the order of the template's ``struct Config`` and of
    docs/ARCHITECTURE.md's table; each field's ``knob()`` gives its values, C++ type and doc.
    """

    block_m: int = knob(128, (64, 128, 192), doc=(
        "Query rows per CTA tile; consumer warpgroups = block_m / 64."))
    block_n: int = knob(128, range(48, 193, 16), range_text="48..192 in steps of 16", doc=(
        "Key/value rows per KV tile, the main loop's step (48: a packed short window's band in "
        "tiles that start at the task's first key; docs/PERF.md step 76)."))
    k_stages: int = knob(2, (1, 2, 3), doc="Shared-memory stages of the K ring.")
    v_stages: int = knob(2, (1, 2, 3), doc="Shared-memory stages of the V ring.")
    k_release: str = knob("after_qk", ("after_qk", "after_max", "after_softmax"),
                          cpp_type="KRelease", doc=(
        "When a consumer hands a K stage back to the producer: after its QK; after that QK's "
        "row max (intra_wg_overlap only: the arrive then holds the PV wait below the max); "
        "or after the softmax."))
    v_release: str = knob("after_pv", ("after_pv", "deferred"), cpp_type="VRelease", doc=(
        "When a consumer hands a V stage back: after its PV, or an iteration later."))
    q_release: str = knob("at_end", ("after_last_qk", "at_end"), cpp_type="QRelease", doc=(
        "When Q's buffer goes back: after the tile's last QK (O then gets a buffer of its own, "
        "so the next tile's Q may land early) or at the tile's end."))
    hint_q: str = knob("evict_first", _HINTS, cpp_type="CacheHint",
                       doc=_HINT_DOC.format("Q", "loads"))
    hint_k: str = knob("evict_last", _HINTS, cpp_type="CacheHint",
                       doc=_HINT_DOC.format("K", "loads"))
    hint_v: str = knob("evict_last", _HINTS, cpp_type="CacheHint",
                       doc=_HINT_DOC.format("V", "loads"))
    hint_o: str = knob("none", _HINTS, cpp_type="CacheHint", doc=_HINT_DOC.format("O", "stores"))
    producer_regs: int = knob(24, (24, 32, 40, 56), doc=(
        "Registers per thread of the producer warpgroup (setmaxnreg)."))
    consumer_regs: int = knob(240, range(104, 241, 8), range_text="104..240 in steps of 8", doc=(
        "Registers per thread of each consumer warpgroup (setmaxnreg); below 160 only at D 64: "
        "three warpgroups beside a persistent producer, three CTAs an SM (136 and below), or "
        "two CTAs of two warpgroups (104)."))
    intra_wg_overlap: bool = knob(True, doc=(
        "A warpgroup issues the next KV tile's QK before this tile's softmax and PV."))
    pingpong: bool = knob(True, doc=(
        "Consumer warpgroups take turns at the tensor cores (named barriers); needs block_m "
        ">= 128."))
    rescale_o: str = knob("after_pv", ("after_pv", "before_pv"), cpp_type="RescaleO", doc=(
        "Where the O accumulator is rescaled by the new row max: after or before the PV GEMM "
        "(before_pv needs intra_wg_overlap)."))
    lazy_rescale: bool = knob(False, doc=(
        "Keep the row max until it grows by more than 8 in log2 units."))
    tree_reduce: bool = knob(False, doc="Row max and sum as 4 independent chains per row.")
    sum_in_pv: bool = knob(False, id_neutral=True, doc=(
        "D 64 only: the row sums as PV's output columns 64..71, its B operand a block of ones "
        "in shared memory, instead of one FADD per score (64 x 72 wgmmas; docs/PERF.md step "
        "39)."))
    q_in_regs: bool = knob(False, doc=(
        "Q as the register A operand of QK, loaded once per tile."))
    early_next_qk: bool = knob(False, doc=(
        "Persistent schedulers: the next tile's first QK issued behind this tile's last PV."))
    kv_multicast: bool = knob(False, doc=(
        "Static scheduler, block_m 128 or 192: 2-CTA clusters share each K/V tile by TMA "
        "multicast (192: 384 rows per tile, measured faster at D 128 non-causal, slower at D "
        "64); at D 64 each CTA loads half the rows of the one 64-column box."))
    wg_skip: bool = knob(False, id_neutral=True, doc=(
        "Causal, block_m >= 128 without kv_multicast: a warpgroup whose rows end above the "
        "tile's last row starts at its own diagonal and hands back the stages of the KV tiles "
        "above it instead of computing them masked, as a multicast pair always does; not with "
        "early_next_qk."))
    head_cluster: int = knob(1, (1, 2, 4), id_neutral=True, doc=(
        "GQA: that many query heads of one K/V group run one query tile side by side in a "
        "cluster and share each K/V tile by TMA multicast; static or grid scheduler; Hq/Hkv "
        "must be a multiple."))
    pack_gqa: bool = knob(False, id_neutral=True, doc=(
        "GQA, fixed-length calls: a warpgroup's 64 rows hold P query heads of one K/V head at "
        "64 / P positions (P the largest power of two up to 8 dividing Hq/Hkv), so a sliding "
        "window's band is 64 / P + window keys, its tiles from the task's first key; not with "
        "kv_multicast, head_cluster or wg_skip (docs/PERF.md step 76)."))
    tile_order: str = knob("longest_first", ("longest_first", "natural"), cpp_type="TileOrder",
                           doc="Grid scheduler: the order of a head's query tiles in the launch.")
    scheduler: str = knob("grid", ("grid", "static", "dynamic"), cpp_type="Scheduler", doc=(
        "Who hands tiles to CTAs: one tile per CTA (grid), host-built task lists (static) or a "
        "device counter (dynamic)."))
    fixed_cost: int = knob(4, range(17), range_text="an integer from 0 to 16", doc=(
        "Static scheduler: a task's fixed cost beside its KV tiles in the task-list balance."))
    persistent_ctas: int = knob(0, range(1025), range_text="an integer from 0 (= SM count) to 1024",
                                doc="Persistent schedulers: CTAs launched (0: ctas_per_sm per SM).")
    ctas_per_sm: int = knob(1, (1, 2, 3), id_neutral=True, doc=(
        "CTAs resident on one SM at once (__launch_bounds__' minimum): each gets 1/n of the "
        "registers and shared memory; independent CTAs hide each other's prologue and epilogue "
        "where tasks are short."))
    softcap_tanh: str = knob("exact", ("exact", "approx"), cpp_type="SoftcapTanh",
                             id_neutral=True, classes=("softcap",), doc=(
        "A softcap class's tanh: exact (MUFU.EX2 and MUFU.RCP per score, FP32-exact) or approx "
        "(tanh.approx: one MUFU op, relative error up to 2^-11; docs/PERF.md step 60)."))
    write_lse: bool = knob(True, doc="Write the row log-sum-exp beside O.")

    def __post_init__(self) -> None:
        # Direct construction gets the same per-knob checks as from_dict.
        for f in dataclasses.fields(self):
            KNOBS[f.name].check(getattr(self, f.name))

    # ---- (de)serialisation -------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None, source: str | None = None) -> KernelConfig:
        """Build from a partial dict over the defaults; unknown knobs and bad values raise."""
        where = f"{source}: " if source else ""
        if data is None:
            data = {}
        if not isinstance(data, Mapping):
            raise ConfigError(
                f"{where}a config must be a mapping of knob: value, got {type(data).__name__}"
            )
        for k, neutral in RETIRED_KNOBS.items():  # written by a study of their time
            if k in data and data[k] != neutral:
                raise ConfigError(f"{where}knob '{k}' was removed (docs/PERF.md step 60, "
                                  f"lab/patches/); this config sets it to {data[k]!r}")
        data = {k: v for k, v in data.items() if k not in RETIRED_KNOBS}
        unknown = sorted(str(k) for k in data if k not in KNOBS)
        if unknown:
            raise ConfigError(
                f"{where}unknown knob '{unknown[0]}'; known knobs: {', '.join(KNOBS)}"
            )
        try:
            for k, v in data.items():
                KNOBS[k].check(v)
        except ConfigError as e:
            raise ConfigError(f"{where}{e}") from None
        return cls(**dict(data))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def canonical_json(self) -> str:
        # Knobs added after ids were published are left out at their neutral value, so every
        # config that existed before keeps its id (studies, caches, docs name kernels by it).
        d = {k: v for k, v in self.to_dict().items() if NEUTRAL_LATER_KNOBS.get(k, ()) != (v,)}
        return json.dumps(d, sort_keys=True, separators=(",", ":"))

    def config_id(self) -> str:
        """Short content id: first 12 hex digits of sha256(canonical JSON)."""
        return hashlib.sha256(self.canonical_json().encode()).hexdigest()[:12]

    def effective(self) -> KernelConfig:
        """The same kernel with knobs that cannot matter under the others at their defaults.

        fixed_cost only feeds the static scheduler's task lists, persistent_ctas only sizes a
        persistent grid, tile_order only orders the grid launch, and early_next_qk needs a next
        tile (a persistent CTA). pingpong needs a second consumer warpgroup and rescale_o
        before_pv the overlapped pipeline (fa_tune/config.cuh: kPingpong, kRescaleBeforePv).
        Two configs that differ only there compile and run identically, so the search treats
        them as one (and the sampler learns from the measured twin instead of a rejection).
        """
        d = KernelConfig()
        changes: dict[str, Any] = {}
        if self.block_m == 64:
            changes["pingpong"] = False
        if self.block_m == 64 or self.kv_multicast:
            # One warpgroup has no other rows to skip for; a multicast pair always skips.
            changes["wg_skip"] = False
        if not self.intra_wg_overlap:
            changes["rescale_o"] = "after_pv"
        if self.scheduler != "static":
            changes["fixed_cost"] = d.fixed_cost
        if self.scheduler == "grid":
            changes["persistent_ctas"] = d.persistent_ctas
            changes["early_next_qk"] = d.early_next_qk
        else:
            changes["tile_order"] = d.tile_order
        return self.replace(**changes) if changes else self

    def replace(self, **changes: Any) -> KernelConfig:
        return KernelConfig.from_dict({**self.to_dict(), **changes})

    def diff_from_default(self) -> dict[str, Any]:
        default = KernelConfig()
        return {k: v for k, v in self.to_dict().items() if getattr(default, k) != v}

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=True)

    def save_yaml(self, path: str | Path) -> None:
        Path(path).write_text(self.to_yaml())

    @classmethod
    def from_yaml_text(cls, text: str, source: str = "<config>") -> KernelConfig:
        return cls.from_dict(parse_yaml(text, source, ConfigError), source=source)

    @classmethod
    def load(cls, path: str | Path) -> KernelConfig:
        """Load a config file (YAML, which includes JSON)."""
        return cls.from_dict(load_yaml(path, "config file", ConfigError), source=str(path))

    # ---- the template contract -----------------------------------------------------------
    def cpp_constants(self) -> dict[str, str]:
        """Each knob as a C++ literal, for a template's ``${knob}`` placeholders."""
        return {name: KNOBS[name].cpp_value(v) for name, v in self.to_dict().items()}

    def cpp_members(self) -> str:
        """The rendered template's ``struct Config`` members (its ``${config_members}``)."""
        return knobs.cpp_members(KNOBS, self.to_dict())

    @property
    def consumer_warpgroups(self) -> int:
        return self.block_m // 64


KNOBS: dict[str, Knob] = knobs.table(KernelConfig)
# Knobs taken out of the product after configs were stored with them, and the value at which a
# stored config still names today's kernel (from_dict drops them there, refuses them otherwise).
RETIRED_KNOBS: dict[str, Any] = {"kv_walk": 1}
# Knobs added after config ids were in use, and the value that compiles the kernel as before
# (KernelConfig.canonical_json leaves them out at it).
NEUTRAL_LATER_KNOBS: dict[str, tuple[Any]] = {
    k.name: (k.default,) for k in KNOBS.values() if k.id_neutral}


# ---- static validity --------------------------------------------------------------------
def smem_bytes(cfg: KernelConfig, head_dim: int = HEAD_DIM) -> int:
    tile = head_dim * ELEM_BYTES
    # O reuses Q's buffer unless Q is handed back after the last QK (then the next tile's Q
    # may land while O is staged, so O gets its own buffer): cuda_src/fa_tune/traits.cuh.
    o_tile = cfg.block_m * tile if cfg.q_release == "after_last_qk" else 0
    return (
        cfg.block_m * tile
        + o_tile
        + cfg.k_stages * cfg.block_n * tile
        + cfg.v_stages * cfg.block_n * tile
        + (cfg.block_n * 64 * ELEM_BYTES if cfg.sum_in_pv else 0)  # the block of ones
        + SMEM_OVERHEAD_BYTES
    )


def register_budget(cfg: KernelConfig) -> int:
    """Registers the CTA asks for via setmaxnreg (producer + consumer warpgroups)."""
    return (cfg.producer_regs + cfg.consumer_warpgroups * cfg.consumer_regs) * THREADS_PER_WARPGROUP


def launch_registers(cfg: KernelConfig) -> int:
    """Registers the CTA holds at launch: threads x the per-thread cap that
    __launch_bounds__(threads, ctas_per_sm) gives ptxas (65536 / (threads x ctas_per_sm), down
    to a multiple of 8, at most 255). setmaxnreg only moves registers within this pool: an
    increase waits until other warps of the CTA have released enough, so a split that needs
    more than the pool never starts.
    """
    threads = (cfg.consumer_warpgroups + 1) * THREADS_PER_WARPGROUP
    per_thread = min(255, REGISTER_FILE // (threads * cfg.ctas_per_sm)) // 8 * 8
    return threads * per_thread


def smem_limit(cfg: KernelConfig) -> int:
    """Shared memory one CTA may have so that ctas_per_sm of them are resident on an SM."""
    return SM_SMEM_BYTES // cfg.ctas_per_sm - SMEM_PER_CTA_RESERVED


# Per head dim, a config whose varlen kernel compiles clean (nvcc 13.0, 2026-12-01: with the
# warp-uniform producer, every preset's does).
VARLEN_FIT_HINT = {64: "preset d64", 128: "preset default", 256: "preset d256"}


def varlen_register_split(cfg: KernelConfig, head_dim: int = HEAD_DIM) -> tuple[int, int]:
    """(producer, consumer) registers of the cfg's varlen kernel (cuda_src/fa_tune/kernel.cuh,
    RegSplit): its producer always runs the persistent loop, so it gets at least the persistent
    producer's registers (56 with block_m 64 above head dim 64; 32 without intra_wg_overlap),
    taken from the consumers when the launch pool has no more."""
    need = persistent_producer_regs(cfg.block_m, head_dim)
    if need == PERSISTENT_PRODUCER_REGS and not cfg.intra_wg_overlap:
        need = VARLEN_SERIAL_PRODUCER_REGS
    producer = max(cfg.producer_regs, need)
    spare = (launch_registers(cfg) // THREADS_PER_WARPGROUP - producer) \
        // cfg.consumer_warpgroups // 8 * 8
    return producer, min(cfg.consumer_regs, spare)


def varlen_reason(cfg: KernelConfig, head_dim: int = HEAD_DIM) -> str | None:
    """Why cfg's varlen kernel cannot work (check_varlen's sentence), or None when it can."""
    try:
        check_varlen(cfg, head_dim)
    except ConfigError as e:
        return str(e)
    return None


def check_varlen(cfg: KernelConfig, head_dim: int = HEAD_DIM) -> None:
    """Raise ConfigError with one sentence if cfg's varlen kernel cannot work (a varlen
    problem class builds it beside the fixed-length one)."""
    producer, consumer = varlen_register_split(cfg, head_dim)
    est = consumer_reg_estimate(cfg, head_dim)
    if est > consumer:
        raise ConfigError(
            f"the varlen kernel's producer needs {producer} registers, which leaves the "
            f"consumers {consumer} (consumer_regs {cfg.consumer_regs}), and this config's "
            f"consumers need about {est}; for varlen at head dim {head_dim} use "
            f"{VARLEN_FIT_HINT.get(head_dim, 'a config whose consumers fit')}")


def consumer_reg_parts(cfg: KernelConfig, head_dim: int = HEAD_DIM,
                       packed_causal: bool = False) -> dict[str, int]:
    """Per-thread registers a consumer warpgroup needs, by part: S, P, O, (Q), overhead.

    S tile 64 x block_n fp32 over 128 threads = block_n/2; a P tile in BF16 = block_n/4 (with
    overlap the previous tile's, held while the next QK runs); O tile 64 x D fp32 = D/2 (64 at
    D 128, 128 at D 256), + 4 with sum_in_pv (the row sums' 8 columns); Q held in registers
    (q_in_regs) 64 x D BF16 = D/4. packed_causal: the causal fixed-length kernel of a
    pack_gqa config (the varlen kernel runs unpacked).
    """
    parts = {"S": cfg.block_n // 2, "P": cfg.block_n // 4,
             "O": head_dim // 2 + (4 if cfg.sum_in_pv else 0)}
    if cfg.q_in_regs:
        parts["Q"] = Q_IN_REGS * head_dim // HEAD_DIM
    parts["overhead"] = consumer_reg_overhead(cfg, head_dim, packed_causal)
    return parts


def consumer_reg_estimate(cfg: KernelConfig, head_dim: int = HEAD_DIM) -> int:
    return sum(consumer_reg_parts(cfg, head_dim).values())


def consumer_reg_overhead(cfg: KernelConfig, head_dim: int = HEAD_DIM,
                          packed_causal: bool = False) -> int:
    fix = CONSUMER_REG_OVERHEAD_D.get((head_dim, cfg.intra_wg_overlap), 0)
    if packed_causal and cfg.pack_gqa and head_dim == 64:
        fix += PACK_GQA_CAUSAL_REG_OVERHEAD_D64
    if cfg.kv_multicast and cfg.consumer_warpgroups == 2:
        fix += CONSUMER_REG_OVERHEAD_PAIR2
    base = CONSUMER_REG_OVERHEAD if cfg.intra_wg_overlap else CONSUMER_REG_OVERHEAD_SERIAL
    if head_dim == 128 and not cfg.intra_wg_overlap and cfg.scheduler != "grid":
        fix += CONSUMER_REG_OVERHEAD_SERIAL_PERSISTENT_D128
    # sum_in_pv: the softmax keeps no partial row sums (two per row) and does no quad sum,
    # about the 4 registers its sum columns add to O: D 64 192 x 128 at 160 compiled without
    # stack (nvcc 13.0, 2026-12-02), as without it.
    return base + fix - (4 if cfg.sum_in_pv else 0)


def cluster_size(cfg: KernelConfig) -> int:
    """CTAs per cluster: kv_multicast pairs query tiles, head_cluster runs of query heads."""
    return (2 if cfg.kv_multicast else 1) * cfg.head_cluster


def warpgroup_max_skip(cfg: KernelConfig) -> int:
    """KV tiles the lowest 64-row warpgroup of a causal task skips at most (kv_multicast, or
    wg_skip): the task's rows (2 x block_m for a pair) end that many minus 64 rows below its
    own. 0 when no warpgroup skips."""
    if not (cfg.kv_multicast or (cfg.wg_skip and cfg.block_m > 64)):
        return 0
    rows = cfg.block_m * (2 if cfg.kv_multicast else 1)
    return -(-(rows - 64) // cfg.block_n)


def validate(cfg: KernelConfig, head_dim: int = HEAD_DIM, causal: bool = True) -> KernelConfig:
    """Raise ConfigError with one sentence if cfg cannot work on sm_90a for head dim
    ``head_dim`` and mask ``causal`` (its problem class); else return cfg."""
    if head_dim not in HEAD_DIMS:
        raise ConfigError(f"head dim {head_dim} is not one the kernel builds: {HEAD_DIMS}")
    if cfg.sum_in_pv and head_dim != 64:
        # The ones ride in the V operand's second 64-column atom, which the wgmma descriptor
        # places at a free offset only while V itself is one atom wide (wgmma.cuh).
        raise ConfigError(
            f"sum_in_pv (row sums as 8 extra columns of ones in the PV GEMM) needs head dim 64; "
            f"got {head_dim}: set it false")
    if cfg.kv_multicast:
        if cfg.scheduler != "static":
            raise ConfigError(
                "kv_multicast needs the static scheduler (both CTAs of a cluster walk one task "
                f"list); got scheduler {cfg.scheduler}"
            )
        if cfg.block_m < 128:
            raise ConfigError(
                f"kv_multicast needs block_m 128 or 192 (two or three warpgroups per CTA); "
                f"got {cfg.block_m}"
            )
        if cfg.block_m == 192 and head_dim == 64:
            # They pass the gate, but ran 0.95-0.99x of the same kernel unpaired (H200,
            # docs/PERF.md step 39): refused, so the search spends no trials on them; the lab
            # builds them with --unchecked. At D 128 non-causal they were faster (step 43).
            raise ConfigError(
                "kv_multicast with block_m 192 at head dim 64 was measured slower than "
                "unpaired (docs/PERF.md step 39); use block_m 128 or kv_multicast false"
            )
        if cfg.early_next_qk:
            raise ConfigError("kv_multicast does not support early_next_qk; set it false")
    if cfg.wg_skip and cfg.early_next_qk:
        # The drain issues the next tile's first QK before the warpgroup could skip tiles.
        raise ConfigError("wg_skip does not support early_next_qk; set one of them false")
    skip = warpgroup_max_skip(cfg) if causal else 0  # non-causal, every row visits every tile
    if cfg.intra_wg_overlap and skip - 1 > cfg.v_stages:
        # Causal: the lowest warpgroup skips `skip` KV tiles and frees their V stages only
        # after its first QK, whose K the producer sends after skip - 1 of those V tiles: with
        # fewer V stages it waits on a release that never comes (H200 2026-12-02, multicast
        # pairs at block_n 64 and 80 with 1 V stage hung; docs/PERF.md step 38).
        what = "a causal pair" if cfg.kv_multicast else f"a causal block_m {cfg.block_m} tile"
        raise ConfigError(
            f"{'kv_multicast' if cfg.kv_multicast else 'wg_skip'} with block_n {cfg.block_n} "
            f"lets a warpgroup of {what} skip {skip} KV tiles, which needs at least {skip - 1} "
            f"V stages with intra_wg_overlap (it deadlocks with fewer); got v_stages "
            f"{cfg.v_stages}: raise v_stages or block_n"
        )
    if cfg.pack_gqa and (cfg.kv_multicast or cfg.head_cluster > 1 or cfg.wg_skip):
        raise ConfigError(
            "pack_gqa packs a GQA group's heads into one CTA's rows, which kv_multicast, "
            "head_cluster and wg_skip split differently; set those off or pack_gqa false")
    if cfg.head_cluster > 1:
        if cfg.scheduler == "dynamic":
            raise ConfigError(
                "head_cluster needs the static or grid scheduler (a cluster's CTAs take one "
                "task together; the dynamic counter hands tiles to CTAs one by one)"
            )
        if cfg.early_next_qk:
            raise ConfigError("head_cluster does not support early_next_qk; set it false")
    ctas = cluster_size(cfg)
    slices = max(1, ctas // (head_dim // 64))
    if ctas > 1 and (cfg.block_n % slices or (cfg.block_n // slices) % SWIZZLE_ROWS):
        raise ConfigError(
            f"a {ctas}-CTA cluster at head dim {head_dim} cuts each K/V tile's 64-column boxes "
            f"into {slices} row slices, and block_n {cfg.block_n} does not split into slices "
            f"of a multiple of {SWIZZLE_ROWS} rows; use a block_n divisible by "
            f"{slices * SWIZZLE_ROWS}"
        )
    smem = smem_bytes(cfg, head_dim)
    limit = smem_limit(cfg)
    if smem > limit:
        per = ("an sm_90 CTA can have" if cfg.ctas_per_sm == 1 else
               f"each of {cfg.ctas_per_sm} CTAs on one SM can have")
        raise ConfigError(
            f"config needs {smem} bytes of shared memory (Q {cfg.block_m} rows"
            f"{' + a separate O tile' if cfg.q_release == 'after_last_qk' else ''} + "
            f"{cfg.k_stages} K and {cfg.v_stages} V stages of {cfg.block_n} rows, head dim "
            f"{head_dim}), more than the {limit} {per}; lower block_m, block_n"
            f"{', the stages or ctas_per_sm' if cfg.ctas_per_sm > 1 else ' or the stages'}"
        )
    regs = register_budget(cfg)
    pool = launch_registers(cfg)
    if regs > pool:
        raise ConfigError(
            f"config asks for {regs} registers per CTA ((producer_regs {cfg.producer_regs} + "
            f"{cfg.consumer_warpgroups} x consumer_regs {cfg.consumer_regs}) x 128 threads), more "
            f"than the {pool} the CTA holds at launch (setmaxnreg would wait forever); lower "
            "consumer_regs or producer_regs"
        )
    if cfg.pingpong and cfg.consumer_warpgroups < 2:
        raise ConfigError(
            f"pingpong needs at least 2 consumer warpgroups but block_m {cfg.block_m} gives "
            f"{cfg.consumer_warpgroups}; use block_m >= 128 or pingpong false"
        )
    if cfg.rescale_o == "before_pv" and not cfg.intra_wg_overlap:
        raise ConfigError("rescale_o before_pv needs intra_wg_overlap true")
    if cfg.early_next_qk:
        if cfg.scheduler == "grid":
            raise ConfigError(
                "early_next_qk needs a persistent scheduler (static or dynamic): a grid CTA has "
                "no next tile"
            )
        if not cfg.intra_wg_overlap:
            raise ConfigError("early_next_qk needs intra_wg_overlap true")
        if cfg.q_release != "after_last_qk":
            raise ConfigError(
                "early_next_qk needs q_release after_last_qk (the next tile's Q must land before "
                "this tile's epilogue hands Q back)"
            )
        if cfg.rescale_o == "before_pv":
            # Measured (sm_90a, nvcc 13.0, 2026-11-29): ~1 KB of stack, 217+ LDL/STL.
            raise ConfigError("early_next_qk with rescale_o before_pv spills; use after_pv")
        if cfg.block_n > EARLY_NEXT_QK_MAX_BLOCK_N:
            raise ConfigError(
                f"early_next_qk with block_n {cfg.block_n} spills (~1 KB of stack, serialized "
                f"wgmma); use block_n <= {EARLY_NEXT_QK_MAX_BLOCK_N} or early_next_qk false"
            )
    if cfg.v_release == "deferred" and cfg.v_stages < 2:
        raise ConfigError(
            f"v_release deferred holds a V stage across iterations and needs v_stages >= 2 "
            f"(got {cfg.v_stages})"
        )
    if cfg.k_release == "after_max" and not cfg.intra_wg_overlap:
        raise ConfigError(
            "k_release after_max places the K release after the row max to hold back the PV "
            "wait, which only intra_wg_overlap has in flight; use after_qk without it"
        )
    if cfg.k_release == "after_softmax" and cfg.intra_wg_overlap and cfg.k_stages < 2:
        raise ConfigError(
            "k_release after_softmax with intra_wg_overlap holds K while the next QK^T needs a "
            f"new K, so it needs k_stages >= 2 (got {cfg.k_stages})"
        )
    need = persistent_producer_regs(cfg.block_m, head_dim)
    if cfg.scheduler != "grid" and cfg.producer_regs < need:
        raise ConfigError(
            f"the {cfg.scheduler} scheduler's producer loop needs producer_regs >= {need}"
            f"{' with block_m 64' if need > PERSISTENT_PRODUCER_REGS else ''} "
            f"(got {cfg.producer_regs}; "
            "fewer spill it to local memory); raise producer_regs and lower consumer_regs to fit"
        )
    parts = consumer_reg_parts(cfg, head_dim, packed_causal=causal)
    est = sum(parts.values())
    if est > cfg.consumer_regs:
        text = " + ".join(
            f"{'previous ' if k == 'P' and cfg.intra_wg_overlap else ''}{k} {v}"
            for k, v in parts.items())
        raise ConfigError(
            f"consumer warpgroups need about {est} registers per thread at head dim {head_dim} "
            f"({text}) but consumer_regs is {cfg.consumer_regs}; lower block_n or raise "
            "consumer_regs"
        )
    return cfg


# ---- presets ------------------------------------------------------------------------------
def list_presets() -> list[str]:
    d = _paths.presets_dir()
    if not d.is_dir():
        return []
    return sorted(p.stem for p in d.glob("*.yaml"))


# The default preset per head dim (for both masks): FA3's tile choice for that head dim.
DEFAULT_PRESETS: dict[int, str] = {64: "d64", 128: "default", 256: "d256"}
# Where a mask's registers make the head dim's default spill (nvcc 13.0), the class gets a
# preset that fits, matched on (head dim, the class's flags that must all be set): D 256 spilled
# at d256's 80-key tiles with a window (no more since a masked tile takes only the masks that cut
# it, docs/PERF.md step 77; d256-window stays until 80 is measured there), and spills with a
# softcap in the varlen kernel; D 64 with a
# softcap at d64's 192-row tiles. There d64-window3 (64 x 64 tiles, three CTAs an SM) passes the
# gate on every D 64 class and ran 4 % faster than d64-window at 1x64/8x8192:d64:cap50 and 11 %
# at :w128:cap50 (H100, 2026-12-06, docs/PERF.md step 64).
CLASS_PRESETS: tuple[tuple[int, tuple[str, ...], str], ...] = (
    (256, ("window",), "d256-window"),
    (256, ("softcap", "varlen"), "d256-window"),
    (64, ("softcap",), "d64-window3"),
)


def default_preset(pclass: ProblemClass) -> str:
    """The preset a problem class runs when nobody tuned it (the gate's err_vs_default too)."""
    for d, flags, name in CLASS_PRESETS:
        if pclass.head_dim == d and all(getattr(pclass, f) for f in flags):
            return name
    return DEFAULT_PRESETS[pclass.head_dim]


def preset_head_dim(name: str) -> int:
    """The head dim a preset is made for: presets named d64* or d256* serve that head dim, the
    others head dim 128 (the tests and the GPU host's prebuild build each for its own)."""
    for d in HEAD_DIMS:
        if d != HEAD_DIM and re.match(rf"d{d}(\b|[-_.])", name):
            return d
    return HEAD_DIM


def load_preset(name: str) -> KernelConfig:
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name or ""):
        raise ConfigError(f"bad preset name '{name}'; available: {', '.join(list_presets())}")
    path = _paths.presets_dir() / f"{name}.yaml"
    if not path.is_file():
        raise ConfigError(
            f"unknown preset '{name}'; available presets: {', '.join(list_presets()) or 'none'}"
        )
    return KernelConfig.load(path)


def load_config(preset: str | None, config: Path | str | None) -> tuple[KernelConfig, str]:
    """The config named by exactly one of --preset / --config, and a label for it."""
    if (preset is None) == (config is None):
        raise ConfigError("give exactly one of --preset NAME or --config FILE")
    if preset is not None:
        return load_preset(preset), preset
    assert config is not None
    return KernelConfig.load(config), str(config)
