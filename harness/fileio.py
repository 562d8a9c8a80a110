"""File I/O every package may use: atomic writes (never a half-written file) and one
strict JSON reader whose errors name the file, and the owner check of every write into a
run directory (the claims ``harness.run.run_lock`` takes). Imports nothing of the project but
``harness.errors``, so kernels/ and reports/ use it without importing the harness."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import tempfile
from pathlib import Path
from typing import Any, BinaryIO, Iterator

from harness.errors import InputError, OutputError, RunDirectoryBusy

_UMASK = os.umask(0o022)
os.umask(_UMASK)  # (read by setting it: put it back)
FILE_MODE = 0o666 & ~_UMASK  # what open() would give a new file


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` via a temporary file and rename: never a half-written file."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temporary file and rename (``atomic_open``)."""
    with atomic_open(path) as handle:
        handle.write(data)


@contextlib.contextmanager
def atomic_open(path: Path) -> Iterator[BinaryIO]:
    """A binary file for ``path``'s new contents: a temporary file beside it, renamed to
    ``path`` when the block ends without an error and removed otherwise; so never a
    half-written file, and none into a run directory another run owns now
    (``check_owner``). An ``OSError`` (disk full, read-only) becomes an ``OutputError``
    naming the path."""
    path = Path(path)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        os.chmod(tmp, FILE_MODE)  # mkstemp makes it 0600: give it a plain file's mode
        with os.fdopen(fd, "wb") as handle:
            yield handle
        check_owner(path.parent)
        os.replace(tmp, path)
    except BaseException as exc:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(exc, OSError) and not isinstance(exc, OutputError):
            raise OutputError(f"{path}: cannot write it: {write_error_reason(exc, path)}") from None
        raise


# A run directory's lock file (``harness.run.run_lock.claim_run_dir`` holds it) and this
# process's claims: run directory (real path) -> the token this process wrote there.
LOCK_NAME = ".pagebench.lock"
_claims: dict[str, str] = {}


def check_owner(directory: Path) -> None:
    """Raise ``RunDirectoryBusy`` when this process holds a claim on ``directory`` that is
    no longer the one in its lock file (a later run took the directory over)."""
    mine = _claims.get(os.path.realpath(directory)) if _claims else None
    if mine is None:
        return
    current = read_lock_token(Path(directory) / LOCK_NAME)
    if current != mine:
        raise RunDirectoryBusy(f"{directory}: another run (pid {current.split(' ')[0] or '?'}) "
                               f"owns this directory now; this process's output is not written")


def read_lock_token(lock_path: Path) -> str:
    """The token in a lock file ("" when it cannot be read)."""
    try:
        return lock_path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return ""


def claims() -> dict[str, str]:
    """This process's claims (run directory -> token), for ``claim_run_dir`` to add to and a
    worker process to adopt (``adopt_claims``)."""
    return _claims


def adopt_claims(held: dict[str, str]) -> None:
    """In a worker process: write under the claims of the process that started it."""
    _claims.clear()
    _claims.update(held)


def write_error_reason(exc: OSError, path: Path) -> str:
    """What an OSError writing ``path`` means, in words."""
    if exc.errno == errno.ENOSPC:
        return "no space left on the device (free some, or write elsewhere: hydra.run.dir=...)"
    if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return f"{exc.strerror} (a read-only or protected directory: write elsewhere)"
    if isinstance(exc, (FileExistsError, NotADirectoryError)):
        blocking = next((p for p in path.parents if p.exists() and not p.is_dir()), path.parent)
        return f"{blocking} is a file, not a directory"
    return exc.strerror or str(exc)


def write_json(path: Path, data: Any) -> None:
    """``data`` as indented JSON (keys in their order), written atomically."""
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=False) + "\n")


class RepeatedKey(ValueError):
    """A JSON object names a key twice (``STRICT_JSON``): which value is meant is ambiguous."""

    def __init__(self, key: str) -> None:
        super().__init__(f"the key {key!r} appears twice in one object (which value is meant "
                         "is ambiguous)")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict:
    out = {}
    for key, value in pairs:
        if key in out:
            raise RepeatedKey(key)
        out[key] = value
    return out


# Every JSON input is decoded by this: a repeated key is an error (as a CSV column named
# twice is), not its last value. Nesting deeper than Python's recursion limit raises
# RecursionError, which the readers report as TOO_DEEP.
STRICT_JSON = json.JSONDecoder(object_pairs_hook=_unique_keys)
TOO_DEEP = "nested too deeply to read (arrays or objects inside one another, thousands deep)"


def long_integer(exc: ValueError, text: str) -> tuple[str, int, str | None] | None:
    """(message, line, field) when ``exc`` is Python's refusal of an integer of more than
    ``sys.get_int_max_str_digits()`` digits (4,300) decoding the JSON ``text``; else None."""
    if "integer string conversion" not in str(exc):
        return None
    import re
    import sys

    limit = sys.get_int_max_str_digits()
    match = re.search(r'(?:"((?:[^"\\]|\\.)*)"\s*:\s*)?-?(\d{%d,})' % (limit + 1), text)
    if match is None:
        return f"an integer of more than {limit:,} digits", 1, None
    return (f"an integer of {len(match.group(2)):,} digits (more than the {limit:,} a number may have)",
            text.count("\n", 0, match.start()) + 1, match.group(1))


def read_json(path: Path, missing: str = "file not found") -> Any:
    """The JSON data in ``path``; an InputError naming the file (``missing`` when it does
    not exist) when it cannot be read or is not JSON (``STRICT_JSON``)."""
    text = None
    try:
        text = Path(path).read_text(encoding="utf-8")
        return STRICT_JSON.decode(text)
    except RepeatedKey as exc:
        raise InputError(str(exc), path=str(path)) from None
    except RecursionError:
        raise InputError(TOO_DEEP, path=str(path)) from None
    except FileNotFoundError:
        raise InputError(missing, path=str(path)) from None
    except IsADirectoryError:
        raise InputError("is a directory; pass a JSON file", path=str(path)) from None
    except OSError as exc:
        raise InputError(f"cannot read it: {exc.strerror}", path=str(path)) from None
    except UnicodeDecodeError:
        raise InputError("not UTF-8 text (not a JSON file?)", path=str(path)) from None
    except json.JSONDecodeError as exc:
        raise InputError(f"not valid JSON (truncated?): {exc.msg}", path=str(path),
                         line=exc.lineno) from None
    except ValueError as exc:
        found = long_integer(exc, text or "")
        if found is None:
            raise
        message, line, field = found
        raise InputError(message, path=str(path), line=line, field=field) from None


def launch_path(path: str) -> Path:
    """``path`` (``~`` expanded) taken from the directory the user ran in, not Hydra's run
    directory (``hydra.job.chdir=true``): where the loaders read it and the config hash
    (``harness.run.results.config_hash``) hashes it."""
    candidate = Path(os.path.expanduser(path))
    return candidate if candidate.is_absolute() else _launch_dir() / candidate


def _launch_dir() -> Path:
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.utils import get_original_cwd

        if HydraConfig.initialized():
            return Path(get_original_cwd())
    except (ImportError, ValueError):  # pragma: no cover - hydra-core is a dependency
        pass
    return Path.cwd()
