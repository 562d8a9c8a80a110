"""Fetch known public traces into a cache folder, checking their sha256.

    python -m harness.tools.traces list
    python -m harness.tools.traces fetch azure_conv [--dest DIR] [--url URL] [--sha256 HEX]

The file lands in ``DIR`` (default ``$PAGEBENCH_CACHE/traces`` or
``~/.cache/pagebench/traces``) only if its sha256 matches; the command prints
its path, ready for ``workload.path=...``. ``--url`` replaces the download URL
(a mirror, or a ``file://`` URL) but not the expected checksum.

What is verified: the sha256 values below were computed here from the copies
in the project's shared/traces folder, whose SOURCE.md files record them as
byte-identical to the upstream files at the pinned commits (git blob ids
compared). What could not be verified here: that the URLs serve those bytes
today (this machine has no network). Traces without a known checksum (BurstGPT,
ShareGPT) need ``--sha256 HEX`` or an explicit ``--no-verify``.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from harness.fileio import FILE_MODE
from harness.run.results import file_sha256


@dataclass(frozen=True)
class KnownTrace:
    url: str
    filename: str
    sha256: str | None
    note: str


_AZURE = ("https://raw.githubusercontent.com/Azure/AzurePublicDataset/"
          "b469a113cedca53ddc3bdea71a143dc4b7d8700c/data/")
_MOONCAKE = ("https://raw.githubusercontent.com/kvcache-ai/Mooncake/3b5a594133958449a1feaf1c9e0fc1b553e34a28/"
             "FAST25-release/traces/")
_SARATHI = ("https://raw.githubusercontent.com/microsoft/sarathi-serve/72339db5b120614033b317880ad3a05a5e4c9415/"
            "data/processed_traces/")

KNOWN: dict[str, KnownTrace] = {
    "azure_conv": KnownTrace(_AZURE + "AzureLLMInferenceTrace_conv.csv", "AzureLLMInferenceTrace_conv.csv",
                             "2f1e5b666d4e3055fdbba98598ce2ec307767b9064e03e2fa46676dbcc7d0bf8",
                             "Azure LLM inference 2023, conversation (CC-BY 4.0)"),
    "azure_code": KnownTrace(_AZURE + "AzureLLMInferenceTrace_code.csv", "AzureLLMInferenceTrace_code.csv",
                             "54e9a6d2a4bd06ba1e060304b900abbc74cbea53de96506e60fe5bb4f2277fb6",
                             "Azure LLM inference 2023, code (CC-BY 4.0)"),
    "mooncake": KnownTrace(_MOONCAKE + "conversation_trace.jsonl", "conversation_trace.jsonl",
                           "b8cbb061a85206d729d91cdc2981f43c9e0d99209dce588d3af5f7934408b9df",
                           "Mooncake FAST'25 conversation trace (Apache-2.0)"),
    "sharegpt_lengths": KnownTrace(_SARATHI + "sharegpt_8k_filtered_stats_llama2_tokenizer.csv",
                                   "sharegpt_8k_filtered_stats_llama2_tokenizer.csv",
                                   "6d6c296302a853e2669a674a96f269283e60c57e60363bd450588a1066919f9f",
                                   "ShareGPT lengths, sarathi-serve processing (Apache-2.0)"),
    "burstgpt": KnownTrace("https://github.com/HPMLL/BurstGPT/releases/download/v1.1/BurstGPT_1.csv",
                           "BurstGPT_1.csv", None, "BurstGPT release v1.1, first file (checksum unknown)"),
    "sharegpt": KnownTrace("https://huggingface.co/datasets/anon8231489123/ShareGPT_Vicuna_unfiltered/"
                           "resolve/main/ShareGPT_V3_unfiltered_cleaned_split.json",
                           "ShareGPT_V3_unfiltered_cleaned_split.json",
                           None, "ShareGPT V3 as vLLM's benchmark uses it (checksum unknown)"),
}


class FetchError(Exception):
    """A download failed or its checksum did not match."""


def default_cache() -> Path:
    root = os.environ.get("PAGEBENCH_CACHE")
    return (Path(root) if root else Path.home() / ".cache" / "pagebench") / "traces"




def fetch(name: str, dest: Path | None = None, url: str | None = None, sha256: str | None = None,
          verify: bool = True) -> Path:
    """Download trace ``name`` into ``dest`` and check its sha256; returns the file's path."""
    if name not in KNOWN:
        raise FetchError(f"unknown trace {name!r}; known: {', '.join(sorted(KNOWN))}")
    known = KNOWN[name]
    expected = (sha256 or known.sha256 or "").lower() or None
    if verify and expected is None:
        raise FetchError(f"no known sha256 for {name}; pass --sha256 HEX, or --no-verify to accept any content")
    dest = Path(dest) if dest is not None else default_cache()
    if dest.exists() and not dest.is_dir():
        raise FetchError(f"--dest {dest} is a file: give a folder to download into")
    try:
        dest.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise FetchError(f"cannot create the folder {dest}: {err}") from None
    target = dest / known.filename
    if target.is_file() and expected is not None and file_sha256(target) == expected:
        return target
    source = url or known.url
    digest = hashlib.sha256()
    fd, tmp_name = tempfile.mkstemp(prefix=f".{known.filename}.", dir=dest)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(source, timeout=60) as response:
            for chunk in iter(lambda: response.read(1 << 20), b""):
                digest.update(chunk)
                out.write(chunk)
        actual = digest.hexdigest()
        if expected is not None and actual != expected:
            raise FetchError(f"sha256 mismatch for {name} from {source}: expected {expected}, got {actual}; "
                             "the file was not saved")
        os.chmod(tmp, FILE_MODE)  # mkstemp makes it 0600: a plain file's mode for a shared cache
        os.replace(tmp, target)
    except (urllib.error.URLError, OSError, ValueError) as err:
        raise FetchError(f"cannot download {name} from {source}: {err}") from None
    finally:
        tmp.unlink(missing_ok=True)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.tools.traces", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="list the known traces")
    get = sub.add_parser("fetch", help="download a known trace and check its sha256")
    get.add_argument("name", help=f"one of: {', '.join(sorted(KNOWN))}")
    get.add_argument("--dest", type=Path, default=None, help=f"folder (default {default_cache()})")
    get.add_argument("--url", default=None, help="download from this URL instead (mirror or file://)")
    get.add_argument("--sha256", default=None, help="expected sha256 (required where none is known)")
    get.add_argument("--no-verify", action="store_true", help="accept any content when no sha256 is known")
    args = parser.parse_args(argv)
    if args.command == "list":
        for name, known in sorted(KNOWN.items()):
            print(f"{name:18s} {known.note}\n{'':18s} {known.url}")
        return 0
    if args.name not in KNOWN:  # a usage error, as argparse's own: exit status 2
        from harness.errors import did_you_mean

        get.error(f"unknown trace {args.name!r}.{did_you_mean(args.name, KNOWN)} Known: "
                  f"{', '.join(sorted(KNOWN))} (python -m harness.tools.traces list)")
    try:
        path = fetch(args.name, args.dest, args.url, args.sha256, verify=not args.no_verify)
    except FetchError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
