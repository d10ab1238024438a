"""Config spaces: named knobs, each a *code-shape* knob (changes generated source,
needs a compile) or a *run-time* knob (passed to the kernel as an argument).

A `Config` is frozen, hashable and round-trips through JSON; the database stores
configs, never code, and every config read back is validated against its space.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

from ir.errors import TensortuneError
from ir.keys import config_hash


class ConfigError(TensortuneError):
    """A config that does not belong to its space (unknown knob, bad value)."""


@dataclass(frozen=True)
class Knob:
    name: str
    options: tuple
    code_shape: bool = True   # False: a run-time argument, candidates share one compile
    # a knob added after configs were recorded: the value those configs ran as (filled in when
    # they are read back), so records and plans stay valid; None: configs without it are refused
    before: object = None

    def allows(self, value) -> bool:
        """Type-exact membership: 8.0, True and "8" are not the option 8 (nor True the option 1),
        so a config read back from JSON either is one the space made or is refused."""
        return any(type(value) is type(o) and value == o for o in self.options)

    def feature(self, value) -> list[float]:
        if all(isinstance(o, (int, float)) and not isinstance(o, bool) for o in self.options):
            return [math.log2(max(float(value), 1e-9)) if all(o > 0 for o in self.options) else float(value)]
        return [1.0 if value == o else 0.0 for o in self.options]


def split_options(extent: int, lo: int = 1, hi: int = 4096) -> tuple[int, ...]:
    """Powers of two from lo up to the first one >= extent (bounded by hi): split-factor candidates."""
    out, f = [], lo
    while f <= hi:
        out.append(f)
        if f >= extent:
            break
        f *= 2
    return tuple(out)


class Config:
    """An immutable assignment of a value to every knob of a space."""

    __slots__ = ("_items", "_hash")

    def __init__(self, values: dict[str, Any]):
        object.__setattr__(self, "_items", tuple(sorted(values.items())))
        object.__setattr__(self, "_hash", None)

    def __getitem__(self, name: str):
        for k, v in self._items:
            if k == name:
                return v
        raise KeyError(name)

    def get(self, name, default=None):
        try:
            return self[name]
        except KeyError:
            return default

    def to_json(self) -> dict:
        return dict(self._items)

    @property
    def hash(self) -> str:
        """The key records and claims know this config by (`ir.keys.config_hash`)."""
        return config_hash(self.to_json())

    def __eq__(self, other):
        return isinstance(other, Config) and self._items == other._items

    def __hash__(self):
        return hash(self._items)

    def __setattr__(self, *a):
        raise AttributeError("Config is immutable")

    def __reduce__(self):   # pickles (a Kernel travels to workers) without going through __setattr__
        return Config, (dict(self._items),)

    def __repr__(self):
        return "Config(" + ", ".join(f"{k}={v!r}" for k, v in self._items) + ")"


class ConfigSpace:
    """The product of the knobs' options, less the configs `constraint` rules out.

    `constraint(values) -> str | None` says why a config cannot run (a GPU block that needs
    more shared memory or threads than the device has): such configs are pruned before any
    build — never sampled, never proposed, refused by `validate`. `len` counts the product."""

    def __init__(self, knobs: Sequence[Knob], constraint=None):
        self.knobs = tuple(knobs)
        self._by_name = {k.name: k for k in self.knobs}
        self.constraint = constraint

    def why_invalid(self, cfg) -> str | None:
        """None when `cfg` can run, else the reason it is pruned."""
        if self.constraint is None:
            return None
        return self.constraint(cfg.to_json() if isinstance(cfg, Config) else dict(cfg))

    def allowed(self, cfg) -> bool:
        return self.why_invalid(cfg) is None

    def __len__(self) -> int:
        return math.prod(len(k.options) for k in self.knobs)

    def __iter__(self) -> Iterator[Config]:
        for i in range(len(self)):
            cfg = self.get(i)
            if self.allowed(cfg):
                yield cfg

    def get(self, index: int, order: Sequence[Knob] | None = None) -> Config:
        """The config at `index`; the first knob of `order` (default: the space's) varies fastest."""
        values = {}
        for k in order or self.knobs:
            index, r = divmod(index, len(k.options))
            values[k.name] = k.options[r]
        return Config(values)

    def index_of(self, cfg: Config) -> int:
        index, stride = 0, 1
        for k in self.knobs:
            index += k.options.index(cfg[k.name]) * stride
            stride *= len(k.options)
        return index

    def sample(self, rng: random.Random) -> Config:
        """A uniform sample among the allowed configs (rejection; the last draw if none is found)."""
        for _ in range(64 if self.constraint is not None else 1):
            cfg = Config({k.name: rng.choice(k.options) for k in self.knobs})
            if self.allowed(cfg):
                return cfg
        return cfg

    def _steps(self, cfg: Config) -> list:
        """(knob, option index) of every one-option step away from `cfg`, knob by knob."""
        return [(k, j) for k in self.knobs for i in (k.options.index(cfg[k.name]),) for j in (i - 1, i + 1)
                if 0 <= j < len(k.options)]

    def neighbours(self, cfg: Config) -> list[Config]:
        """Configs that differ from `cfg` in one knob by one option step."""
        out = [Config({**cfg.to_json(), k.name: k.options[j]}) for k, j in self._steps(cfg)]
        return [c for c in out if self.allowed(c)]

    def random_neighbour(self, cfg: Config, rng: random.Random) -> Config | None:
        """One of `neighbours(cfg)`, uniformly at random (None where there is none), validating
        only the steps it draws: annealing takes one neighbour a point and step, and building and
        validating all of them was most of a conv task's search time (a 64-trial `tune` of ResNet-18's
        128->256 3x3/2 conv: search/model 5.7-7.6 -> 3.6-4.2 s of 24-37 s, AMD EPYC Zen 3, 2026-12-07)."""
        steps = self._steps(cfg)
        while steps:
            k, j = steps.pop(rng.randrange(len(steps)))
            nb = Config({**cfg.to_json(), k.name: k.options[j]})
            if self.allowed(nb):
                return nb
        return None

    def validate(self, values: dict | Config) -> Config:
        values = values.to_json() if isinstance(values, Config) else dict(values)
        for k in self.knobs:
            if k.name not in values and k.before is not None and k.allows(k.before):
                values[k.name] = k.before
        missing = [k.name for k in self.knobs if k.name not in values]
        extra = [n for n in values if n not in self._by_name]
        if missing or extra:
            raise ConfigError(f"config {values} does not fit the space: missing knobs {missing}, unknown knobs {extra}")
        for k in self.knobs:
            if not k.allows(values[k.name]):
                v = values[k.name]
                types = "/".join(sorted({type(o).__name__ for o in k.options}))
                raise ConfigError(f"config knob '{k.name}' = {v!r} ({type(v).__name__}) is not one of "
                                  f"{list(k.options)} ({types})")
        why = self.why_invalid(values)
        if why:
            raise ConfigError(f"config {values} cannot run here: {why}")
        return Config(values)

    def features(self, cfg: Config) -> list[float]:
        return [f for k in self.knobs for f in k.feature(cfg[k.name])]

    def code_key(self, cfg: Config) -> tuple:
        """The code-shape part of a config: configs with equal code keys share one compile."""
        return tuple((k.name, cfg[k.name]) for k in self.knobs if k.code_shape)

    def __repr__(self):
        return "ConfigSpace(" + ", ".join(f"{k.name}:{len(k.options)}" for k in self.knobs) + f"; {len(self)} configs)"
