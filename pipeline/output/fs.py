"""File access through Beam's FileSystems, so every path may be local, gs:// or s3://."""
from __future__ import annotations

import contextlib
import contextvars
import errno
import functools
import glob
import gzip
import hashlib
import json
import os
import re
import shutil
import stat
import sys
import tempfile
import time
import uuid
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Callable, Iterable, Iterator

from ..util import faults
from . import stores
from ..util.errors import UserError, first_line

if TYPE_CHECKING:
    from apache_beam.options.pipeline_options import PipelineOptions


@functools.cache
def beam_filesystems() -> Any:
    """Beam's ``FileSystems``, imported on first use, with the S3 clients shared
    (:func:`stores.share_s3_clients`) where Beam's S3 file system is there (``runners.lean_import``
    leaves it out of a run with no URL). Reading a config imports no Beam: ``pipeline run`` starts
    its workers' fork server first, so that it imports Beam while the driver does."""
    from apache_beam.io.filesystems import FileSystems

    if "apache_beam.io.aws.s3filesystem" in sys.modules:
        stores.share_s3_clients()
    return FileSystems


def configure(options: PipelineOptions) -> None:
    """Store clients (``--s3_endpoint_url``, ``--s3_access_key_id``, ...) from these options, in
    this process; Beam passes them on to its own SDK workers, the DaskRunner to its workers."""
    beam_filesystems().set_options(options)
    stores.use_options(options)


def plain_path(path: str) -> str:
    """A path as a user gives it made one the file systems take: a ``file://`` URL the local path it
    names (Beam's local file system takes none: joined, listed or written it failed with a
    traceback), a local path with its ``~`` expanded (a shell leaves the ``~`` of
    ``--output=~/corpus`` as it is); a store path as it is. One error line for a ``file://`` URL
    of another host."""
    if path[:7].lower() == "file://":
        from urllib.request import url2pathname

        host, _, rest = path[7:].partition("/")  # (not urlsplit: a glob's ? and a name's # are no query
        if host not in ("", "localhost"):        # or fragment here)
            raise UserError(f"{path}: a file:// URL of host {host!r}; give a path on this machine")
        return url2pathname("/" + rest)
    return path if "://" in path else os.path.expanduser(path)


def is_local(path: str) -> bool:
    return beam_filesystems().get_scheme(path) in (None, "file")


def join(base: str, *parts: str) -> str:
    return beam_filesystems().join(base, *parts)


def match_inputs(patterns: Iterable[str]) -> dict[str, int]:
    """Paths matching the globs, sorted and de-duplicated, with their sizes from the listing; a
    pattern that matches nothing is an error. A dangling symlink is kept, with size -1: the
    pipeline counts it as a rejected file, with its reason."""
    found: dict[str, int] = {}
    for pattern in patterns:
        try:
            result = beam_filesystems().match([pattern])[0]
        except Exception as exc:  # Beam wraps every filesystem failure in BeamIOError
            raise UserError(f"cannot list input {pattern!r}: {exc}") from None
        paths = {m.path: m.size_in_bytes for m in result.metadata_list}
        if is_local(pattern):  # Beam leaves out what it cannot stat (a dangling symlink): read_file rejects it
            paths.update((p, -1) for p in glob.glob(pattern, recursive=True) if not os.path.isdir(p) and not os.path.exists(p))
        if not paths and glob.escape(pattern) != pattern and exists(pattern):  # a file whose name looks like a glob
            paths = {pattern: size(pattern)}
        if not paths:
            raise UserError(f"input {pattern!r} matches no file")
        for path in paths if is_local(pattern) else ():
            if kind := _special_kind(path):
                raise UserError(f"input {path}: {kind}, not a file: a run may read an input more than once (exact "
                                "dedup's two passes, a retried bundle); write it to a file and give that")
        found.update(paths)
    return dict(sorted(found.items()))


def _special_kind(path: str) -> str:
    """What local ``path`` is where it is no file but a pipe, a socket or a device ("" otherwise)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return ""
    kinds = ((stat.S_ISFIFO, "a named pipe"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
             (stat.S_ISBLK, "a block device"))
    return next((kind for test, kind in kinds if test(mode)), "")


def same_bytes(files: dict[str, int]) -> list[list[str]]:
    """Groups of two or more of ``files`` (path: size, as :func:`match_inputs` gives them) that hold
    the same bytes: one file under two names, a link, a copy. Only files of equal size are compared:
    by their SHA-256 here; in a bucket by the store's checksum (GCS's CRC32C, S3's ETag) first, and
    those that match by their SHA-256 (a CRC32C can match by chance; an ETag depends on how the
    object was uploaded, so a copy uploaded otherwise is not found)."""
    by_size: dict[int, list[str]] = {}
    for path, n in files.items():
        if n > 0:
            by_size.setdefault(n, []).append(path)
    groups: dict[tuple[int, str], list[str]] = {}
    for n, paths in by_size.items():
        for path in paths if len(paths) > 1 else ():
            try:
                key = sha256(path) if is_local(path) else beam_filesystems().checksum(path)
            except Exception:  # noqa: BLE001  unreadable now: its reading names the error (a rejected file)
                key = f"unread:{path}"
            groups.setdefault((n, key), []).append(path)
    return [group for paths in groups.values() if len(paths) > 1
            for group in ([paths] if is_local(paths[0]) else _same_sha256(paths))]


def same_content(files: Iterable[str]) -> list[list[str]]:
    """Groups of ``files`` that are one file gzipped and not (``x.warc.wet.gz`` and the
    ``x.warc.wet`` that ``gunzip -k`` leaves beside it, or a copy of either): of the files whose
    names are equal once ``.gz`` is taken off, where some are gzipped and some not, those whose
    bytes are equal once decompressed. Files of other names are not read."""
    by_name: dict[str, list[str]] = {}
    for path in files:
        by_name.setdefault(path.rsplit("/", 1)[-1].lower().removesuffix(".gz"), []).append(path)
    groups = []
    for paths in by_name.values():
        if len({path.lower().endswith(".gz") for path in paths}) == 2:
            by_hash: dict[str, list[str]] = {}
            for path in paths:
                try:
                    by_hash.setdefault(sha256(path, decompressed=True), []).append(path)
                except Exception:  # noqa: BLE001  unreadable, or not gzip after all: its reading names the error
                    continue
            groups += [group for group in by_hash.values() if len(group) > 1]
    return groups


def _same_sha256(paths: list[str]) -> list[list[str]]:
    """Groups of two or more of ``paths`` with the same SHA-256."""
    by_hash: dict[str, list[str]] = {}
    for path in paths:
        by_hash.setdefault(sha256(path), []).append(path)
    return [group for group in by_hash.values() if len(group) > 1]


def match_optional(base: str, *pattern: str) -> list[str]:
    """Sorted files below folder ``base`` that match the glob ``pattern`` parts joined below it
    (Beam's globs: ``*`` within a folder, ``**`` across folders); none is fine. ``base`` is a path,
    not a glob: a ``[``, ``*`` or ``?`` in it stands for itself (an output folder ``out[1]`` would
    otherwise match ``out1``, and nothing of its own). A local ``base`` is walked itself, below the
    pattern's leading parts without a glob: Beam lists from the folder above the first glob
    character, which for ``out[1]`` given relative is ``""`` (nothing) and for ``/out[1]`` is ``/``."""
    parts = list(pattern)
    while len(parts) > 1 and glob.escape(parts[0]) == parts[0]:
        base = join(base, parts.pop(0))
    if is_local(base):
        from apache_beam.io.filesystem import FileSystem

        wanted = re.compile(FileSystem.translate_pattern("/".join(parts)))
        found = [os.path.join(folder, name) for folder, _, names in os.walk(base) for name in names]
        return sorted(path for path in found if wanted.match(os.path.relpath(path, base)))
    try:
        return sorted(m.path for m in _match(join(glob.escape(base), *parts)))
    except Exception:  # BeamIOError: some filesystems raise when nothing matches
        return []


def _match(pattern: str) -> list[Any]:
    """Beam's metadata of the store paths matching ``pattern``, where ``glob.escape`` (fnmatch's
    escapes, ``[[]``, which Beam's ``translate_pattern`` reads too) made parts of it stand for themselves."""
    with warnings.catch_warnings():  # re's FutureWarning at the "[[]" of an escaped "[": meant
        warnings.simplefilter("ignore", FutureWarning)
        return beam_filesystems().match([pattern])[0].metadata_list


def versions(path: str) -> list[list[Any]]:
    """``[name, size, last modified]`` of the file ``path``, or of each file below folder ``path``
    (named relative to it): what tells a file rewritten at the same path since (``--resume``)."""
    if is_local(path):
        files = [path] if os.path.isfile(path) else match_optional(path, "**")
        return [[os.path.relpath(f, path), os.path.getsize(f), os.path.getmtime(f)] for f in files]
    try:
        found = _match(glob.escape(path)) or _match(join(glob.escape(path), "**"))
    except Exception:  # BeamIOError: some filesystems raise when nothing matches
        found = []
    return sorted([relative(m.path, path) if m.path != path else ".", m.size_in_bytes, m.last_updated_in_seconds]
                  for m in found)


class ReadFailed(UserError):
    """The store did not give a file's bytes (the network, a permission): nothing is known of what
    the file holds, so it is not called damaged."""


def open_read(path: str) -> BinaryIO:
    from apache_beam.io.filesystem import CompressionTypes

    return beam_filesystems().open(path, compression_type=CompressionTypes.UNCOMPRESSED)


def read_json(path: str | Path, keys: tuple[str, ...] = (), what: str = "") -> dict[str, Any]:
    """A JSON object a command of ours wrote (local or in a bucket), holding at least ``keys``; one
    error line naming it otherwise (missing, cut short, edited by hand, or not ours). ``what`` says
    what the file is in that line ("tokenizer", "checkpoint"); without it the file is a pipeline
    output's."""
    path = str(path)
    named = f"{what} {path}" if what else path
    try:
        with open_read(path) as stream:
            data = json.loads(stream.read().decode("utf-8"))
    except IsADirectoryError:
        raise UserError(f"{named}: a folder, not a file") from None
    except FileNotFoundError:
        raise UserError(f"{named}: no such file" + ("" if what else " (is this a pipeline output?)")) from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(f"{named}: not valid JSON ({exc})") from None
    except Exception as exc:  # noqa: BLE001  a store's client: the object is missing or cannot be read
        if not is_local(path) and not exists(path):
            raise UserError(f"{named}: no such file") from None
        raise ReadFailed(f"{named}: cannot read it ({first_line(exc, typed=True)})") from exc
    missing = [key for key in keys if not isinstance(data, dict) or key not in data]
    if missing:
        raise UserError(f"{named}: not written by pipeline run (no {missing[0]!r})")
    if not isinstance(data, dict):
        raise UserError(f"{named}: expected a JSON object")
    return data


def write_json(path: str | Path, obj: Any, compact: bool = False, durable: bool = False) -> None:
    """``obj`` as JSON with sorted keys, written whole: indented, with a final newline, for people to
    read, or ``compact`` (ASCII, one line: the runs' many small markers). Locally through
    :func:`write_atomic` (``durable`` as there); on a bucket in one upload (:func:`put_object`), which
    replaces an object at once without write_atomic's temporary object (its copy and delete)."""
    text = (json.dumps(obj, sort_keys=True) if compact else
            json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
    if not is_local(str(path)):
        check_file(str(path))
        put_object(str(path), text.encode("utf-8"))
        return
    write_atomic(str(path), lambda stream: stream.write(text.encode("utf-8")), durable)


def sha256(path: str, decompressed: bool = False) -> str:
    """The SHA-256 of a file's bytes (local or in a bucket), read in 4 MiB blocks; ``decompressed``:
    of what gzip decompresses them to, where the file is gzip (its first two bytes say)."""
    if decompressed:
        with open_read(path) as raw:
            decompressed = raw.read(2) == b"\x1f\x8b"
    digest = hashlib.sha256()
    with open_read(path) as raw:
        stream = gzip.GzipFile(fileobj=raw) if decompressed else raw
        for block in iter(lambda: stream.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def exists(path: str) -> bool:
    return beam_filesystems().exists(path)


def write_atomic(path: str, write: Callable[[BinaryIO], None], durable: bool = False) -> None:
    """Write through ``write(stream)`` to a temporary name beside ``path``, then rename; a write that
    fails leaves no temporary file. A reader finds the old file or the new one, never none (:func:`_move`).
    ``durable``: locally, the file's bytes are on the disk before the rename and the rename after
    it (:func:`make_durable`), so that a machine that crashes finds the old file or the whole new one."""
    from apache_beam.io.filesystem import CompressionTypes

    check_file(path)
    tmp = f"{path}.tmp-{uuid.uuid4().hex}"
    if is_local(path):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    try:
        with beam_filesystems().create(tmp, compression_type=CompressionTypes.UNCOMPRESSED) as stream:
            write(stream)
        if durable:
            make_durable([tmp], folders=False)
    except BaseException:
        delete([tmp])
        raise
    _move(tmp, path)
    if durable:
        make_durable([path], files=False)
    if (noted := WRITTEN.get()) is not None:
        noted.append(path)


WRITTEN: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("written", default=None)
"""Where this context's writes are noted (:func:`written_files`): a thread's, carried into the calls
it hands to another (``util.memory.OwnArena``'s ``carry``: a step's chunks)."""


@contextlib.contextmanager
def written_files() -> Iterator[list[str]]:
    """The files :func:`write_atomic` writes within the block, in this thread or in calls it runs
    elsewhere carrying :data:`WRITTEN` (a step's chunks in their ``OwnArena``), to make them durable
    together (:func:`make_durable`) before a marker says they are whole."""
    files: list[str] = []
    token = WRITTEN.set(files)
    try:
        yield files
    finally:
        WRITTEN.reset(token)


def make_durable(paths: Iterable[str], files: bool = True, folders: bool = True) -> None:
    """Local files' bytes (``files``) and the entries naming them in their folders (``folders``) on
    the disk (``fsync``), not only in the page cache: after this a machine that crashes, or loses
    power, finds them whole. A file in a bucket is durable once its write returned: nothing to do.
    With ``folders``, the folders above a file are synced too, up to its file system's root, where
    this process has not synced them since the folder below was made (:func:`_unsynced_above`): a
    folder the run made (a language's, a staging folder) is found after a crash only if its own
    entry in its parent is on the disk as well. Files and then folders are synced by a few threads
    at once (``fsync`` waits for the disk, not the CPU); a file system that cannot sync a folder
    (EINVAL, ENOTSUP, ENOSYS: some network and shared folders) leaves it as it is, one it cannot
    open for reading too. Folders are taken as the disk has them (symbolic links resolved)."""
    local = [path for path in paths if is_local(path)]
    if files:
        _each(_fsync, local)
    if folders:
        own = {os.path.realpath(os.path.dirname(os.path.abspath(path))) for path in local}
        above, entries = _unsynced_above(own)
        _each(functools.partial(_fsync, folder=True), sorted(own | above))
        _SYNCED_ENTRIES.update(entries)


Entry = tuple[str, int, int, int]
"""A folder as :data:`_SYNCED_ENTRIES` knows it: path, device, inode and ``st_ctime_ns``."""
_SYNCED_ENTRIES: set[Entry] = set()
"""Folders whose own entry in their parent this process synced, so that the folders up to the root
are not synced again for every task's files and marker (an fsync may flush the disk's cache even
where nothing changed). A folder removed and made again is another (its inode, or its change time,
which a new entry in it also moves on: its parent is synced again then, once)."""


def _unsynced_above(folders: Iterable[str]) -> tuple[set[str], set[Entry]]:
    """The folders above ``folders`` that hold the entry of a folder below them not yet synced by this
    process (:data:`_SYNCED_ENTRIES`), up to the root of the file system each is on (a mount
    point's own entry is in another file system, made at mount time), and those entries."""
    above: set[str] = set()
    entries: set[Entry] = set()
    for folder in folders:
        try:
            below = os.stat(folder)
        except OSError:
            continue
        while (entry := (folder, below.st_dev, below.st_ino, below.st_ctime_ns)) not in _SYNCED_ENTRIES \
                and entry not in entries:
            parent = os.path.dirname(folder)
            try:
                holder = os.stat(parent)
            except OSError:
                break
            if parent == folder or holder.st_dev != below.st_dev:
                break
            above.add(parent)
            entries.add(entry)
            folder, below = parent, holder
    return above, entries


def _each(call: Callable[[str], None], paths: list[str]) -> None:
    """``call`` on every path, by a few threads where there are several."""
    if len(paths) < 2:
        for path in paths:
            call(path)
        return
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(call, paths))


_NO_FOLDER_SYNC = {errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS, errno.EACCES, errno.EPERM}


def _fsync(path: str, folder: bool = False) -> None:
    try:
        descriptor = os.open(path, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
    except OSError as exc:
        if not (folder and exc.errno in _NO_FOLDER_SYNC):
            raise


def put_object(path: str, data: bytes) -> None:
    """``data`` as the object at store path ``path``, in one upload: a reader finds the old object
    or the new one, never none; a failing write leaves the object cut short (:func:`write_atomic` does not)."""
    from apache_beam.io.filesystem import CompressionTypes

    with beam_filesystems().create(path, compression_type=CompressionTypes.UNCOMPRESSED) as stream:
        stream.write(data)


def _move(source: str, dest: str) -> None:
    """Rename file ``source`` to ``dest``, replacing a file there at once, so that a reader (or a
    kill) finds the old file or the new one, never none: locally ``os.replace``; on a bucket Beam's
    rename, a copy (S3 CopyObject, GCS's copy: each replaces an object at ``dest`` whole) then a
    delete of ``source``."""
    if is_local(dest):
        Path(dest).parent.mkdir(parents=True, exist_ok=True)
        os.replace(source, dest)
        return
    beam_filesystems().rename([source], [dest])


def remove_temporaries(base: str, patterns: Iterable[str]) -> list[str]:
    """Delete what :func:`write_atomic` left in folder ``base`` and the folders below it that the
    globs ``patterns`` match when its writer died before the rename (a killed worker whose work was
    then redone elsewhere)."""
    leftovers = [p for parts in ([], *(folder.split("/") for folder in patterns))
                 for p in match_optional(base, *parts, "*.tmp-*")]
    delete(leftovers)
    return leftovers


def relative(path: str, base: str) -> str:
    """``path`` below folder ``base``, as a relative path with ``/``."""
    prefix = base.rstrip("/") + "/"
    if not path.startswith(prefix):
        raise ValueError(f"{path} is not below {base}")
    return path[len(prefix):]


def replace_tree(staged: list[str], staging: str, old: list[str], target: str, moved: Iterable[str] = ()) -> None:
    """Move the ``staged`` files (below ``staging``) to the same places below ``target``, then delete
    the ``old`` files of ``target`` that the new ones do not replace: the old files that no new one
    replaces stay readable until every new one is in place, and locally an old file until the new
    one in its place is (:func:`_move`). Locally the moves, and those of the files ``moved`` before
    (by a killed process), are on the disk before ``staging`` goes."""
    moves = {path: join(target, relative(path, staging)) for path in staged}
    for n, (source, dest) in enumerate(sorted(moves.items())):
        faults.fault_point("POLYGLOT_FAULT", "replace", n)
        _move(source, dest)
    make_durable([*moves.values(), *moved], files=False)  # before the folder (a commit's marker) goes
    delete(sorted(set(old) - set(moves.values())))
    remove_folder(staging)


def check_file(path: str, what: str = "") -> None:
    """That local ``path`` can be written as a file: it is not empty nor a folder, and no file is in
    the way of the folders above it. A store path passes. ``what``: the option it came from."""
    named = f"{what} {path}".strip() if path else f"{what} ''".strip()
    if not path:
        raise UserError(f"{named}: an empty path; a file name is needed here")
    if not is_local(path):
        return
    if path.endswith(("/", os.sep)) or Path(path).is_dir():
        raise UserError(f"{named}: a folder; a file name is needed here")
    if (blocking := _file_at_or_above(Path(path).parent)) is not None:
        raise UserError(f"{named}: {blocking} is a file, not a folder")


def check_folder(path: str, what: str, own: Iterable[str] | None = None) -> None:
    """That local ``path`` can be a folder of outputs: neither it nor a folder above it is a file;
    with ``own``, a folder there may hold only those names (what the command writes and replaces
    whole), so that replacing it loses nothing else. A store path passes."""
    if not is_local(path):
        return
    folder = Path(path)
    if (blocking := _file_at_or_above(folder)) is not None:
        raise UserError(f"{what} {path}: {blocking} is a file, not a folder")
    if own is not None and folder.is_dir():
        foreign = sorted(p.name for p in folder.iterdir() if p.name not in set(own))
        if foreign:
            more = f" and {len(foreign) - 1} more" if len(foreign) > 1 else ""
            raise UserError(f"{what} {path}: the folder holds {foreign[0]!r}{more}, not written by this command; "
                            f"give a new or empty folder, or the one it wrote before")


def check_local(path: str, what: str) -> None:
    """UserError unless ``path`` is on this machine, for a command that reads or writes it as local
    files only (a store path made a ``Path`` is the local folder ``s3:/bucket/...``)."""
    if not is_local(path):
        raise UserError(f"{what} {path}: a bucket path; give a local folder (copy it to or from the bucket with "
                        "`aws s3 cp --recursive` or `gsutil -m cp -r`)")


def check_writable(path: str, what: str) -> None:
    """That local folder ``path`` can be made and written, before any work (a store path is probed
    by ``stores.check``): a folder is made and removed in the deepest of it and its parents that
    exists. Otherwise the run's writers found out only at its end, each with a traceback."""
    if not is_local(path):
        return
    existing = next(p for p in (Path(path).absolute(), *Path(path).absolute().parents) if p.exists())
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".polyglot-probe-", dir=existing))
    except OSError as exc:
        raise UserError(f"{what} {path}: cannot write in {existing}: {exc.strerror}") from None


def below(path: str, folder: str) -> bool:
    """Whether ``path`` lies in ``folder`` or a folder below it (local paths with their links resolved)."""
    if is_local(path) != is_local(folder):
        return False
    if is_local(path):
        path, folder = os.path.realpath(path), os.path.realpath(folder)
    return path.startswith(folder.rstrip("/") + "/")


def _file_at_or_above(folder: Path) -> Path | None:
    """The first of ``folder`` and the folders above it that exists and is not a folder, if any."""
    return next((p for p in (folder, *folder.parents) if p.exists() and not p.is_dir()), None)


def swap_folder(complete: Path, final: Path) -> None:
    """Make the local folder ``complete`` the folder ``final``: the old ``final`` is renamed aside,
    the new one renamed in, the old one deleted. Killed between the two renames, the old folder
    waits under ``.<name>.old`` and :func:`restore_folder` puts it back."""
    old = final.with_name(f".{final.name}.old")
    if old.is_symlink():  # (left by a version that renamed a link given as the folder)
        old.unlink()
    elif old.exists():
        shutil.rmtree(old)
    if final.exists():
        os.rename(final, old)
    os.rename(complete, final)
    shutil.rmtree(old, ignore_errors=True)


def restore_folder(final: Path) -> None:
    """Undo a :func:`swap_folder` that was killed between its renames (the old folder comes back)."""
    old = final.with_name(f".{final.name}.old")
    if old.exists() and not final.exists():
        os.rename(old, final)


def remove_folder(folder: str) -> None:
    """Delete a folder and what is left in it (locally; on a bucket a prefix has no folder to remove)."""
    if is_local(folder):
        shutil.rmtree(folder, ignore_errors=True)
    else:
        delete(match_optional(folder, "**"))


def remove_empty_folders(root: str, patterns: Iterable[str]) -> None:
    """Delete the local folders below ``root`` matching ``patterns`` that are left empty (deepest first)."""
    if not is_local(root):
        return
    for pattern in patterns:
        for folder in sorted(Path(root).glob(pattern), key=lambda p: -len(p.parts)):
            if folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()


def delete(paths: Iterable[str]) -> None:
    """Delete the files (and local folders, whole) at ``paths`` that exist. A path is a path: Beam's
    local and GCS deletes read each as a glob, which a ``[`` in a folder's name made match nothing
    (or another path)."""
    in_stores = []
    for path in paths:
        if not is_local(path):
            in_stores.append(path)
        elif os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        elif os.path.lexists(path):
            os.remove(path)
    existing = [p for p in in_stores if beam_filesystems().exists(p)]
    if existing:  # Beam's GCS delete matches each path as a glob too (S3's does not)
        beam_filesystems().delete([glob.escape(p) if beam_filesystems().get_scheme(p) == "gs" else p for p in existing])


def size(path: str) -> int:
    return os.path.getsize(path) if is_local(path) else _match(glob.escape(path))[0].size_in_bytes


MODEL_CACHE = Path(tempfile.gettempdir()) / "polyglot-models"
"""Local copies of models in a bucket, shared by the runs and workers of a machine."""


def local_copy(path: str, cache_dir: Path = MODEL_CACHE) -> Path:
    """``path`` itself when local, else a copy in ``cache_dir``, made once per machine for each
    version of the object (its checksum, size and time: an object replaced in place, even by one of
    the same size, is copied again, and the older copies go once the object is seen to be that
    version still) and checked against the object's size (a copy cut short by a lost connection is
    made again, then refused)."""
    if is_local(path):
        local = Path(path)
        if not local.is_file():
            raise UserError(f"{path}: no such file")
        return local
    expected, version = _version(path)
    name, key = Path(path).name, hashlib.sha1(path.encode()).hexdigest()[:12]
    target = cache_dir / f"{key}-{version}-{name}"
    _remove_stale_partials(cache_dir, f"{key}-*-{glob.escape(name)}{PARTIAL}*")
    if target.exists() and target.stat().st_size == expected:
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    partial = cache_dir / f"{target.name}{PARTIAL}{uuid.uuid4().hex}"
    try:
        with open_read(path) as src, open(partial, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 22)
    except BaseException:  # a copy cut short by an error: not left in the cache, as large as a model
        partial.unlink(missing_ok=True)
        raise
    copied = partial.stat().st_size
    if copied != expected:
        partial.unlink()
        raise UserError(f"{path}: copied {copied} of its {expected} bytes to {cache_dir}")
    partial.rename(target)
    if _version(path)[1] == version:  # still the object's version: the older copies go (a worker that opened one keeps it)
        for older in [*cache_dir.glob(f"{key}-*-{glob.escape(name)}"), cache_dir / f"{key}-{name}"]:
            if older != target:
                older.unlink(missing_ok=True)
    return target


PARTIAL = ".part-"
"""``<copy>.part-<hex>``: a model copy being made (:func:`local_copy`)."""
PARTIAL_STALE_S = 3600.0
"""A partial copy not written to for this long was left by a copier that was killed; a live copier
writes to its own every few seconds at most."""


def _remove_stale_partials(cache_dir: Path, pattern: str) -> None:
    """Delete the partial copies in ``cache_dir`` matching ``pattern`` that no one has written to for
    :data:`PARTIAL_STALE_S` (a killed worker's, as large as a model); another copier's live one stays."""
    for partial in cache_dir.glob(pattern):
        try:
            if time.time() - partial.stat().st_mtime > PARTIAL_STALE_S:
                partial.unlink()
        except FileNotFoundError:  # renamed or removed by its copier meanwhile
            continue


def _version(path: str) -> tuple[int, str]:
    """Store object ``path``'s size and a name of its version (checksum, size, time)."""
    found = _match(glob.escape(path))
    if not found:
        raise UserError(f"{path}: no such object")
    version = f"{beam_filesystems().checksum(path)}|{found[0].size_in_bytes}|{found[0].last_updated_in_seconds}"
    return found[0].size_in_bytes, hashlib.sha1(version.encode()).hexdigest()[:12]
