"""SAM 3's phrase encodings, cached per phrase.

What the text encoder gives for a phrase depends on the phrase and the encoder's weights only, never on
the image: a phrase asked of many images (or asked again) is encoded once. Entries are keyed by the
phrase string and live under one version of the text encoder's weights: each parameter's and buffer's
storage address, dtype, device and in-place version counter. load_state_dict copies into the
parameters in place, which bumps their counters, and assign=True or .to() gives new storage, so any of
them drops every entry. (A tensor made under torch.inference_mode has no version counter: its in-place
edits are not seen, only its replacement.) At most `max_phrases` phrases are kept, the least recently
used evicted first; 0 caches nothing.
"""

from __future__ import annotations

from collections import OrderedDict
from itertools import chain

import torch
from torch import nn

# forward_text's keys, each with the axis its phrases lie along
PHRASE_AXIS = {"language_features": 1, "language_mask": 0, "language_embeds": 1}


def weights_version(module: nn.Module) -> tuple:
    """A value that changes whenever `module`'s weights may have changed (see the module docstring)."""
    return tuple(
        (t.data_ptr(), t.dtype, t.device, None if t.is_inference() else t._version)
        for t in chain(module.parameters(), module.buffers())
    )


class PhraseEncodings:
    """forward_text of a VisionLanguageBackbone through a bounded cache of per-phrase encodings."""

    def __init__(self, backbone: nn.Module, max_phrases: int = 256) -> None:
        if max_phrases < 0:
            raise ValueError(f"max_phrases={max_phrases}: pass the number of phrases to keep, 0 to keep none")
        self.backbone = backbone
        self.max_phrases = max_phrases
        self._entries: OrderedDict[str, dict[str, torch.Tensor]] = OrderedDict()
        self._version: tuple | None = None

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, phrase: str) -> bool:
        return phrase in self._entries

    def encode(self, phrases: list[str], device: torch.device | str | None = None) -> dict[str, torch.Tensor]:
        """forward_text's dict for `phrases` in their order (repeats included): the distinct phrases that
        are not cached go through the text encoder in one call."""
        version = weights_version(self.backbone.language_backbone)
        if version != self._version:
            self._entries.clear()
            self._version = version
        fresh: dict[str, dict[str, torch.Tensor]] = {}
        missing = [p for p in dict.fromkeys(phrases) if p not in self._entries]
        if missing:
            encoded = self.backbone.forward_text(missing, device=device)
            for j, phrase in enumerate(missing):
                fresh[phrase] = {k: encoded[k].narrow(axis, j, 1) for k, axis in PHRASE_AXIS.items()}
        parts = [fresh[p] if p in fresh else self._hit(p) for p in phrases]
        for phrase, entry in fresh.items():
            self._store(phrase, entry)
        return {k: torch.cat([part[k] for part in parts], dim=axis) for k, axis in PHRASE_AXIS.items()}

    def _hit(self, phrase: str) -> dict[str, torch.Tensor]:
        self._entries.move_to_end(phrase)
        return self._entries[phrase]

    def _store(self, phrase: str, entry: dict[str, torch.Tensor]) -> None:
        if self.max_phrases == 0:
            return
        # a copy of the phrase's slice: a view would keep the whole batch's encodings alive
        self._entries[phrase] = {k: v.clone() for k, v in entry.items()}
        while len(self._entries) > self.max_phrases:
            self._entries.popitem(last=False)
