"""One frozen config per decoder: the settings it reads and no others.

Each config is a frozen, hashable dataclass (a static argument under ``jax.jit``). All share
``target``, ``max_new_tokens``, the warping, ``eos_token_id`` / ``pad_token_id``, ``progress``
(a ``Progress`` channel) and ``options`` (the XLA:CPU compiler options by name, a
``HostPlan``'s); then each decoder's own (``num_beams``; ``draft``, ``gamma``; DSBD's widths and
threshold). One set of checks (:meth:`Settings.__post_init__`) reads only the fields a class
has, so a bad setting fails where the config is made. The table of fields:
docs/results/design_notes.md.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, Tuple

import numpy as np

from dsbd_jax.decoding.progress import Progress
from dsbd_jax.decoding.warping import validate_warping
from dsbd_jax.models.config import ModelConfig
from dsbd_jax.host.cpu_options import CANDIDATES


def eos_tuple(eos_token_id) -> Tuple[int, ...]:
    """EOS ids (``None``, an int, or a sequence of ints) as a tuple of ints (``()``: none)."""
    return () if eos_token_id is None else tuple(np.atleast_1d(eos_token_id).tolist())


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


class Settings:
    """What every decoder config shares: the checks, :attr:`eos_ids`, :attr:`pad_id`,
    :meth:`replace`. Not a config itself; the checks read only the fields a class has
    (``draft``, ``num_beams``, ``gamma``, ``tree_widths`` where it has them)."""

    def __post_init__(self):
        if not isinstance(self.target, ModelConfig):
            raise ValueError(f"{type(self).__name__}.target must be a ModelConfig")
        self._check_draft()
        if not _is_int(self.max_new_tokens) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an int >= 1, got {self.max_new_tokens!r}")
        if hasattr(self, "num_beams"):
            self._check_num_beams()
        validate_warping(self.temperature, self.top_k, self.top_p)
        if hasattr(self, "gamma") and (not _is_int(self.gamma) or self.gamma < 1):
            raise ValueError(f"gamma must be an int >= 1, got {self.gamma!r}")
        if not (isinstance(self.progress, (bool, Progress)) or self.progress is None):
            raise ValueError(f"progress must be a dsbd_jax.Progress channel or a bool, got "
                             f"{type(self.progress).__name__}")
        options = getattr(self, "options", None)
        if options is not None and (not isinstance(options, str) or options not in CANDIDATES):
            raise ValueError(f"options must be None or the name of XLA:CPU compiler options "
                             f"(a HostPlan's options; one of {sorted(CANDIDATES)}), got "
                             f"{options!r}")
        if self.eos_token_id is not None:  # only its type made canonical (hashable): a tuple
            object.__setattr__(self, "eos_token_id", eos_tuple(self.eos_token_id))
        if getattr(self, "tree_widths", None) is not None:
            tw = tuple(self.tree_widths)
            if len(tw) != self.gamma or any(not _is_int(w) or w < 1 for w in tw):
                raise ValueError(f"tree_widths must be {self.gamma} ints >= 1 (one per level), "
                                 f"got {tw}")
            object.__setattr__(self, "tree_widths", tw)
        for tok in self.eos_ids:
            if not 0 <= tok < self.target.vocab_size:
                raise ValueError(f"eos_token_id {tok} is outside the vocabulary")
        if self.pad_token_id is not None and not 0 <= self.pad_token_id < self.target.vocab_size:
            raise ValueError(f"pad_token_id {self.pad_token_id} is outside the vocabulary")

    def _check_draft(self) -> None:
        draft = getattr(self, "draft", None)
        if draft is None:
            return
        from dsbd_jax.models.head import HeadConfig
        if isinstance(draft, HeadConfig):
            t = draft.target
            if (t.hidden_size, t.vocab_size, t.num_layers) != (
                    self.target.hidden_size, self.target.vocab_size, self.target.num_layers):
                raise ValueError(
                    f"the draft head was made for another target (hidden {t.hidden_size}, "
                    f"vocabulary {t.vocab_size}, {t.num_layers} layers; this target: "
                    f"{self.target.hidden_size}, {self.target.vocab_size}, "
                    f"{self.target.num_layers})")
        elif not isinstance(draft, ModelConfig):
            raise ValueError(f"{type(self).__name__}.draft must be a ModelConfig, a HeadConfig "
                             f"or None")
        if draft.vocab_size != self.target.vocab_size:
            raise ValueError(
                f"draft and target vocabularies differ ({draft.vocab_size} vs "
                f"{self.target.vocab_size}); speculative decoding needs one vocabulary")

    def _check_num_beams(self) -> None:
        """``num_beams`` is an int >= 1 (a class with other rules overrides this)."""
        if not _is_int(self.num_beams) or self.num_beams < 1:
            raise ValueError(f"num_beams (width) must be an int >= 1, got {self.num_beams!r}")

    @property
    def eos_ids(self) -> Tuple[int, ...]:
        """The EOS ids that apply: ``eos_token_id`` as given, the target's where it is ``None``;
        ``()``: none (the field keeps the value it was given)."""
        return eos_tuple(self.eos_token_id if self.eos_token_id is not None
                         else self.target.eos_token_id)

    @property
    def pad_id(self) -> int:
        """``pad_token_id``, else the target's pad id (inside the vocabulary), else the first
        EOS id, else 0."""
        if self.pad_token_id is not None:
            return self.pad_token_id
        if self.target.pad_token_id is not None and self.target.pad_token_id < self.target.vocab_size:
            return self.target.pad_token_id
        return self.eos_ids[0] if self.eos_ids else 0

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)


_frozen = dataclasses.dataclass(frozen=True)
_keywords = dataclasses.dataclass(frozen=True, kw_only=True)


@_frozen
class _Shared(Settings):
    """The fields every decoder's own config starts with (module doc)."""
    target: ModelConfig
    max_new_tokens: int = dataclasses.field(default=32, kw_only=True)
    temperature: float = dataclasses.field(default=1.0, kw_only=True)
    top_k: Optional[int] = dataclasses.field(default=None, kw_only=True)
    top_p: float = dataclasses.field(default=1.0, kw_only=True)
    eos_token_id: Optional[Tuple[int, ...]] = dataclasses.field(default=None, kw_only=True)
    pad_token_id: Optional[int] = dataclasses.field(default=None, kw_only=True)
    progress: Any = dataclasses.field(default=False, kw_only=True)
    options: Optional[str] = dataclasses.field(default=None, kw_only=True)


@_keywords
class SampleConfig(_Shared):
    """:func:`~dsbd_jax.sample`'s settings: ``num_beams`` independent samples per prompt."""
    num_beams: int = 1


@_keywords
class BeamSampleConfig(_Shared):
    """:func:`~dsbd_jax.beam_sample`'s settings: ``num_beams`` beams, drawn with or without
    ``replacement``."""
    num_beams: int = 1
    replacement: bool = True


@_keywords
class BeamSearchConfig(_Shared):
    """:func:`~dsbd_jax.beam_search`'s settings: ``num_beams`` beams; ``length_penalty`` and
    ``early_stopping`` as Hugging Face's."""
    num_beams: int = 1
    length_penalty: float = 1.0
    early_stopping: bool = False


@_keywords
class SpeculativeConfig(_Shared):
    """:func:`~dsbd_jax.speculative_sample`'s settings: the ``draft`` (a model's config or a
    draft head's) and the look-ahead ``gamma``."""
    draft: Any
    gamma: int = 4


@_keywords
class TreeConfig(_Shared):
    """:func:`~dsbd_jax.tree_speculative_sample`'s settings: the ``draft``, ``gamma`` levels of
    ``tree_widths`` children (default ``(2,) * gamma``), drawn with or without
    ``replacement`` (MCSD's Algorithms 1 and 2)."""
    draft: Any
    gamma: int = 4
    tree_widths: Optional[Tuple[int, ...]] = None
    replacement: bool = True


@_keywords
class DSBDConfig(_Shared):
    """DSBD settings (frozen, hashable: static under jit). Besides the shared ones (module doc):

    Attributes:
        draft: the draft model's config or a draft head's (required).
        gamma: draft layers per iteration.
        num_beams: beams drawn by the extra layer (after all ``gamma`` layers passed); ``None``
          (the default) = the last layer's width. Must be <= ``max_width``.
        replacement: candidates of a layer drawn with (True) or without replacement.
        draft_width: ``W_S``, draft nodes per layer.
        threshold: ``t`` in [0, 1] of the dynamic width; 1 = fixed width ``min_width``.
        min_width: ``W_min`` (<= ``W_S``).
        max_width: cap on the beams of any layer = beams carried between iterations = output
          slots (``None``, the default: ``W_S``; :attr:`beam_width` is the value that applies).
        single_beam: keep one cache row per prompt (the paper's memory-saving mode).
        node_budget: forest nodes to fill (e.g. :func:`dsbd_jax.host.forest_budget.node_budget`):
          layers widen to ``(node_budget - cache_rows) // gamma`` nodes (:attr:`layer_width`),
          the first ``W_S`` the next layer's parents, the rest leaves (docs/algorithm.md).
    """

    draft: Any = None
    gamma: int = 4
    num_beams: Optional[int] = None
    replacement: bool = True
    draft_width: int = 2
    threshold: float = 0.9
    min_width: int = 1
    max_width: Optional[int] = None
    single_beam: bool = False
    node_budget: Optional[int] = None

    def _check_num_beams(self) -> None:
        """``None`` (the last layer's width) or an int >= 1 (at most ``max_width``: below)."""
        if self.num_beams is not None:
            super()._check_num_beams()

    def __post_init__(self):
        if self.draft is None:
            raise ValueError("DSBD needs a draft model: set DSBDConfig.draft")
        super().__post_init__()
        nb = self.num_beams
        for name in ("draft_width", "min_width"):
            v = getattr(self, name)
            if not _is_int(v) or v < 1:
                raise ValueError(f"{name} must be an int >= 1, got {v!r}")
        if self.draft_width < self.min_width:
            raise ValueError(f"draft_width (W_S = {self.draft_width}) must be >= min_width "
                             f"(W_min = {self.min_width})")
        t = self.threshold
        is_number = isinstance(t, (int, float, np.floating)) and not isinstance(t, bool)
        if not is_number or not 0.0 <= t <= 1.0:
            raise ValueError(f"threshold must be a number in [0, 1], got {t!r}")
        mw = self.max_width
        if mw is not None and (not _is_int(mw) or mw < self.min_width):
            raise ValueError(f"max_width must be None or an int >= min_width "
                             f"({self.min_width}), got {mw!r}")
        if nb is not None and nb > self.beam_width:
            raise ValueError(f"num_beams ({nb}) must be <= max_width ({self.beam_width}); raise "
                             f"max_width to draw more beams in the extra layer")
        if not isinstance(self.single_beam, bool):
            raise ValueError(f"single_beam must be a bool, got {self.single_beam!r}")
        b = self.node_budget
        if b is not None and (not _is_int(b) or b < 1):
            raise ValueError(f"node_budget must be None or an int >= 1, got {b!r}")

    @property
    def layer_width(self) -> int:
        """Draft nodes per forest layer: ``W_S``, widened to fill ``node_budget``."""
        if self.node_budget is None:
            return self.draft_width
        return max(self.draft_width, (int(self.node_budget) - self.cache_rows) // self.gamma)

    @property
    def forest_nodes(self) -> int:
        """Nodes of the target's pass per prompt: the input beams and ``gamma`` layers."""
        return self.cache_rows + self.gamma * self.layer_width

    @property
    def beam_width(self) -> int:
        """``max_width`` as it applies (``W_S`` when ``None``): beams between iterations."""
        return int(self.draft_width if self.max_width is None else self.max_width)

    @property
    def cache_rows(self) -> int:
        """Cache rows (input beams) per prompt: 1 in single-beam mode, else :attr:`beam_width`."""
        return 1 if self.single_beam else self.beam_width


# the config each decoder accepts: its own
ACCEPTS = {
    "sample": (SampleConfig,),
    "beam_sample": (BeamSampleConfig,),
    "beam_search": (BeamSearchConfig,),
    "speculative_sample": (SpeculativeConfig,),
    "tree_speculative_sample": (TreeConfig,),
    "dsbd_generate": (DSBDConfig,),
}


def check_config(decoder: str, config) -> None:
    """``ValueError`` unless ``config`` is the one that ``decoder`` accepts (:data:`ACCEPTS`)."""
    kinds = ACCEPTS[decoder]
    if not isinstance(config, kinds):
        raise ValueError(f"{decoder} takes a {kinds[0].__name__}, got "
                         f"{type(config).__name__}")
