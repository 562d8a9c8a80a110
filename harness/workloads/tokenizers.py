"""Token counters for text traces (ShareGPT): an offline approximation, or a local HF tokenizer."""

from __future__ import annotations

import re
from typing import Protocol, Sequence

from harness.errors import ConfigError

# NOTE: the approximation mimics a GPT-2/Llama-style BPE pre-tokenizer: a run of
# up to 6 ASCII letters (with one leading space), up to 3 digits, up to 2 ASCII
# punctuation marks, a whitespace run, or any single non-ASCII character counts
# as one token. On English prose that is about 4 characters per token, the usual
# rule of thumb for such tokenizers; it under-counts rare long words and
# over-counts CJK text that a tokenizer merges. It needs no download and is
# deterministic. Exact counts need `tokenizer=<HF name or local path>`.
_PIECE = re.compile(r" ?[A-Za-z]{1,6}| ?[0-9]{1,3}|[!-/:-@\[-`{-~]{1,2}|\s+|[^\x00-\x7f]")


class Tokenizer(Protocol):
    name: str

    def count(self, texts: Sequence[str]) -> list[int]:
        """Token count of each text."""


class ApproxTokenizer:
    name = "approx"

    def count(self, texts: Sequence[str]) -> list[int]:
        return [len(_PIECE.findall(text)) for text in texts]


class HFTokenizer:
    """A Hugging Face tokenizer from the local cache or a local directory (never downloads)."""

    def __init__(self, name: str, where: str) -> None:
        try:
            from transformers import AutoTokenizer
        except ImportError:
            raise ConfigError(f"{where}.tokenizer: {name!r} needs the transformers package, which is not "
                              "installed; pip install transformers, or use tokenizer=approx") from None
        try:
            self._tokenizer = AutoTokenizer.from_pretrained(name, local_files_only=True)
        except Exception as err:  # noqa: BLE001 - transformers raises many kinds
            raise ConfigError(f"{where}.tokenizer: cannot load {name!r} from a local path or the Hugging Face "
                              f"cache ({err}); download it first, or use tokenizer=approx") from None
        self.name = name

    def count(self, texts: Sequence[str]) -> list[int]:
        # As vLLM's benchmark does: tokenizer(text).input_ids, special tokens included.
        return [len(ids) for ids in self._tokenizer(list(texts)).input_ids]


def make_tokenizer(name: str, where: str = "workload") -> Tokenizer:
    return ApproxTokenizer() if name == "approx" else HFTokenizer(name, where)
