"""Typed projection weights: a kernel leaf that says its own form.

A projection kernel is a plain ``jax.Array`` ``[..., in, out]`` (Flax's ``nn.Dense`` layout) or
a :class:`Kernel`: a small registered pytree whose class is its form (:class:`Rows`,
:class:`RowBlocks`, :class:`Int8`, or a kind a user adds). Code that multiplies, checks,
truncates, shards or exports a kernel asks the leaf, through :func:`product`, :func:`plain`,
:func:`shape_of` and :func:`take_outputs`, never a dict key or an array's rank; leading axes (a
stacked layer axis) pass through each. A 16-bit kernel runs in mixed precision (float32
accumulation and result). Adding a kind is one subclass naming its ``fields`` and giving
:meth:`~Kernel.product` and :meth:`~Kernel.plain`; it registers itself, and no other module
changes (``tests/models/test_weights.py`` adds one). Each built-in kind:
``docs/results/design_notes.md``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar, Dict, Optional, Tuple, Type

import jax
import jax.numpy as jnp
import numpy as np

from dsbd_jax.models import products

_KINDS: Dict[str, Type["Kernel"]] = {}


class Kernel:
    """A projection kernel in a form of its own (module doc). Subclasses set ``fields`` (the
    names of their array children, ``("value",)`` by default) and ``rank`` (the rank of the
    first field without leading axes), and implement :meth:`product` and :meth:`plain`.
    Instances are immutable pytrees: ``jax.jit``, ``tree_map`` and ``lax.scan`` see only their
    arrays; the class is the static part."""

    fields: ClassVar[Tuple[str, ...]] = ("value",)
    rank: ClassVar[int] = 2
    # whether the caches store the fields in their own dtypes (True) or in the model's dtype
    stored: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        _KINDS[cls.__name__] = cls

        def flatten_with_keys(k):
            return [(jax.tree_util.GetAttrKey(f), getattr(k, f)) for f in cls.fields], None

        def flatten(k):
            return [getattr(k, f) for f in cls.fields], None

        def unflatten(_, children):
            new = object.__new__(cls)
            for f, c in zip(cls.fields, children):
                object.__setattr__(new, f, c)
            return new

        jax.tree_util.register_pytree_with_keys(cls, flatten_with_keys, unflatten, flatten)

    def __init__(self, *arrays):
        if len(arrays) != len(self.fields):
            raise TypeError(f"{type(self).__name__} takes {len(self.fields)} arrays "
                            f"({', '.join(self.fields)}), got {len(arrays)}")
        for f, a in zip(self.fields, arrays):
            object.__setattr__(self, f, a)

    def __setattr__(self, name, value):
        raise AttributeError(f"{type(self).__name__} is immutable")

    def __repr__(self):
        arrays = ", ".join(f"{f}={getattr(getattr(self, f), 'dtype', '?')}"
                           f"{list(np.shape(getattr(self, f)))}" for f in self.fields)
        return f"{type(self).__name__}({arrays})"

    # -- what every kind gives ---------------------------------------------------------------
    def product(self, x: jax.Array) -> jax.Array:
        """``x [..., in]`` times this kernel: ``[..., out]``."""
        raise NotImplementedError

    def plain(self) -> jax.Array:
        """The ``[..., in, out]`` array of this kernel (leading axes kept)."""
        raise NotImplementedError

    @property
    def shape(self) -> tuple:
        """The plain ``[..., in, out]`` shape (read from the arrays' shapes only, so it works on
        tracers and shape structs)."""
        return tuple(jax.eval_shape(type(self).plain, self).shape)

    @property
    def dtype(self):
        """The storage dtype of the first field (what decides mixed precision)."""
        return getattr(self, self.fields[0]).dtype

    @property
    def leading(self) -> tuple:
        """The leading axes (a stacked layer axis) in front of the kind's own array."""
        return tuple(np.shape(getattr(self, self.fields[0])))[:-self.rank]

    def astype(self, dtype) -> "Kernel":
        """The same kind with its floating arrays in ``dtype`` (itself when they are)."""
        arrays = [getattr(self, f) for f in self.fields]
        if all(not jnp.issubdtype(a.dtype, jnp.floating) or a.dtype == jnp.dtype(dtype)
               for a in arrays):
            return self
        return type(self)(*(a.astype(dtype) if jnp.issubdtype(a.dtype, jnp.floating) else a
                            for a in arrays))

    def take_outputs(self, idx) -> "Kernel | jax.Array":
        """The kernel of the outputs ``idx`` only; a kind that cannot keep its form answers
        with the plain ``[..., in, N]`` array."""
        return jnp.take(self.plain(), idx, axis=-1)


class Rows(Kernel):
    """``[out, in]``: one output per row (a vocabulary head ``[V, d]``). Its product contracts
    the rows' last axis (:func:`dsbd_jax.models.products.mixed_rows`: 16-bit rows in mixed
    precision, one row of ``x`` padded to two; float32 rows in float32)."""

    rank = 2

    def product(self, x):
        return products.mixed_rows(x, self.value)

    def plain(self):
        return jnp.swapaxes(self.value, -1, -2)

    @property
    def shape(self):
        *lead, dout, din = np.shape(self.value)
        return (*lead, din, dout)

    def take_outputs(self, idx):
        return Rows(jnp.take(self.value, idx, axis=-2))


class RowBlocks(Kernel):
    """``[out / n, n, in]``: the ``[out, in]`` rows cut into blocks of ``n`` (transposed
    kernels, :func:`dsbd_jax.models.products.transpose_block`; product:
    :func:`dsbd_jax.models.products.project_t`)."""

    rank = 3

    def product(self, x):
        return products.project_t(x, self.value)

    def plain(self):
        return products.untranspose(self.value)

    @property
    def shape(self):
        *lead, c, n, din = np.shape(self.value)
        return (*lead, din, c * n)

    @property
    def width(self) -> int:
        """The rows per block ``n``."""
        return int(np.shape(self.value)[-2])


class Int8(Kernel):
    """Eight-bit codes with a scale per output: ``codes int8 [out, in]`` (one output per row, the
    operand form XLA:CPU's integer product runs natively) and ``scales float32 [out]``, the
    kernel being ``codes * scales[:, None]`` as ``[out, in]`` rows
    (:func:`dsbd_jax.models.products.quantize_rows`: symmetric, per output channel).

    Its product quantises the activations on the fly, per row, and runs XLA's ``s8 x s8 ->
    s32`` dot with both scales applied after (:func:`dsbd_jax.models.products.int8_rows`).
    That is a different model from the float one, by about one part in 250 of each weight and
    activation (``docs/loading.md``, *Eight-bit weights*): for a draft the difference never
    reaches the output distributions (DSBD and speculative sampling verify against the target),
    for a target it is what the user loads. Both arrays keep their dtypes whatever the model's
    float dtype (:meth:`astype` is the identity; the caches store them as they are:
    ``stored``)."""

    fields = ("codes", "scales")
    rank = 2
    stored = True  # the caches keep the fields' own dtypes (int8 codes, float32 scales)

    def product(self, x):
        return products.int8_rows(x, self.codes, self.scales)

    def plain(self):
        return jnp.swapaxes(self.codes.astype(jnp.float32) * self.scales[..., None], -1, -2)

    @property
    def shape(self):
        *lead, dout, din = np.shape(self.codes)
        return (*lead, din, dout)

    def astype(self, dtype):
        return self

    def take_outputs(self, idx):
        return Int8(jnp.take(self.codes, idx, axis=-2), jnp.take(self.scales, idx, axis=-1))

    @classmethod
    def quantize(cls, kernel) -> "Int8":
        """The int8 kernel of ``kernel`` (a plain ``[..., in, out]`` array or a typed kernel of
        any kind; leading axes kept)."""
        rows = jnp.swapaxes(plain(kernel), -1, -2)
        return cls(*products.quantize_rows(rows))


def is_kernel(x) -> bool:
    """Whether ``x`` is a typed kernel (a :class:`Kernel` of any kind)."""
    return isinstance(x, Kernel)


def kind(name: str) -> Type[Kernel]:
    """The kernel class registered under ``name`` (its class name); ``KeyError`` naming the
    known kinds otherwise."""
    if name not in _KINDS:
        raise KeyError(f"unknown kernel kind {name!r}; known: {sorted(_KINDS)}")
    return _KINDS[name]


def product(x: jax.Array, kernel) -> jax.Array:
    """``x [..., in]`` times ``kernel`` (a plain ``[in, out]`` array or a :class:`Kernel`):
    ``[..., out]``. A plain 16-bit kernel runs in mixed precision
    (:func:`dsbd_jax.models.products.mixed_cols`), a plain float32 one as ``nn.Dense`` does."""
    if isinstance(kernel, Kernel):
        return kernel.product(x)
    return products.project(x, kernel)


def plain(kernel) -> jax.Array:
    """The ``[..., in, out]`` array of ``kernel`` (a plain array is returned as it is)."""
    return kernel.plain() if isinstance(kernel, Kernel) else kernel


def shape_of(kernel) -> tuple:
    """The plain ``[..., in, out]`` shape of ``kernel`` (of any array: its shape)."""
    return kernel.shape if isinstance(kernel, Kernel) else tuple(np.shape(kernel))


def astype(kernel, dtype):
    """``kernel`` with its arrays in ``dtype`` (either kind of leaf)."""
    return kernel.astype(dtype)


def take_outputs(kernel, idx):
    """The kernel of the outputs ``idx`` only (a truncated head): a plain ``[in, out]`` array
    gives ``[in, N]``, a :class:`Kernel` answers itself (:meth:`Kernel.take_outputs`)."""
    if isinstance(kernel, Kernel):
        return kernel.take_outputs(idx)
    return jnp.take(kernel, idx, axis=-1)


def leaves(tree):
    """The leaves of ``tree`` with every :class:`Kernel` as one leaf."""
    return jax.tree_util.tree_leaves(tree, is_leaf=is_kernel)


def leaves_with_path(tree):
    """``[(key path, leaf)]`` of ``tree`` with every :class:`Kernel` as one leaf."""
    return jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_kernel)[0]


# ---------------------------------------------------------------------------------------------
# what a program's arguments hold: the compiler options follow from it
def _mappings(tree):
    """Every mapping in the pytree ``tree`` (a parameter tree, or a call's arguments), reached
    through mappings, lists and tuples, depth first. No leaf is touched."""
    stack = [tree]
    while stack:
        t = stack.pop()
        if isinstance(t, Mapping):
            yield t
            stack.extend(t.values())
        elif isinstance(t, (list, tuple)):
            stack.extend(t)


def _sixteen_bit(m: Mapping):
    """The dtype name of a kernel (of any kind) stored in 16 bits under ``m["kernel"]``, or
    ``"int8"`` for an :class:`Int8` kernel, else ``None``. Reads dtypes only (tracers and shape
    structs alike)."""
    k = m.get("kernel")
    if isinstance(k, Int8):
        return "int8"
    dt = getattr(k, "dtype", None)
    if dt is not None and jnp.issubdtype(dt, jnp.floating) and jnp.dtype(dt).itemsize == 2:
        return jnp.dtype(dt).name
    return None


def _row_head(m: Mapping) -> bool:
    """Whether ``m`` is a model's parameters (it has ``"embed"``) whose vocabulary head is stored
    as ``[V, d]`` rows (:func:`has_row_head`)."""
    if "embed" not in m:
        return False
    head, vocab = m.get("lm_head"), m.get("vocab_head")
    if isinstance(vocab, Mapping):                 # truncated: tied, or stored as rows
        return "embedding" in vocab or isinstance(vocab.get("kernel"), Rows)
    if head is None:
        return True                                # tied
    return isinstance(head, Mapping) and isinstance(head.get("kernel"), Rows)


def _transposed(m: Mapping) -> bool:
    return isinstance(m.get("kernel"), RowBlocks)


def program_kind(tree) -> tuple:
    """``(form_of(tree), kernel_dtype(tree), has_row_head(tree))`` in one walk: what decides
    the compiler options of a program over ``tree``
    (:func:`dsbd_jax.host.cpu_options.options_name`)."""
    form, dtype, row_head = "plain", None, False
    for m in _mappings(tree):
        if _transposed(m):
            form = products.TRANSPOSED
        dtype = dtype or _sixteen_bit(m)
        row_head = row_head or _row_head(m)
    return form, dtype or "float32", row_head


def form_of(tree) -> str:
    """``"transposed"`` when any kernel in the pytree ``tree`` (a parameter tree, or a call's
    arguments) is a :class:`RowBlocks`, else ``"plain"``."""
    return products.TRANSPOSED if any(map(_transposed, _mappings(tree))) else "plain"


def kernel_dtype(tree) -> str:
    """``"bfloat16"`` (or ``"float16"``) when a kernel in the pytree ``tree`` (a parameter
    tree, or a call's arguments) is stored in 16 bits, ``"int8"`` when one is an :class:`Int8`
    (the first such kernel found decides), else ``"float32"``."""
    return next(filter(None, map(_sixteen_bit, _mappings(tree))), "float32")


def has_row_head(tree) -> bool:
    """Whether a model in the pytree ``tree`` computes its vocabulary head over rows stored as
    ``[V, d]`` (a product contracting the weight's last axis): a tied head (the embedding, no
    ``"lm_head"``), a truncated tied head (``"vocab_head"`` holding an ``"embedding"``) or a head
    stored as :class:`Rows`."""
    return any(map(_row_head, _mappings(tree)))


def output_axis_of(keys) -> Optional[int]:
    """The axis of a projection's output features in the leaf at ``keys`` (a parameter path's
    keys) when the leaf is a field of an :class:`Int8` kernel (``codes [out, in]``: -2,
    ``scales [out]``: -1); ``None`` for any other leaf. Lets a module outside the models layer
    repeat an int8 kernel's output heads without naming the kernel's keys."""
    if len(keys) >= 2 and keys[-2] == "kernel" and keys[-1] in Int8.fields:
        return -2 if keys[-1] == "codes" else -1
    return None

