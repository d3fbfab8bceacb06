"""Training: draft distillation towards the target (``dsbd distill CONFIG``), with optax.

- ``losses``: the target's stored warped top-k, and TV / forward KL / reverse KL on warped
  distributions;
- ``distill``: on-policy rollouts, full fine-tuning or LoRA, AdamW + warm-up + cosine, clipping,
  held-out acceptance, resumable checkpoints;
- ``export``: a parameter tree as a Hugging Face checkpoint directory ``load_model`` reads.

May import: ``models``, ``decoding``, ``parallel``, ``eval`` (its prompt sets); used by ``cli``
(the layer contract in ``pyproject.toml``).
"""

from dsbd_jax.training.distill import DistillConfig, distill, make_rollouts
from dsbd_jax.training.export import save_hf
from dsbd_jax.training.losses import divergence, target_topk

__all__ = ["DistillConfig", "distill", "divergence", "make_rollouts", "save_hf", "target_topk"]
