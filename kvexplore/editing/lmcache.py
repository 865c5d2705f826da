"""The LMCache releases whose KV-cache-group edits kvexplore reproduces, as data.

LMCache's edits and validation live in
``lmcache/integration/vllm/kv_cache_group_edits.py`` (first shipped in 0.4.7)
and the layout hint its vLLM connector passes them comes from
``lmcache/integration/vllm/utils.py: vllm_layout_hints``.  Five rule sets
exist, each shared by the releases listed with it:

======================  ===========================================================
releases                what the release has
======================  ===========================================================
0.4.7, 0.5.0-0.5.2      ``mamba-page-view`` (any Mamba value), ``subpaged-attention-view``
                        (rank 5); no layout hint; validation keeps ``align`` only;
                        rules see the group's spec
0.5.3, 0.5.4            adds ``mamba-unified-view`` (a plain ``view(..., -1)``, hints
                        ``NHD`` / ``HND``) and ``subpaged-mla-attention-view`` (rank 3,
                        ``block_size`` rows) ahead of the others; the hint is vLLM's
                        ``get_kv_cache_layout()``; ``mamba-page-view`` takes a list only
0.5.5                   ``mamba-unified-view`` tiles the row at vector-aligned token
                        widths; validation keeps ``align`` and ``all``; the hint is
                        vLLM's resolved layout, translated
0.5.6                   ``subpaged-attention-view`` takes rank 4 (memory order) too;
                        MLA at ``num_states`` rows, rank 3 or 4; hints ``BLNHC`` /
                        ``BLHNC``; ``tokens_per_state`` declares slot compression;
                        rules see each layer's own spec
0.5.7rc2 (pre-release)  ``mamba-page-view`` matches a conv state one page per block
                        wherever it starts; adds ``mamba-slice-planes`` and two
                        (K, V)-plane rules for split attention caches
======================  ===========================================================

:func:`lmcache_release` turns a user's ``lmcache=`` into one of these records
(``None``: the LMCache installed beside kvexplore, else :data:`NEWEST_STABLE`),
refusing any release it does not know.

>>> lmcache_release("0.5.2").rules
('mamba-page-view', 'subpaged-attention-view')
>>> lmcache_release("0.5.2").snapshot_modes
('align',)
>>> lmcache_release("0.5.7rc2").prerelease
True
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
from collections.abc import Mapping
from dataclasses import dataclass, field

from kvexplore.errors import KVExploreError
from kvexplore.layout import FrozenDict
from kvexplore.version import parse_release

__all__ = [
    "LMCACHE_RELEASES",
    "NEWEST_STABLE",
    "LMCacheRelease",
    "installed_lmcache",
    "lmcache_release",
    "lmcache_releases",
]


@dataclass(frozen=True)
class LMCacheRelease:
    """What one LMCache release's edits and validation do, as data.

    ``rules``: rule names in the release's registry order (first match
    wins); ``options``: per rule name, the keywords that select that
    release's variant of the rule (read by :func:`kvexplore.editing.rules.rules_for`).
    ``snapshot_modes``: the ``mamba_cache_mode`` values its
    ``validate_kv_cache_groups`` accepts.  ``slot_compression``: the spec
    fields (name, value at which it is off) whose larger value declares slot
    compression (``_declares_slot_compression``).  ``per_layer_specs``:
    whether ``apply_kv_cache_group_edits`` hands each layer its own spec out
    of a ``UniformTypeKVCacheSpecs`` group (else the group's spec).
    ``layout_hint``: where the ``kv_layout`` hint comes from: ``"none"`` (the
    release takes no hints), ``"vllm-getter"`` (vLLM's
    ``vllm.v1.attention.backends.utils.get_kv_cache_layout``, used as is) or
    ``"translated"`` (the engine's resolved layout through
    ``translate_vllm_kv_cache_layout``).  ``same_rules``: every known release
    with these very rules and validation.  ``hybrid_groups``: whether its
    multi-process connector and server build their groups from vLLM's KV
    cache groups (``kv_cache_groups.create_engine_group_infos_from_vllm`` over
    ``gpu_connector/utils.py: normalize_and_discover_per_layer_formats``,
    0.5.1 and later), which :func:`kvexplore.lmcache_layout` runs.
    """

    version: str
    rules: tuple[str, ...]
    options: FrozenDict = field(default_factory=FrozenDict)
    snapshot_modes: tuple[str, ...] = ("align",)
    slot_compression: tuple[tuple[str, int], ...] = (
        ("compress_ratio", 1),
        ("tq_slot_size", 0),
    )
    per_layer_specs: bool = False
    layout_hint: str = "none"
    prerelease: bool = False
    same_rules: tuple[str, ...] = ()
    hybrid_groups: bool = True

    def __str__(self) -> str:
        return f"LMCache {self.version}" + (" (pre-release)" if self.prerelease else "")


#: vLLM ``KVCacheLayout`` names (and LMCache's own) -> the hint LMCache
#: 0.5.5 and later pass their edits (``translate_vllm_kv_cache_layout``);
#: any other layout is refused there.
HINT_TRANSLATION = FrozenDict(
    {
        "NHD": "NHD",
        "HND": "HND",
        "LBNHC": "NHD",
        "LBHNC": "HND",
        "BLHNC": "BLHNC",
        "BLNHC": "BLNHC",
    }
)

_TWO_RULES = ("mamba-page-view", "subpaged-attention-view")
_FOUR_RULES = (
    "mamba-unified-view",
    "mamba-page-view",
    "subpaged-mla-attention-view",
    "subpaged-attention-view",
)
_SEVEN_RULES = (
    "mamba-unified-view",
    "mamba-page-view",
    "mamba-slice-planes",
    "subpaged-mla-attention-view",
    "subpaged-attention-view",
    "subpaged-attention-interleaved-plane-view",
    "subpaged-attention-contiguous-plane-view",
)
_NEW_SLOT_COMPRESSION = (
    ("tokens_per_state", 1),
    ("compress_ratio", 1),
    ("tq_slot_size", 0),
)


def _options(base: Mapping | None = None, **rules: dict) -> FrozenDict:
    """``base`` with the variants of ``rules`` (``mamba_page_view=`` for
    ``mamba-page-view``) replaced: each release states what it changed."""
    changed = {name.replace("_", "-"): FrozenDict(kw) for name, kw in rules.items()}
    return FrozenDict({**(base or {}), **changed})


_A = dict(
    rules=_TWO_RULES,
    options=_options(
        mamba_page_view={"values": "any", "conv_at_storage_start": True},
        subpaged_attention_view={"ranks": (5,)},
    ),
)
_B = dict(
    rules=_FOUR_RULES,
    options=_options(
        _A["options"],
        mamba_unified_view={"tiling": "reshape", "hints": ("NHD", "HND")},
        mamba_page_view={"values": "list", "conv_at_storage_start": True},
        subpaged_mla_attention_view={"rows": "block"},
    ),
    layout_hint="vllm-getter",
)
_C = dict(
    _B,
    options=_options(
        _B["options"], mamba_unified_view={"tiling": "aligned", "hints": ("NHD", "HND")}
    ),
    snapshot_modes=("align", "all"),
    layout_hint="translated",
)
_D = dict(
    _C,
    options=_options(
        _C["options"],
        mamba_unified_view={
            "tiling": "aligned",
            "hints": ("NHD", "HND", "BLHNC", "BLNHC"),
        },
        subpaged_mla_attention_view={"rows": "states"},
        subpaged_attention_view={"ranks": (4, 5)},
    ),
    slot_compression=_NEW_SLOT_COMPRESSION,
    per_layer_specs=True,
)
_E = dict(
    _D,
    rules=_SEVEN_RULES,
    options=_options(
        _D["options"],
        mamba_page_view={"values": "page-strided", "conv_at_storage_start": False},
    ),
    prerelease=True,
)


def _family(spec: dict, *versions: str) -> dict[str, LMCacheRelease]:
    return {v: LMCacheRelease(version=v, same_rules=versions, **spec) for v in versions}


def _without_hybrid_groups(family: dict[str, LMCacheRelease], *versions: str) -> dict:
    return {v: (dataclasses.replace(r, hybrid_groups=False) if v in versions else r)
            for v, r in family.items()}


#: Every LMCache release kvexplore knows, oldest first.
LMCACHE_RELEASES: FrozenDict = FrozenDict(
    {
        **_without_hybrid_groups(_family(_A, "0.4.7", "0.5.0", "0.5.1", "0.5.2"),
                                 "0.4.7", "0.5.0"),
        **_family(_B, "0.5.3", "0.5.4"),
        **_family(_C, "0.5.5"),
        **_family(_D, "0.5.6"),
        **_family(_E, "0.5.7rc2"),
    }
)

#: The default when no LMCache is installed beside kvexplore.
NEWEST_STABLE = "0.5.6"


def lmcache_releases(*, prereleases: bool = True) -> tuple[str, ...]:
    """The known releases, oldest first (``prereleases=False``: stable only)."""
    return tuple(
        v for v, r in LMCACHE_RELEASES.items() if prereleases or not r.prerelease
    )


def installed_lmcache() -> str | None:
    """The version of the ``lmcache`` distribution installed beside kvexplore
    (its package metadata), or ``None``."""
    try:
        return importlib.metadata.version("lmcache")
    except importlib.metadata.PackageNotFoundError:
        return None


def lmcache_release(lmcache: object = None) -> LMCacheRelease:
    """The release ``lmcache`` names: a version (``"0.5.2"``, ``"v0.5.2"``,
    ``"0.5"`` is refused as ambiguous) or an :class:`LMCacheRelease`;
    ``None`` is the installed LMCache when there is one, else
    :data:`NEWEST_STABLE`.  Refuses a release kvexplore does not know,
    naming the ones it does."""
    if isinstance(lmcache, LMCacheRelease):
        return lmcache
    source = ""
    if lmcache is None:
        installed = installed_lmcache()
        if installed is None:
            return LMCACHE_RELEASES[NEWEST_STABLE]
        lmcache, source = installed, " (the LMCache installed beside kvexplore)"
    if not isinstance(lmcache, str):
        raise KVExploreError(
            f"lmcache={lmcache!r} is a {type(lmcache).__name__}; expected a release "
            f"string, one of {', '.join(LMCACHE_RELEASES)}"
        )
    v = parse_release(lmcache)
    if v is None or v.local or v.post is not None or v.dev is not None or v.epoch:
        raise KVExploreError(
            f"lmcache={lmcache!r}{source} is not a release version; expected one of "
            f"{', '.join(LMCACHE_RELEASES)}"
        )
    if len(v.release) > 3:
        raise KVExploreError(
            f"lmcache={lmcache!r}{source} is not a release version; expected one of "
            f"{', '.join(LMCACHE_RELEASES)}"
        )
    if len(v.release) < 3:
        raise KVExploreError(
            f"lmcache={lmcache!r}{source} names no patch release; expected one of "
            f"{', '.join(LMCACHE_RELEASES)}"
        )
    canonical = str(v)
    try:
        return LMCACHE_RELEASES[canonical]
    except KeyError:
        raise KVExploreError(
            f"lmcache={lmcache!r}{source} is not a release kvexplore knows; expected one "
            f"of {', '.join(LMCACHE_RELEASES)} (0.4.7 is the first with "
            "kv_cache_group_edits.py)"
        ) from None
