"""A gzip-compressed trace that expands far beyond what a trace compresses to (a "gzip
bomb") is refused in one line before it fills memory; a real one reads as before."""

from __future__ import annotations

import gzip

import pytest

import harness.workloads.tables as tables
from harness.errors import InputError


def _gz(path, text: str):
    path.write_bytes(gzip.compress(text.encode(), compresslevel=9))
    return path


def test_a_gzip_bomb_is_refused_naming_the_file(tmp_path, monkeypatch):
    monkeypatch.setattr(tables, "GZIP_FREE_BYTES", 2**20)  # 1 MiB instead of 64 MiB
    bomb = _gz(tmp_path / "t.csv.gz", "p,o\n" + "1,1\n" * 1_000_000)  # 4 MB from about 8 KB
    assert bomb.stat().st_size * 100 < 2**20
    with pytest.raises(InputError, match=rf"^{bomb}: decompresses to more than 1 MiB, over 100x "
                                         r"its compressed size"):
        tables.read_table(bomb, "auto", ["p", "o"])
    bomb_json = _gz(tmp_path / "t.jsonl.gz", '{"p": 1, "o": 1}\n' * 300_000)
    with pytest.raises(InputError, match="decompresses to more than 1 MiB"):
        tables.read_table(bomb_json, "auto", ["p", "o"])


def test_a_gzip_trace_within_the_limit_reads_as_before(tmp_path, monkeypatch):
    monkeypatch.setattr(tables, "GZIP_FREE_BYTES", 2**10)
    text = "p,o\n" + "".join(f"{i * 7919 % 4093},{i % 97 + 1}\n" for i in range(20_000))
    plain = tmp_path / "t.csv"
    plain.write_text(text)
    packed = _gz(tmp_path / "t.csv.gz", text)
    a, b = tables.read_table(plain, "auto", ["p", "o"]), tables.read_table(packed, "auto", ["p", "o"])
    assert a.columns == b.columns and a.lines == b.lines and len(b) == 20_000
