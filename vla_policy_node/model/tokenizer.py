# SPDX-License-Identifier: Apache-2.0
"""
Offline tokenizers: Hugging Face ``tokenizer.json`` read with the ``tokenizers`` library.

Nothing is downloaded. A tokenizer is looked up in an explicit directory or
file, then in the standard Hugging Face cache; a miss names every path tried.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional, Sequence, Union

import numpy as np

Prompt = Union[str, tuple[str, ...]]
"""The text to tokenize, or segments tokenized one by one and concatenated (special tokens on the
first only): openpi tokenizes pi0's ``"\\n"`` on its own, which gives other ids than ``text + "\\n"``."""
PADDING_SIDES = ("right", "left")


class TokenizerNotFound(FileNotFoundError):
    """No ``tokenizer.json`` at any of the places tried."""


def hf_cache_dirs() -> list[Path]:
    """Return the Hugging Face hub cache folders, in the order ``huggingface_hub`` uses them."""
    if os.environ.get("HF_HUB_CACHE"):
        return [Path(os.environ["HF_HUB_CACHE"])]
    home = Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface"))
    return [home / "hub"]


def resolve_tokenizer(name: str, base_dir: Optional[Path] = None) -> Path:
    """
    Find ``tokenizer.json`` for ``name``: a file, a directory, or a hub id in the local cache.

    Relative names resolve against ``base_dir`` (the checkpoint folder), never the working
    directory; hub ids are looked up as ``models--org--name/snapshots/<rev>/``.
    """
    tried: list[Path] = []
    candidates = [Path(name)] if Path(name).is_absolute() or base_dir is None else [base_dir / name]
    for cand in candidates:
        for path in (cand, cand / "tokenizer.json"):
            tried.append(path)
            if path.is_file() and path.name.endswith(".json"):
                return path
    for cache in hf_cache_dirs():
        snapshots = cache / f"models--{name.replace('/', '--')}" / "snapshots"
        tried.append(snapshots / "*" / "tokenizer.json")
        if snapshots.is_dir():
            for snap in sorted(snapshots.iterdir()):
                if (snap / "tokenizer.json").is_file():
                    return snap / "tokenizer.json"
    raise TokenizerNotFound(f"no tokenizer for {name!r}; tried: " + ", ".join(str(p) for p in tried))


class TextTokenizer:
    """A ``tokenizer.json`` with its pad token, padding as LeRobot's tokenizer step does (right by default)."""

    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer   # imported here: only checkpoints with a tokenizer need it

        self.path = path
        self._tok = Tokenizer.from_file(str(path))
        pad = self._special_token(path.parent, "pad_token")
        pad_id = self._tok.token_to_id(pad) if pad else None
        if pad_id is None:
            raise ValueError(f"{path}: the pad token {pad!r} is not in the vocabulary")
        self.pad_id = pad_id

    @staticmethod
    def _special_token(folder: Path, key: str) -> Optional[str]:
        for name in ("special_tokens_map.json", "tokenizer_config.json"):
            f = folder / name
            if f.is_file():
                value = json.loads(f.read_text()).get(key)
                if isinstance(value, dict):
                    value = value.get("content")
                if value:
                    return value
        return None

    def __call__(self, texts: Sequence[Prompt], max_length: int, padding: str,
                 padding_side: str = "right") -> tuple[np.ndarray, np.ndarray]:
        """-> ids (B, L) int64, mask (B, L) bool; L = max_length, or the longest (<= max_length)."""
        encoded = [self._encode(t)[:max_length] for t in texts]
        return pad_batch(encoded, self.pad_id, max_length, padding, padding_side)

    def _encode(self, text: Prompt) -> list[int]:
        if isinstance(text, str):
            return self._tok.encode(text).ids
        first, *rest = text
        ids = self._tok.encode(first).ids
        for segment in rest:
            ids += self._tok.encode(segment, add_special_tokens=False).ids
        return ids


class ByteTokenizer:
    """UTF-8 bytes as tokens (ids 1..256, pad 0): the tokenizer of the random ``tiny`` model."""

    vocab_size = 257
    pad_id = 0

    def __call__(self, texts: Sequence[Prompt], max_length: int, padding: str,
                 padding_side: str = "right") -> tuple[np.ndarray, np.ndarray]:
        encoded = [[b + 1 for b in "".join(t).encode("utf-8", errors="replace")][:max_length] for t in texts]
        return pad_batch(encoded, self.pad_id, max_length, padding, padding_side)


def pad_batch(encoded: list[list[int]], pad_id: int, max_length: int, padding: str,
              padding_side: str = "right") -> tuple[np.ndarray, np.ndarray]:
    """Pad token lists to one length; ``left`` puts the pads first (the prompt ends at the last column)."""
    if padding not in ("max_length", "longest"):
        raise ValueError(f"padding must be 'max_length' or 'longest', got {padding!r}")
    if padding_side not in PADDING_SIDES:
        raise ValueError(f"padding_side must be one of {PADDING_SIDES}, got {padding_side!r}")
    length = max_length if padding == "max_length" else max(1, max(len(e) for e in encoded))
    ids = np.full((len(encoded), length), pad_id, dtype=np.int64)
    mask = np.zeros((len(encoded), length), dtype=bool)
    for i, e in enumerate(encoded):
        span = slice(length - len(e), length) if padding_side == "left" else slice(0, len(e))
        ids[i, span] = e
        mask[i, span] = True
    return ids, mask
