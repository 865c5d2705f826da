"""What LMCache stores for a deployment: its groups, chunks and bytes, per release.

:func:`lmcache_layout` answers, for one plan and one LMCache release, what
that release's multi-process mode (``LMCacheMPConnector``, the only LMCache
connector that declares vLLM's hybrid-KV support) does with the KV cache vLLM
registers: whether the connector and the server accept the deployment with a
chunk size (each refusal the release's own message), the engine groups its
worker builds, the kernel and object groups its server builds, the slots and
bytes one chunk stores per kernel group, the scheduler block, the chunk the
server really uses, and how many tokens of a prompt are stored and hit.

Every answer is the release's own code, run in a process of its own (a
child that the long-lived probe process, :class:`ProbeWorker`, forks for
the release: :mod:`kvexplore.connectors.lmcache_probe`, which imports
neither kvexplore nor any other LMCache) on the plan's ``KVCacheConfig``
and vLLM's registered tensors for it (:func:`kvexplore.allocate`, a few
blocks on the CPU): the release's wheel is installed once, ``--no-deps``,
into kvexplore's cache folder (:func:`lmcache_package`).  What is not a function of the release is
stated where it is used: the tokens stored and hit follow the scheduler
adapter's lookup (``vllm_multi_process_adapter.py:
maybe_submit_lookup_request``: whole chunks of the prompt, the last token
held back where the release reserves it in ``align`` / ``all`` mode) and the
bytes per chunk follow the cache context's buffer shape.

Refused with a :class:`~kvexplore.errors.KVExploreError` naming the value: a
chunk size that is not a positive integer, an ``engine_type`` other than
``"default"`` / ``"blend"``, a ``separate_object_groups`` that is not a
bool, an LMCache release kvexplore does not know, a plan whose
``kv_transfer_config`` names another connector, and a wheel that cannot be
installed.  A deployment the release refuses is a result (``accepted`` is
``False``, ``refusal`` its message), never an error.
"""

from __future__ import annotations

import importlib.util
import math
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import pandas as pd

from kvexplore.display import Displayable
from kvexplore.editing.lmcache import LMCACHE_RELEASES, LMCacheRelease, lmcache_release
from kvexplore.errors import KVExploreError
from kvexplore.memo import keys as memo_keys
from kvexplore.memo import per_plan
from kvexplore.paths import cache_dir
from kvexplore.versions.environments import LineWorker, idle_seconds

__all__ = [
    "LMCacheCheck",
    "LMCacheLayout",
    "lmcache_layout",
    "lmcache_layouts",
    "lmcache_package",
    "ProbeWorker",
    "probe_worker",
]

#: The connector whose layout :func:`lmcache_layout` answers.
MP_CONNECTOR = "LMCacheMPConnector"
#: ``engine_type`` values: the server's default engine and CacheBlend
#: (``--engine-type blend``, which keeps every sliding-window block of a chunk).
ENGINE_TYPES = ("default", "blend")
#: Blocks of the plan's layout registered for the release's functions (the
#: answers do not depend on the block count).
PROBE_BLOCKS = 4
#: Multiples of the groups' alignment tried by :meth:`LMCacheLayout.smallest_chunk`.
SCAN_MULTIPLES = 8

PROBE = Path(__file__).with_name("lmcache_probe.py")


class LMCacheCheck(NamedTuple):
    """One check of the release: its name, the function and file that ran it,
    whether it passed, the error type and the release's own message."""

    name: str
    where: str
    ok: bool
    error: str
    message: str


def lmcache_package(release: str) -> Path:
    """The folder holding LMCache ``release``'s ``lmcache`` package, installed
    ``pip install --no-deps --target`` into ``<kvexplore cache>/lmcache/``
    once (a temporary sibling renamed into place).  Refused with a
    :class:`KVExploreError` when the wheel cannot be installed."""
    target = cache_dir() / "lmcache" / f"lmcache-{release}"
    if (target / "lmcache").is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        if importlib.util.find_spec("pip") is not None:
            command = [sys.executable, "-m", "pip", "install", "--quiet",
                       "--disable-pip-version-check"]
        else:  # an environment made by uv has no pip
            command = [shutil.which("uv") or "uv", "pip", "install", "--quiet",
                       "--python", sys.executable]
        command += ["--no-deps", "--target", str(staging), f"lmcache=={release}"]
        done = subprocess.run(command, capture_output=True, text=True, timeout=900)
        if done.returncode:
            raise KVExploreError(
                f"LMCache {release} could not be installed: `{' '.join(command)}` "
                f"exited {done.returncode}: {(done.stderr or done.stdout)[-800:]}; "
                f"expected the package index (or a pip configuration naming a mirror "
                f"with lmcache=={release})"
            )
        try:
            os.replace(staging, target)
        except OSError:
            if not (target / "lmcache").is_dir():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def check_chunk_size(chunk_size: Any) -> int:
    """``chunk_size`` if it is a positive integer; else a ``KVExploreError``."""
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int):
        raise KVExploreError(
            f"chunk_size={chunk_size!r} is a {type(chunk_size).__name__}; expected a "
            "positive integer (LMCache's --chunk-size, tokens per chunk)"
        )
    if chunk_size <= 0:
        raise KVExploreError(
            f"chunk_size={chunk_size} is not positive; expected a positive integer "
            "(LMCache's --chunk-size, tokens per chunk)"
        )
    return chunk_size


def _check_options(separate_object_groups: Any, engine_type: Any) -> None:
    if separate_object_groups is not None and not isinstance(separate_object_groups, bool):
        raise KVExploreError(
            f"separate_object_groups={separate_object_groups!r}; expected True, False "
            "or None (the release's default)"
        )
    if engine_type not in ENGINE_TYPES:
        raise KVExploreError(
            f"engine_type={engine_type!r}; expected one of {', '.join(ENGINE_TYPES)}"
        )


def _check_connector(plan) -> None:
    transfer = getattr(plan.vllm_config, "kv_transfer_config", None)
    name = getattr(transfer, "kv_connector", None)
    if name and name != MP_CONNECTOR:
        raise KVExploreError(
            f"the plan's kv_transfer_config names {name!r}; expected {MP_CONNECTOR!r} "
            "(LMCache's only connector that declares vLLM's hybrid KV cache support, "
            "SupportsHMA) or no connector"
        )


def tensors_as_data(caches: dict) -> tuple[list[int], dict]:
    """Registered tensors as plain data: per layer its container and, per
    tensor, (storage index, shape, stride, storage offset, dtype name)."""
    import torch

    storages: list = []
    layers = {}
    for name, value in caches.items():
        tensors = [value] if isinstance(value, torch.Tensor) else list(value)
        descs = []
        for t in tensors:
            storage = t.untyped_storage()
            ptrs = [s.data_ptr() for s in storages]
            if storage.data_ptr() not in ptrs:
                storages.append(storage)
                ptrs.append(storage.data_ptr())
            descs.append((ptrs.index(storage.data_ptr()), tuple(t.shape), tuple(t.stride()),
                          t.storage_offset(), str(t.dtype).split(".")[-1]))
        container = "tensor" if isinstance(value, torch.Tensor) else type(value).__name__
        layers[name] = (container, descs)
    return [s.nbytes() for s in storages], layers


def _request(plan, chunk_sizes, separate, engine_type) -> dict:
    from kvexplore.planning.release import legacy_kv_cache_layout
    from kvexplore.registration import allocate

    small = plan.with_num_blocks(PROBE_BLOCKS)
    caches = allocate(small, device="cpu")
    storages, layers = tensors_as_data(caches)
    vc = plan.vllm_config
    # 0.5.3 / 0.5.4 call vLLM's get_kv_cache_layout(), which the installed
    # vLLM answers here (or lacks: no hint); later releases translate the
    # CacheConfig's layout in the probe with their own vllm_layout_hints.
    hint = legacy_kv_cache_layout()
    return {
        "config": small.kv_cache_config,
        "cache_config": vc.cache_config,
        "scheduler_config": vc.scheduler_config,
        "parallel_config": vc.parallel_config,
        "dcp_size": vc.parallel_config.decode_context_parallel_size,
        "hint": hint,
        "storages": storages,
        "layers": layers,
        "chunk_sizes": list(chunk_sizes),
        "separate_object_groups": separate,
        "engine_type": engine_type,
    }


class ProbeWorker(LineWorker):
    """The long-lived probe process (``lmcache_probe.py serve``, this Python:
    the installed torch and vLLM, imported once): each question is one
    request for some releases, each answered in a child forked for it, so a
    release's ``lmcache`` is imported only in its own child.  Its life (start
    on first use, restart once, idle exit, end at exit) is
    :class:`~kvexplore.versions.environments.LineWorker`'s; its environment
    is this process's at its start, with LMCache's logs at ``ERROR``."""

    where = "the LMCache probe"

    def _command(self) -> tuple[list[str], dict[str, str]]:
        env = dict(os.environ, LMCACHE_LOG_LEVEL="ERROR")
        return [sys.executable, str(PROBE), "serve", str(idle_seconds())], env


_PROBE_WORKER = ProbeWorker()


def probe_worker() -> ProbeWorker:
    """This process's :class:`ProbeWorker` (its process starts on its first question)."""
    return _PROBE_WORKER


def _run_probe(releases: list[LMCacheRelease], request: dict) -> dict[str, dict]:
    """``{version: the probe's answer}`` for ``releases`` from
    :func:`probe_worker` (one child per release)."""
    packages = {r.version: lmcache_package(r.version) for r in releases}
    with tempfile.TemporaryDirectory() as folder:
        req = os.path.join(folder, "request.pkl")
        with open(req, "wb") as f:
            pickle.dump(request, f)
        probe_worker().request({"request": req, "out": folder,
                                "releases": [str(p) for p in packages.values()]})
        answers = {}
        for release in releases:
            out = os.path.join(folder, packages[release.version].name + ".pkl")
            if not os.path.exists(out):
                raise KVExploreError(
                    f"{release}'s code could not be run on this plan: its child of the probe "
                    f"ended without an answer: {probe_worker().last_lines()}")
            with open(out, "rb") as f:
                result = pickle.load(f)
            if "error" in result:
                raise KVExploreError(
                    f"{release}'s code could not be run on this plan:\n{result['error']}")
            answers[release.version] = result["ok"]
    return answers


def _checks(rows) -> tuple[LMCacheCheck, ...]:
    return tuple(LMCacheCheck(*row) for row in rows)


@dataclass(frozen=True)
class LMCacheLayout(Displayable):
    """What one LMCache release stores for one plan at one chunk size.

    ``checks``: every check the release ran, in the connector's order
    (``mamba_step_alignment``, ``kv_cache_groups``, ``layout_hints``,
    ``kv_cache_group_edits``, ``engine_group_infos``, ``scheduler_chunk``,
    ``connector_chunk``, ``server_groups``); ``accepted`` is whether all
    passed, ``refusal`` the first that did not.  ``chunk_size`` is the chunk the
    server uses (``asked_chunk_size`` rounded up where the release negotiates
    it).  ``engine_groups`` / ``kernel_groups`` / ``object_groups`` are the
    release's groups as DataFrames (empty where a check before them refused);
    ``kernel_groups.chunk_bytes`` is what one chunk stores per kernel group.
    ``warnings``: what the release accepts silently but a user should know
    (:func:`silent_risks`).
    """

    plan: Any = field(repr=False)
    release: LMCacheRelease
    asked_chunk_size: int
    chunk_size: int
    negotiated: bool
    separate_object_groups: bool
    separate_object_groups_default: bool
    engine_type: str
    checks: tuple[LMCacheCheck, ...]
    group_tokens_per_block: tuple[int, ...]
    scheduler_block: int
    hit_alignment: int
    reserve_last_token: bool
    engine_groups: pd.DataFrame = field(repr=False)
    kernel_groups: pd.DataFrame = field(repr=False)
    object_groups: pd.DataFrame = field(repr=False)
    scanned: tuple[tuple[int, bool], ...] = field(repr=False, default=())
    warnings: tuple[str, ...] = ()

    @property
    def accepted(self) -> bool:
        return all(c.ok for c in self.checks)

    @property
    def refusal(self) -> LMCacheCheck | None:
        return next((c for c in self.checks if not c.ok), None)

    @property
    def check_table(self) -> pd.DataFrame:
        return pd.DataFrame([c._asdict() for c in self.checks])

    @property
    def chunk_bytes(self) -> int:
        """Bytes one chunk stores over all kernel groups (0 when refused)."""
        if not self.accepted or self.kernel_groups.empty:
            return 0
        return int(self.kernel_groups["chunk_bytes"].sum())

    @property
    def bytes_per_token(self) -> float:
        return self.chunk_bytes / self.chunk_size if self.chunk_size else 0.0

    @property
    def has_recurrent_groups(self) -> bool:
        return (not self.kernel_groups.empty) and bool(self.kernel_groups["recurrent_state"].any())

    def server_flags(self) -> list[str]:
        """The LMCache server flags this answer assumes."""
        flags = [f"--chunk-size {self.asked_chunk_size}"]
        if self.separate_object_groups != self.separate_object_groups_default:
            flags.append("--separate-object-groups" if self.separate_object_groups
                         else "--no-separate-object-groups")
        if self.engine_type != "default":
            flags.append(f"--engine-type {self.engine_type}")
        return flags

    def _prompt(self, prompt_tokens: Any) -> int:
        if isinstance(prompt_tokens, bool) or not isinstance(prompt_tokens, int) or prompt_tokens < 0:
            raise KVExploreError(
                f"prompt_tokens={prompt_tokens!r}; expected a non-negative integer"
            )
        return prompt_tokens

    def stored(self, prompt_tokens: int) -> int:
        """Tokens of a ``prompt_tokens`` prompt LMCache stores: whole chunks only
        (the scheduler adapter stores ``floor(P / chunk) * chunk``); 0 when refused.
        A recurrent group stores a chunk only where vLLM left a state at its end
        (``align`` mode: a block boundary where a scheduler step ended)."""
        p = self._prompt(prompt_tokens)
        return (p // self.chunk_size) * self.chunk_size if self.accepted else 0

    def hit(self, prompt_tokens: int) -> int:
        """Tokens a later request of the same ``prompt_tokens`` prompt finds
        stored: the lookup covers whole chunks of the prompt, less its last token
        where the release reserves it (``align`` / ``all`` mode from 0.5.6:
        ``maybe_submit_lookup_request(..., reserve_last_token=True)``); vLLM
        then loads one token fewer when the hit is the whole prompt."""
        p = self._prompt(prompt_tokens)
        if not self.accepted:
            return 0
        lookup = max(0, p - int(self.reserve_last_token))
        return (lookup // self.chunk_size) * self.chunk_size

    def smallest_chunk(self) -> int | None:
        """The smallest chunk size the release accepts for this deployment,
        among the asked one and the first multiples of the groups' alignment
        (``None`` when a check that does not depend on the chunk refuses)."""
        accepted = [c for c, ok in self.scanned if ok]
        return min(accepted) if accepted else None

    @property
    def vllm_blocks(self) -> pd.DataFrame:
        """vLLM's groups beside LMCache's: per vLLM group its spec, block size,
        layers and page bytes per block."""
        rows = []
        for index, group in enumerate(self.plan.kv_cache_config.kv_cache_groups):
            spec = group.kv_cache_spec
            rows.append({"group": index, "spec": type(spec).__name__,
                         "block_size": spec.block_size, "layers": len(group.layer_names),
                         "page_bytes": spec.page_size_bytes})
        return pd.DataFrame(rows)


def silent_risks(plan, kernel: pd.DataFrame, separate: bool) -> tuple[str, ...]:
    """What the release accepts without refusing, stated from its groups:
    a kernel group with fewer slots per block than tokens per block is moved
    compressed (``_validate_block_chunk_size_config`` only logs it); steps of
    more than one Mamba block with every group in one object group (vLLM
    leaves the skipped blocks null, ``MambaManager.allocate_new_blocks``, and
    ``validate_mamba_step_alignment``'s contract allows such steps only with
    ``--separate-object-groups``)."""
    out = []
    if kernel.empty:
        return ()
    for row in kernel.to_dict("records"):
        if row["slots_per_block"] < row["tokens_per_block"]:
            out.append(
                f"kernel group {row['kernel_group']} is compressed: {row['slots_per_block']} "
                f"slots per {row['tokens_per_block']}-token block, so each chunk moves "
                f"{row['slots_per_chunk']:,} slots for its tokens (logged, not refused)")
    recurrent = kernel[kernel["recurrent_state"]]
    if not recurrent.empty and not separate:
        block = int(recurrent["tokens_per_block"].min())
        steps = plan.vllm_config.scheduler_config.max_num_batched_tokens
        if steps >= 2 * block:
            out.append(
                f"max_num_batched_tokens={steps:,} lets one prefill step advance "
                f"{steps // block} Mamba blocks of {block:,} tokens (vLLM leaves the skipped "
                "ones null) while every group shares one object group: such steps are "
                "safe only with --separate-object-groups")
    return tuple(out)


def _frames(probed: dict, chunk: int) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    one = probed["chunks"][chunk]
    engine = pd.DataFrame(probed["engine_groups"] or [])
    kernel = pd.DataFrame(one.get("kernel_groups") or [])
    objects = pd.DataFrame(one.get("object_groups") or [])
    return engine, kernel, objects


def _scan(probed: dict) -> tuple[tuple[int, bool], ...]:
    base_ok = all(row[2] for row in probed["checks"])
    return tuple(
        (int(one["chunk_size"]), base_ok and all(row[2] for row in one["checks"]))
        for one in probed["chunks"].values()
    )


def _candidates(plan, chunk: int) -> list[int]:
    """The asked chunk and the first multiples of every group's block span
    (an upper bound on what any release requires: each checks the chunk
    against the groups' spans and the scheduler block, which divides their
    lcm times the DCP size)."""
    spans = [g.kv_cache_spec.block_size for g in plan.kv_cache_config.kv_cache_groups]
    dcp = plan.vllm_config.parallel_config.decode_context_parallel_size
    unit = math.lcm(plan.vllm_config.cache_config.block_size, *spans) if spans else 1
    base = [unit * k for k in (1, dcp)] if dcp > 1 else [unit]
    out = [chunk]
    for b in base:
        out += [b * k for k in range(1, SCAN_MULTIPLES + 1)]
    return list(dict.fromkeys(out))


def _hybrid_release(lmcache: Any) -> LMCacheRelease:
    release = lmcache_release(lmcache)
    if not release.hybrid_groups:
        hybrid = [v for v, r in LMCACHE_RELEASES.items() if r.hybrid_groups]
        raise KVExploreError(
            f"lmcache={release.version!r}: its multi-process connector builds no groups from "
            f"vLLM's KV cache groups (no create_engine_group_infos_from_vllm over per-layer "
            f"formats); expected one of {', '.join(hybrid)}"
        )
    return release


def _plan_of(plan_or_model: Any, plan_kwargs: dict):
    from kvexplore.planning.planner import Plan
    from kvexplore.planning.planner import plan as make_plan

    if isinstance(plan_or_model, Plan):
        if plan_kwargs:
            raise KVExploreError(
                f"engine arguments {sorted(plan_kwargs)} given with a Plan; expected "
                "them only with a model (the plan already holds its arguments)"
            )
        p = plan_or_model
    else:
        p = make_plan(plan_or_model, **plan_kwargs)
    _check_connector(p)
    return p


def _layout(p, release: LMCacheRelease, chunk: int, engine_type: str,
            probed: dict) -> LMCacheLayout:
    engine, kernel, objects = _frames(probed, chunk)
    one = probed["chunks"][chunk]
    return LMCacheLayout(
        plan=p,
        release=release,
        asked_chunk_size=chunk,
        chunk_size=int(one["chunk_size"]),
        negotiated=bool(one["negotiated"]),
        separate_object_groups=bool(probed["separate_object_groups"]),
        separate_object_groups_default=bool(probed["separate_object_groups_default"]),
        engine_type=engine_type,
        checks=_checks(probed["checks"]) + _checks(one["checks"]),
        group_tokens_per_block=tuple(int(s) for s in probed["group_tokens_per_block"]),
        scheduler_block=int(probed["scheduler_block"]),
        hit_alignment=int(probed["hit_alignment"]),
        reserve_last_token=bool(probed["reserve_last_token"]),
        engine_groups=engine,
        kernel_groups=kernel,
        object_groups=objects,
        scanned=_scan(probed),
        warnings=silent_risks(p, kernel, bool(probed["separate_object_groups"])),
    )


def lmcache_layouts(plan_or_model: Any = "Qwen/Qwen3.5-0.8B", *, lmcache: Any = None,
                    chunk_size: int = 256, separate_object_groups: bool | None = None,
                    engine_type: str = "default", **plan_kwargs: Any) -> dict[str, LMCacheLayout]:
    """:func:`lmcache_layout` for several LMCache releases at once:
    ``{version: LMCacheLayout}`` in the order of ``lmcache`` (a list of
    releases; ``None``: every release kvexplore knows whose connector builds
    hybrid groups).  The releases run in one process (torch and vLLM imported
    once, one child per release); answers already given for the plan are kept."""
    chunk = check_chunk_size(chunk_size)
    _check_options(separate_object_groups, engine_type)
    if lmcache is None:
        names = [v for v, r in LMCACHE_RELEASES.items() if r.hybrid_groups]
    elif isinstance(lmcache, (str, LMCacheRelease)):
        names = [lmcache]
    else:
        names = list(lmcache)
    releases = [_hybrid_release(r) for r in names]
    p = _plan_of(plan_or_model, plan_kwargs)

    def key(release):
        return ("lmcache_layout", release.version, chunk, separate_object_groups, engine_type)

    kept = set(memo_keys(p))
    missing = [r for r in releases if key(r) not in kept]
    answers = (_run_probe(missing, _request(p, _candidates(p, chunk), separate_object_groups,
                                            engine_type)) if missing else {})
    return {r.version: _layout(p, r, chunk, engine_type,
                               per_plan(p, key(r), lambda r=r: answers[r.version]))
            for r in releases}


def lmcache_layout(plan_or_model: Any = "Qwen/Qwen3.5-0.8B", *, lmcache: Any = None,
                   chunk_size: int = 256, separate_object_groups: bool | None = None,
                   engine_type: str = "default", **plan_kwargs: Any) -> LMCacheLayout:
    """What LMCache ``lmcache`` stores for a deployment at ``chunk_size``.

    ``plan_or_model``: a :class:`~kvexplore.Plan`, or a model for
    :func:`kvexplore.plan` with ``plan_kwargs`` (``gpu=``, engine arguments
    under vLLM's names).  ``lmcache``: a release kvexplore knows (``None``:
    the installed LMCache, else the newest stable).  ``separate_object_groups``:
    the server's ``--separate-object-groups`` (``None``: the release's
    default).  ``engine_type``: ``"default"`` or ``"blend"``.
    See the module doc for what runs where and what is refused."""
    release = lmcache_release(lmcache)
    return lmcache_layouts(plan_or_model, lmcache=[release], chunk_size=chunk_size,
                           separate_object_groups=separate_object_groups,
                           engine_type=engine_type, **plan_kwargs)[release.version]
