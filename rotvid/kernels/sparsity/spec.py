"""``SparsitySpec`` (which block map a call runs under), its text form, its JSON, and the registry of map kinds.

A map kind is one module (:mod:`rotvid.kernels.sparsity.radial`, :mod:`rotvid.kernels.sparsity.topp`) defining a
:class:`SparsityKind` -- its name, parameters, whether it is static (built from the token grid once) or dynamic
(built per call from q and k), and its builder -- and one registry line in :mod:`rotvid.kernels.sparsity`. The
parser, the JSON round trip, the error messages and :func:`build_block_map` all ask the registry.

Text form (``--sparsity`` on the command line, ``sparsity`` in a config)::

    none                              every key block (the default)
    radial                            radial[:band=INT,window=INT,decay=FLOAT]
    topp:0.9                          topp:TAU[,sim=FLOAT]   (the bare value is the kind's first parameter)
    oracle:0.5                        oracle:DENSITY         (evaluation only: exact block masses per call)

``str(spec)`` writes the canonical text (parameters at their defaults left out), which parses back to an equal
spec; :meth:`SparsitySpec.to_dict` writes every parameter.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from rotvid.kernels.sparsity.block_map import BlockMap
from rotvid.kernels.sparsity.grid import TokenGrid

__all__ = [
    "NONE", "REQUIRED", "SPARSITY_VERSION", "MapParam", "SparseMap", "SparsityKind", "SparsitySpec", "accepted_forms",
    "build_block_map", "get_sparsity_kind", "parse_sparsity", "register_sparsity_kind", "sparsity_kind_names",
    "unregister_sparsity_kind",
]

SPARSITY_VERSION = 1
WHERE = "sparsity (--sparsity)"


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()  # a parameter default meaning "no default: the text must give it"


@dataclass(frozen=True)
class MapParam:
    """One parameter of a map kind.

    Attributes:
        name: its name in the text form and the JSON.
        kind: ``"int"``, ``"float"`` or ``"int?"`` (an int, or None written ``none``).
        default: its value when not given (:data:`REQUIRED`: none, the text must give it).
        valid: ``valid(value) -> ""`` when the value is allowed, else what is expected (e.g. ``"in (0, 1]"``).
        help: a few words for the error messages and ``--help``.
    """

    name: str
    kind: str
    default: Any
    valid: Callable[[Any], str]
    help: str = ""

    def placeholder(self) -> str:
        return {"int": "INT", "float": "FLOAT", "int?": "INT"}[self.kind]

    def coerce(self, value: Any) -> Any:
        """``value`` (text from the command line, or a JSON value) as this parameter's type; ValueError otherwise."""
        if isinstance(value, str):
            text = value.strip()
            if self.kind == "int?" and text.lower() == "none":
                return None
            try:
                value = int(text) if self.kind in ("int", "int?") else float(text)
            except ValueError:
                raise ValueError(f"{self.name}: expected {self._expected()}, got {text!r}") from None
        if value is None and self.kind == "int?":
            return None
        if self.kind in ("int", "int?"):
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{self.name}: expected {self._expected()}, got {value!r}")
            return int(value)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"{self.name}: expected {self._expected()}, got {value!r}")
        return float(value)

    def _expected(self) -> str:
        return {"int": "an int", "float": "a number", "int?": "an int or none"}[self.kind]


@dataclass(frozen=True)
class SparseMap:
    """What a map builder returns: the :class:`BlockMap` and, for a dynamic map, its estimated dropped mass per
    query tile (float32 [B, H, Tq]: the estimated probability mass of the skipped key blocks, for reports; exact
    for ``oracle``) -- None for a static map. ``block_mass``: the exact attention mass of every (query tile, key
    block) [B, H, Tq, Tk] when the builder computed it (``oracle``; :func:`rotvid.kernels.sparsity.oracle.
    block_attention_mass`), else None: the runtime reuses it to report the kept mass."""

    block_map: BlockMap
    dropped_mass: torch.Tensor | None = None
    block_mass: torch.Tensor | None = None


@dataclass(frozen=True)
class SparsityKind:
    """One kind of block map (see the module docstring).

    Attributes:
        name: ``radial``, ``topp``, ...
        summary: one line for docs and ``--help``.
        params: its parameters, in text order.
        positional: the parameter a bare value sets (``topp:0.9`` -> ``tau``), or None.
        static: True when the map depends on the token grid only (built once per resolution and cached), False when
            it is built per call from q and k.
        build: ``build(spec, q, k, *, layout, kv_lens, sm_scale, grid) -> SparseMap``; None for ``none`` (no map).
            ``q``, ``k`` are the call's (their values are read by dynamic kinds only); ``grid`` a :class:`TokenGrid`
            or None (a static kind raises a ValueError naming ``grid`` without one).
    """

    name: str
    summary: str
    params: tuple[MapParam, ...] = ()
    positional: str | None = None
    static: bool = True
    build: Callable[..., SparseMap] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise ValueError(f"name: expected an identifier-like kind name, got {self.name!r}")
        names = [p.name for p in self.params]
        if len(set(names)) != len(names):
            raise ValueError(f"params: duplicate names in {names}")
        if self.positional is not None and self.positional not in names:
            raise ValueError(f"positional: {self.positional!r} is not one of the params {names}")

    def param(self, name: str) -> MapParam:
        for p in self.params:
            if p.name == name:
                return p
        raise ValueError(f"{WHERE}: {self.name} has no parameter {name!r} (its parameters: "
                         f"{', '.join(p.name for p in self.params) or 'none'})")

    def form(self) -> str:
        """The accepted text form, e.g. ``topp:TAU[,sim=FLOAT]``."""
        parts = []
        for p in self.params:
            if p.name == self.positional:
                continue
            parts.append(f"{p.name}={p.placeholder()}")
        head = self.name
        if self.positional is not None:
            pos = self.param(self.positional)
            required = pos.default is REQUIRED
            head += f":{pos.name.upper()}" if required else f"[:{pos.name.upper()}]"
            return head + (f"[,{','.join(parts)}]" if parts else "")
        return head + (f"[:{','.join(parts)}]" if parts else "")


# ---- the registry -------------------------------------------------------------------------------------------

_KINDS: dict[str, SparsityKind] = {}


def register_sparsity_kind(kind: SparsityKind, *, replace: bool = False) -> SparsityKind:
    """Add ``kind`` under ``kind.name`` (``replace=True`` to overwrite); returns it."""
    if not isinstance(kind, SparsityKind):
        raise ValueError(f"kind: expected a SparsityKind, got {type(kind).__name__}")
    if kind.name in _KINDS and not replace:
        raise ValueError(f"kind: {kind.name!r} is already registered (pass replace=True to overwrite it)")
    _KINDS[kind.name] = kind
    return kind


def unregister_sparsity_kind(name: str) -> SparsityKind:
    """Remove the kind ``name``; returns it."""
    kind = get_sparsity_kind(name)
    del _KINDS[name]
    return kind


def get_sparsity_kind(name: str) -> SparsityKind:
    """The registered kind ``name``; ValueError listing the accepted forms otherwise."""
    kind = _KINDS.get(name) if isinstance(name, str) else None
    if kind is None:
        raise ValueError(f"{WHERE}: unknown kind {name!r}; expected {accepted_forms()}")
    return kind


def sparsity_kind_names() -> tuple[str, ...]:
    return tuple(_KINDS)


def accepted_forms() -> str:
    """The accepted text forms, one per registered kind: ``none | radial[:band=INT,...] | topp:TAU[,sim=FLOAT]``."""
    return " | ".join(k.form() for k in _KINDS.values())


# ---- the spec -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SparsitySpec:
    """Which block map a call runs under: a registered kind and its parameters.

    ``params`` may be given as a dict or as ``(name, value)`` pairs; it is stored as pairs in the kind's order with
    every default filled in (so equal specs compare and hash equal). ValueError naming ``sparsity`` for an unknown
    kind, an unknown or missing parameter, or a value out of range.
    """

    kind: str = "none"
    params: tuple = field(default=())

    def __post_init__(self) -> None:
        info = get_sparsity_kind(self.kind)
        given = dict(self.params.items() if isinstance(self.params, dict) else self.params)
        values = []
        for p in info.params:
            if p.name in given:
                try:
                    value = p.coerce(given.pop(p.name))
                except ValueError as err:
                    raise ValueError(f"{WHERE}: {self.kind} {err}; expected {info.form()}") from None
            elif p.default is REQUIRED:
                raise ValueError(f"{WHERE}: {self.kind} needs {p.name} ({p.help}); expected {info.form()}")
            else:
                value = p.default
            problem = p.valid(value)
            if problem:
                raise ValueError(f"{WHERE}: {self.kind} {p.name} must be {problem}, got {value!r}; expected {info.form()}")
            values.append((p.name, value))
        if given:
            raise ValueError(
                f"{WHERE}: {self.kind} has no parameter {', '.join(map(repr, sorted(given)))}; expected {info.form()}"
            )
        object.__setattr__(self, "params", tuple(values))

    @property
    def info(self) -> SparsityKind:
        """The registered :class:`SparsityKind`."""
        return get_sparsity_kind(self.kind)

    @property
    def options(self) -> dict[str, Any]:
        """The parameters as a dict (every one, defaults included)."""
        return dict(self.params)

    @property
    def enabled(self) -> bool:
        """False for ``none`` (the dense call)."""
        return self.info.build is not None

    @property
    def static(self) -> bool:
        return self.info.static

    def __str__(self) -> str:
        info = self.info
        opts = self.options
        head, rest = self.kind, []
        for p in info.params:
            value = opts[p.name]
            if p.name == info.positional and p.default is REQUIRED:
                head += f":{_fmt(value)}"
            elif value != p.default:
                rest.append(f"{p.name}={_fmt(value)}")
        if rest:
            head += ("," if ":" in head else ":") + ",".join(rest)
        return head

    # ---- JSON ---------------------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {"version": SPARSITY_VERSION, "kind": self.kind, "params": self.options}

    @classmethod
    def from_dict(cls, d: dict) -> "SparsitySpec":
        if not isinstance(d, dict):
            raise ValueError(f"{WHERE}: expected a JSON object, got {type(d).__name__}")
        unknown = set(d) - {"version", "kind", "params"}
        if unknown:
            raise ValueError(f"{WHERE}: unknown keys {sorted(unknown)}; expected version, kind, params")
        if d.get("version", SPARSITY_VERSION) != SPARSITY_VERSION:
            raise ValueError(f"{WHERE}: version must be {SPARSITY_VERSION}, got {d.get('version')!r}")
        params = d.get("params", {})
        if not isinstance(params, dict):
            raise ValueError(f"{WHERE}: params must be a JSON object, got {type(params).__name__}")
        return cls(d.get("kind", "none"), params)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "SparsitySpec":
        try:
            d = json.loads(text)
        except (TypeError, json.JSONDecodeError) as err:
            raise ValueError(f"{WHERE}: not valid JSON ({err})") from None
        return cls.from_dict(d)


def _fmt(value: Any) -> str:
    if value is None:
        return "none"
    return repr(value) if isinstance(value, float) else str(value)


def parse_sparsity(text: str | SparsitySpec) -> SparsitySpec:
    """The spec of ``text`` (``none``, ``radial``, ``radial:band=1,decay=0.5``, ``topp:0.9``, ``topp:0.9,sim=0.5``,
    ...); a :class:`SparsitySpec` is returned as is. ValueError naming ``sparsity`` and listing the accepted forms."""
    if isinstance(text, SparsitySpec):
        return text
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"{WHERE}: expected text, one of {accepted_forms()}; got {text!r}")
    name, sep, rest = text.strip().partition(":")
    info = get_sparsity_kind(name.strip())
    params: dict[str, str] = {}
    if rest.strip():
        for i, item in enumerate(rest.split(",")):
            key, eq, value = item.partition("=")
            if not eq:
                if i != 0 or info.positional is None:
                    raise ValueError(f"{WHERE}: {item.strip()!r} in {text!r} is not NAME=VALUE; expected {info.form()}")
                key, value = info.positional, item
            key = key.strip()
            info.param(key)  # ValueError for an unknown name
            if key in params:
                raise ValueError(f"{WHERE}: {key} given twice in {text!r}")
            params[key] = value
    elif sep:
        raise ValueError(f"{WHERE}: nothing after ':' in {text!r}; expected {info.form()}")
    return SparsitySpec(info.name, params)


NONE = SparsityKind(name="none", summary="no map: every key block (the dense call)")


def build_block_map(
    spec: SparsitySpec | str,
    q: torch.Tensor,
    k: torch.Tensor,
    *,
    layout: str = "BHND",
    kv_lens: torch.Tensor | None = None,
    sm_scale: float | None = None,
    grid: TokenGrid | None = None,
) -> SparseMap | None:
    """The block map ``spec`` gives a call on ``q``, ``k`` (``layout``; ``kv_lens`` int [B] or None; ``sm_scale``
    None: D ** -0.5; ``grid``: the sequence's :class:`TokenGrid`, needed by static kinds), or None for ``none``."""
    spec = parse_sparsity(spec)
    build = spec.info.build
    if build is None:
        return None
    built = build(spec, q, k, layout=layout, kv_lens=kv_lens, sm_scale=sm_scale, grid=grid)
    _check_built(spec, built, q, k, layout)
    return built


def _check_built(spec: SparsitySpec, built, q: torch.Tensor, k: torch.Tensor, layout: str) -> None:
    """ValueError naming ``block_map`` and the kind unless a builder (user code, for a registered kind) returned a
    :class:`SparseMap` holding a :class:`BlockMap` (its construction checked shapes and dtypes) for this call's
    tokens, on q's device. The batch / head dimensions and the values are checked where the map is used (the
    attention call: eagerly, values included; under ``torch.compile`` the kernels clamp them)."""
    who = f"block_map: sparsity kind {spec.kind!r} built"
    if not isinstance(built, SparseMap):
        raise ValueError(f"{who} a {type(built).__name__}, expected a SparseMap")
    if not isinstance(built.block_map, BlockMap):
        raise ValueError(f"{who} a SparseMap holding a {type(built.block_map).__name__}, expected a BlockMap")
    if layout not in ("BHND", "BNHD"):
        raise ValueError(f"layout: expected 'BHND' or 'BNHD', got {layout!r}")
    bm = built.block_map
    n_q, n_kv = (q.shape[2], k.shape[2]) if layout == "BHND" else (q.shape[1], k.shape[1])
    if (bm.n_q, bm.n_kv) != (n_q, n_kv):  # (batch / head dimensions: checked by the call, a static map's stand-in
        raise ValueError(                  # q has batch and heads 1)
            f"{who} a map for {bm.n_q} queries and {bm.n_kv} keys, the call has {n_q} queries and {n_kv} keys"
        )
    if built.block_map.device != q.device:
        raise ValueError(f"{who} a map on {built.block_map.device}, the call's q is on {q.device}")
