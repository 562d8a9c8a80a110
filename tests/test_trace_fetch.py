"""`python -m harness.tools.traces fetch`: download to a cache folder only if the sha256 matches (file:// URLs)."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

from harness.tools import traces
from harness.tools.traces import KNOWN, FetchError, KnownTrace, fetch, main

ROOT = Path(__file__).resolve().parents[1]
AZURE_CODE = ROOT / ".." / "shared" / "traces" / "azure_llm_2023" / "AzureLLMInferenceTrace_code.csv"
CONTENT = b"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,374,44\n"


@pytest.fixture
def tiny(tmp_path, monkeypatch):
    """A known trace 'tiny' served from a local file:// URL."""
    source = tmp_path / "upstream" / "tiny.csv"
    source.parent.mkdir()
    source.write_bytes(CONTENT)
    monkeypatch.setitem(KNOWN, "tiny", KnownTrace(source.as_uri(), "tiny.csv",
                                                  hashlib.sha256(CONTENT).hexdigest(), "test trace"))
    return source


def test_fetch_saves_a_file_whose_sha256_matches(tiny, tmp_path):
    path = fetch("tiny", dest=tmp_path / "cache")
    assert path == tmp_path / "cache" / "tiny.csv" and path.read_bytes() == CONTENT
    probe = tmp_path / "probe"  # a plain file's mode, readable in a shared cache
    probe.write_text("")
    assert path.stat().st_mode & 0o777 == probe.stat().st_mode & 0o777


def test_a_dest_that_is_a_file_is_an_error(tiny, tmp_path, capsys):
    (tmp_path / "afile").write_text("x")
    assert main(["fetch", "tiny", "--dest", str(tmp_path / "afile")]) == 1
    assert f"error: --dest {tmp_path / 'afile'} is a file" in capsys.readouterr().err


def test_a_sha256_mismatch_keeps_nothing(tiny, tmp_path):
    tiny.write_bytes(CONTENT + b"tampered\n")
    with pytest.raises(FetchError, match="sha256 mismatch"):
        fetch("tiny", dest=tmp_path / "cache")
    assert list((tmp_path / "cache").iterdir()) == []  # no partial or temporary file left


def test_a_cached_good_copy_is_not_downloaded_again(tiny, tmp_path):
    fetch("tiny", dest=tmp_path / "cache")
    tiny.unlink()  # the source is gone; the cached copy still verifies
    assert fetch("tiny", dest=tmp_path / "cache").read_bytes() == CONTENT


def test_url_override_and_unknown_checksums(tiny, tmp_path, monkeypatch):
    with pytest.raises(FetchError, match="cannot download"):
        fetch("tiny", dest=tmp_path / "c1", url=(tmp_path / "missing.csv").as_uri())
    monkeypatch.setitem(KNOWN, "nosum", KnownTrace(tiny.as_uri(), "nosum.csv", None, "no checksum"))
    with pytest.raises(FetchError, match="--sha256"):
        fetch("nosum", dest=tmp_path / "c2")
    assert fetch("nosum", dest=tmp_path / "c2", sha256=hashlib.sha256(CONTENT).hexdigest()).is_file()
    assert fetch("nosum", dest=tmp_path / "c3", verify=False).is_file()
    with pytest.raises(FetchError, match="unknown trace"):
        fetch("nonesuch", dest=tmp_path / "c4")


def test_cli_prints_the_path_or_an_error(tiny, tmp_path, capsys):
    assert main(["fetch", "tiny", "--dest", str(tmp_path / "cache")]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "cache" / "tiny.csv")
    assert main(["fetch", "tiny", "--dest", str(tmp_path / "c2"), "--url", (tmp_path / "x").as_uri()]) == 1
    assert "error: cannot download" in capsys.readouterr().err


def test_cache_folder_defaults_under_pagebench_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("PAGEBENCH_CACHE", str(tmp_path))
    assert traces.default_cache() == tmp_path / "traces"


@pytest.mark.skipif(not AZURE_CODE.is_file(), reason="shared Azure trace not present")
def test_the_known_azure_checksum_matches_the_shared_copy_via_the_module_cli(tmp_path):
    result = subprocess.run([sys.executable, "-m", "harness.tools.traces", "fetch", "azure_code", "--dest",
                             str(tmp_path), "--url", AZURE_CODE.resolve().as_uri()],
                            cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert Path(result.stdout.strip()).read_bytes() == AZURE_CODE.read_bytes()
