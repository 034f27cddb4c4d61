"""File access through Beam's FileSystems, so every path may be local, gs:// or s3://."""
from __future__ import annotations

import hashlib
import shutil
import uuid
from pathlib import Path
from typing import BinaryIO, Callable, Iterable

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from .errors import UserError


def is_local(path: str) -> bool:
    return FileSystems.get_scheme(path) in (None, "file")


def join(base: str, *parts: str) -> str:
    return FileSystems.join(base, *parts)


def match_inputs(patterns: Iterable[str]) -> list[str]:
    """Sorted, de-duplicated paths matching the globs; a pattern that matches nothing is an error."""
    found: set[str] = set()
    for pattern in patterns:
        try:
            result = FileSystems.match([pattern])[0]
        except Exception as exc:  # Beam wraps every filesystem failure in BeamIOError
            raise UserError(f"cannot list input {pattern!r}: {exc}") from None
        paths = [m.path for m in result.metadata_list]
        if not paths:
            raise UserError(f"input {pattern!r} matches no file")
        found.update(paths)
    return sorted(found)


def match_optional(pattern: str) -> list[str]:
    """Sorted paths matching ``pattern``; none is fine."""
    try:
        return sorted(m.path for m in FileSystems.match([pattern])[0].metadata_list)
    except Exception:  # BeamIOError: some filesystems raise when nothing matches
        return []


def open_read(path: str) -> BinaryIO:
    return FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED)


def exists(path: str) -> bool:
    return FileSystems.exists(path)


def write_atomic(path: str, write: Callable[[BinaryIO], None]) -> None:
    """Write through ``write(stream)`` to a temporary name beside ``path``, then rename."""
    tmp = f"{path}.tmp-{uuid.uuid4().hex}"
    if is_local(path):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    with FileSystems.create(tmp, compression_type=CompressionTypes.UNCOMPRESSED) as stream:
        write(stream)
    if FileSystems.exists(path):
        FileSystems.delete([path])
    FileSystems.rename([tmp], [path])


def remove_temporaries(patterns: Iterable[str]) -> list[str]:
    """Delete what :func:`write_atomic` left in the folders ``patterns`` match when its writer
    died before the rename (a killed worker whose work was then redone elsewhere)."""
    leftovers = [p for folder in patterns for p in match_optional(join(folder, "*.tmp-*"))]
    delete(leftovers)
    return leftovers


def delete(paths: Iterable[str]) -> None:
    existing = [p for p in paths if FileSystems.exists(p)]
    if existing:
        FileSystems.delete(existing)


def local_copy(path: str, cache_dir: Path) -> Path:
    """``path`` itself when local, else a copy in ``cache_dir`` (made once per worker)."""
    if is_local(path):
        local = Path(path)
        if not local.is_file():
            raise UserError(f"{path}: no such file")
        return local
    target = cache_dir / f"{hashlib.sha1(path.encode()).hexdigest()[:12]}-{Path(path).name}"
    if not target.exists():
        cache_dir.mkdir(parents=True, exist_ok=True)
        partial = target.with_suffix(f".part-{uuid.uuid4().hex}")
        with open_read(path) as src, open(partial, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 22)
        partial.rename(target)
    return target
