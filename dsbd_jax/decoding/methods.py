"""One way to name a decoding method and its settings, shared by the CLI and the benchmark harness.

    dec = build("dsbd", target.config, draft.config, gamma=3, draft_width=3, threshold=0.9)
    out = dec(both_params, prompt_ids, key, prompt_lengths=lens)

Methods: ``dsbd`` (:func:`dsbd_jax.dsbd_generate`), ``beam`` (beam sampling), ``beam_search``,
``sample`` (multinomial sampling), ``spec`` (speculative sampling), ``tree`` (token-tree
speculative sampling). Settings are the fields of the method's own config
(:mod:`dsbd_jax.decoding.configs`: ``SampleConfig``, ``BeamSampleConfig``, ...,
``DSBDConfig``); any other key is an error.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, Optional

METHODS = ("dsbd", "beam", "beam_search", "sample", "spec", "tree")
NEEDS_DRAFT = frozenset({"dsbd", "spec", "tree"})

# each method's config (dsbd_jax.decoding.configs): its settings are that config's fields
_CONFIGS = {"dsbd": "DSBDConfig", "beam": "BeamSampleConfig", "beam_search": "BeamSearchConfig",
            "sample": "SampleConfig", "spec": "SpeculativeConfig", "tree": "TreeConfig"}


def config_class(method: str):
    """The config class of ``method`` (``dsbd_jax.decoding.configs``)."""
    from dsbd_jax.decoding import configs
    return getattr(configs, _CONFIGS[method])


def allowed(method: str) -> set:
    """The settings ``method`` reads: its config's fields but the model configs."""
    return {f.name for f in dataclasses.fields(config_class(method))} - {"target", "draft"}


# label order (independent of the order a config file lists settings in) and short names
_ORDER = ("num_beams", "gamma", "draft_width", "threshold", "min_width", "max_width", "node_budget",
          "tree_widths")
_ABBREV = {"num_beams": "W", "gamma": "g", "draft_width": "WS", "threshold": "t",
           "min_width": "Wmin", "max_width": "Wmax", "node_budget": "NB", "tree_widths": "tree"}


@dataclasses.dataclass(frozen=True)
class Decoder:
    """A method bound to its config: ``decoder(params, prompt_ids, key, prompt_lengths=...)``.

    ``params`` is the target's parameters, or ``{"target": ..., "draft": ...}`` when
    ``needs_draft``. ``beam_search`` is deterministic and ignores ``key``.
    """

    method: str
    fn: Callable
    config: Any
    takes_key: bool = True

    @property
    def needs_draft(self) -> bool:
        return self.method in NEEDS_DRAFT

    def __call__(self, params, prompt_ids, key, prompt_lengths=None):
        if self.takes_key:
            return self.fn(params, prompt_ids, key, self.config, prompt_lengths=prompt_lengths)
        return self.fn(params, prompt_ids, self.config, prompt_lengths=prompt_lengths)

    def core_call(self, params, prompt_ids, key, prompt_lengths=None):
        """The jitted core and the exact arguments a call with these inputs runs
        (``calls.CoreCall``), after the same host-side checks; nothing is run."""
        prepare = getattr(self.fn, "prepare", None)
        if prepare is None:
            raise TypeError(f"{self.fn.__name__} is not a decoder made with "
                            f"@decoding._jit.decoder")
        if self.takes_key:
            return prepare(params, prompt_ids, key, self.config, prompt_lengths=prompt_lengths)
        return prepare(params, prompt_ids, self.config, prompt_lengths=prompt_lengths)

    def compiled(self, params, prompt_ids, key, prompt_lengths=None):
        """Compile, ahead of time and without running it, the program a call with these
        arguments runs (``jax.stages.Compiled``; the same method as
        ``parallel.ShardedDecoder.compiled``). A later call with the same argument shapes runs
        it without compiling (through the program store when it is on:
        ``calls.CoreCall.prepared``): the benchmark harness's ``warmup: 0``."""
        return self.core_call(params, prompt_ids, key, prompt_lengths).prepared()


def check_settings(method: str, settings: Dict[str, Any]) -> None:
    """``ValueError`` for an unknown method or a setting the method does not read."""
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; choose from {', '.join(METHODS)}")
    extra = sorted(set(settings) - allowed(method))
    if extra:
        raise ValueError(f"method {method!r} has no setting(s) {extra}; it reads "
                         f"{sorted(allowed(method))}")


def build(method: str, target, draft=None, **settings) -> Decoder:
    """The decoder for ``method`` with ``settings`` (config fields) on the given model configs."""
    check_settings(method, settings)
    if method in NEEDS_DRAFT and draft is None:
        raise ValueError(f"method {method!r} needs a draft model")
    drafts = {"draft": draft} if method in NEEDS_DRAFT else {}
    config = config_class(method)(target, **drafts, **settings)
    from dsbd_jax.decoding.beam import beam_sample, beam_search
    from dsbd_jax.decoding.dsbd import dsbd_generate
    from dsbd_jax.decoding.sampling import sample
    from dsbd_jax.decoding.speculative import speculative_sample
    from dsbd_jax.decoding.tree import tree_speculative_sample
    fns = {"dsbd": dsbd_generate, "beam": beam_sample, "beam_search": beam_search,
           "sample": sample, "spec": speculative_sample, "tree": tree_speculative_sample}
    return Decoder(method, fns[method], config, takes_key=method != "beam_search")


def label(method: str, setting: Dict[str, Any]) -> str:
    """A short readable name, e.g. ``dsbd g=3 WS=3 t=0.9 Wmin=1 single-beam`` (settings in a
    fixed order, whatever order they were given in)."""
    parts = [method]
    rank = lambda k: (_ORDER.index(k) if k in _ORDER else len(_ORDER), k)  # noqa: E731
    for k in sorted(setting, key=rank):
        v = setting[k]
        if k == "single_beam":
            if v:
                parts.append("single-beam")
        elif k == "replacement":
            if not v:
                parts.append("no-replacement")
        else:
            v = ",".join(map(str, v)) if isinstance(v, (list, tuple)) else v
            parts.append(f"{_ABBREV.get(k, k)}={v}")
    return " ".join(parts)


def model_params(decoder: Decoder, target_params, draft_params: Optional[Any] = None):
    """The ``params`` argument a decoder takes."""
    if decoder.needs_draft:
        return {"target": target_params, "draft": draft_params}
    return target_params
