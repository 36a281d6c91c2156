"""SAM 3's text tokenizer: CLIP's byte-level BPE, as sam3.model.tokenizer_ve.SimpleTokenizer runs it.

sam3's tokenizer is a copy of open_clip's (the same cleaning: ftfy, HTML unescape, whitespace folded,
lower case; the same split pattern and merges), so samfast uses the maintained one, open_clip's, with
the vocabulary file that ships inside open_clip (byte-identical to the one in sam3's source tree;
sam3's wheel lacks it). A phrase becomes [start_of_text, BPE tokens..., end_of_text] padded with 0 to
the context length; a longer one is cut to the context length and its last token set to end_of_text.
"""

from __future__ import annotations

import os
from pathlib import Path

SAM3_CONTEXT_LENGTH = 32  # sam3's VETextEncoder context_length, which it passes on every call


def bpe_vocab_path() -> Path:
    """open_clip's bundled `bpe_simple_vocab_16e6.txt.gz`, the vocabulary SAM 3 was trained with."""
    # importlib finds the file without importing open_clip's package (torch models, timm), which the
    # tokenizer itself needs only when it is built.
    from importlib.util import find_spec

    spec = find_spec("open_clip")
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(
            "SAM 3's tokenizer needs open_clip_torch (its BPE code and vocabulary): pip install 'samfast[sam3]'"
        )
    return Path(spec.origin).parent / "bpe_simple_vocab_16e6.txt.gz"


def build_tokenizer(context_length: int = SAM3_CONTEXT_LENGTH, bpe_path: str | os.PathLike | None = None):
    """open_clip's SimpleTokenizer with sam3's settings: `tokenizer(list_of_phrases)` gives a
    (len(phrases), context_length) int64 tensor, the same tokens as sam3's SimpleTokenizer."""
    from open_clip.tokenizer import SimpleTokenizer

    path = Path(bpe_path) if bpe_path is not None else bpe_vocab_path()
    if not path.is_file():
        raise FileNotFoundError(
            f"SAM 3's BPE vocabulary {path} does not exist: pass bpe_path= the bpe_simple_vocab_16e6.txt.gz "
            "that open_clip_torch ships, or reinstall open_clip_torch"
        )
    return SimpleTokenizer(bpe_path=str(path), context_length=context_length, clean="lower")
