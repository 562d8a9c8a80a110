"""File I/O every package may use: atomic writes (never a half-written file) and one
JSON reader whose errors name the file. Imports nothing of the project but
``harness.errors``, so kernels/ and reports/ use it without importing the harness."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from harness.errors import InputError

_UMASK = os.umask(0o022)
os.umask(_UMASK)  # (read by setting it: put it back)
FILE_MODE = 0o666 & ~_UMASK  # what open() would give a new file


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` via a temporary file and rename: never a half-written file."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temporary file and rename: never a half-written file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        os.chmod(tmp, FILE_MODE)  # mkstemp makes it 0600: give it a plain file's mode
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_json(path: Path, data: Any) -> None:
    """``data`` as indented JSON (keys in their order), written atomically."""
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=False) + "\n")


def read_json(path: Path, missing: str = "file not found") -> Any:
    """The JSON data in ``path``; an InputError naming the file (``missing`` when it does
    not exist) when it cannot be read or is not JSON."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
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
