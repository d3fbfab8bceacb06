"""DSBD in a room of its own: ``generate`` (the loop and ``dsbd_generate``), ``steps`` (one
iteration's named steps), ``state`` (the loop state and its statistics), ``forest`` (the draft
forest), ``verify`` (layer-by-layer multi-candidate verification, dense or on the rows'
largest entries: ``tops``) and ``width`` (the dynamic-width rule). The rules the verification
applies live in ``dsbd_jax.decoding.rules``; the spec is docs/algorithm.md.
"""

from dsbd_jax.decoding.configs import DSBDConfig
from dsbd_jax.decoding.dsbd.generate import dsbd_generate, first_forest

__all__ = ["DSBDConfig", "dsbd_generate", "first_forest"]
