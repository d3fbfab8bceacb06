"""Tiny random model pairs in real Hugging Face format, for tests, notebooks and trying the API
without the GB-sized offline weights.

    target_dir, draft_dir = make_tiny_pair("/tmp/tiny")
    target, draft = load_model(target_dir), load_model(draft_dir)

Both are ``LlamaForCausalLM`` checkpoints written by ``transformers.save_pretrained`` (safetensors +
config.json) with a byte-level BPE tokenizer (256 byte tokens, no merges, so any text encodes)
that has a chat template and an EOS token. The draft is the target with its weights perturbed,
so draft and target agree often but not always, as a real pair does. Needs ``torch``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Tuple

SPECIAL_TOKENS = ("<|pad|>", "<|eos|>", "<|user|>", "<|assistant|>")
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def tiny_tokenizer():
    """A byte-level BPE ``PreTrainedTokenizerFast``: ids 0-3 special, then the 256 bytes."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    vocab = {t: i for i, t in enumerate(SPECIAL_TOKENS)}
    for ch in bytes_to_unicode().values():
        vocab[ch] = len(vocab)
    tk = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<|pad|>", eos_token="<|eos|>",
                                  additional_special_tokens=list(SPECIAL_TOKENS[2:]))
    tok.chat_template = CHAT_TEMPLATE
    return tok


def make_tiny_pair(directory, seed: int = 0, noise: float = 0.5, hidden_size: int = 64,
                   num_layers: int = 2, tie_word_embeddings: bool = False) -> Tuple[Path, Path]:
    """Write ``directory/target`` and ``directory/draft`` (tiny Llama checkpoints + tokenizer).

    ``noise``: the draft's weights are the target's times ``1 + noise * N(0, 1)`` (0: identical
    models). ``tie_word_embeddings``: the head is the embedding (no ``lm_head`` tensor), as in
    the hub's Qwen2.5-0.5B. Returns the two directories."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    directory = Path(directory)
    tok = tiny_tokenizer()
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                      num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=2048,
                      tie_word_embeddings=tie_word_embeddings,
                      bos_token_id=None, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id)
    torch.manual_seed(seed)
    target = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # larger logits than the default init, so distributions are peaked
        for p in target.parameters():
            if p.dim() == 2:
                p.mul_(4.0)
    draft = LlamaForCausalLM(cfg).eval()
    draft.load_state_dict(target.state_dict())
    with torch.no_grad():
        for p in draft.parameters():
            p.mul_(1 + noise * torch.randn_like(p))
    out = []
    for name, model in (("target", target), ("draft", draft)):
        d = directory / name
        model.save_pretrained(d)
        tok.save_pretrained(d)
        out.append(d)
    return out[0], out[1]
