"""Folders a process holds for as long as it lives: a lock file in the folder, locked with ``flock``
(which the kernel releases when the process dies, SIGKILL and out-of-memory kills included) and
naming this host and process. Another process can then tell a folder whose process was killed
(:func:`abandoned`) from one still being written. Local folders only."""
from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import stat
import time
from typing import Callable

LOCK_FILE = ".lock"

_HELD: set[str] = set()
"""The folders this process holds: never abandoned (on NFS a lock is the process's, so locking one
of them again would succeed, and closing it would free the process's own lock)."""


class FolderLock:
    """Holds ``<folder>/.lock`` until :meth:`release` or the process's end. Where the file system
    cannot lock (Lustre without flock, NFS without lockd), no lock file is left either, so the
    folder is never taken for abandoned. The folder must exist and hold no lock file yet."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        path = os.path.join(folder, LOCK_FILE)
        self._fd: int | None = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            os.write(self._fd, f"{socket.gethostname()} {os.getpid()}\n".encode())  # empty until held
            _HELD.add(folder)
        except OSError:
            os.close(self._fd)
            self._fd = None
            os.unlink(path)

    def release(self) -> None:
        """Let the lock go (the folder and its lock file may be gone already)."""
        _HELD.discard(self.folder)
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class FileLock:
    """Holds lock file ``path`` (made where missing) with a ``flock`` that does not wait, until
    :meth:`release` deletes it, or the process ends; ``held`` is False where another process holds
    it (:func:`owner` names it). A killed holder's file is taken as it is; one its holder deleted
    between this process's open and lock is opened again. Where the file system cannot lock,
    ``held`` is True, as nothing can hold it, and no file is left."""

    def __init__(self, path: str) -> None:
        self.path, self.held, self._fd = path, True, None
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                self.held = False
                os.close(fd)
                return
            except OSError:  # cannot lock here (Lustre without flock, NFS without lockd)
                os.close(fd)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
                return
            if _same_file(fd, path):
                os.ftruncate(fd, 0)
                os.write(fd, f"{socket.gethostname()} {os.getpid()}\n".encode())
                self._fd = fd
                return
            os.close(fd)  # deleted by its holder meanwhile: the next one opens (or makes) the file there now

    def release(self) -> None:
        """Delete the lock file where it is still the one held (not one a person or another host made
        in its place), then let the lock go (a process that opened it meanwhile opens it again)."""
        if self._fd is not None:
            if _same_file(self._fd, self.path):
                with contextlib.suppress(FileNotFoundError):  # (its folder removed meanwhile)
                    os.unlink(self.path)
            os.close(self._fd)
            self._fd = None


def _same_file(fd: int, path: str) -> bool:
    """Whether open file ``fd`` is the file at ``path`` still."""
    try:
        found, held = os.lstat(path), os.fstat(fd)
    except FileNotFoundError:
        return False
    return (found.st_dev, found.st_ino) == (held.st_dev, held.st_ino)


def has_lock_file(folder: str) -> bool:
    return os.path.lexists(os.path.join(folder, LOCK_FILE))


def owner(path: str, wait_s: float = 0.0) -> tuple[str, int] | None:
    """The host and process id that lock file ``path`` names; None where it names none (no lock file,
    one being made, or not ours), after waiting up to ``wait_s`` seconds for one being made (its
    holder locks it, then writes its name) to name its holder."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            with open(path, encoding="utf-8", errors="replace") as lock:
                host, pid = lock.read(4096).split()
            return host, int(pid)
        except (OSError, ValueError):
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.02)


def abandoned(folder: str) -> bool:
    """Whether local ``folder`` is this user's and its lock file (a regular file, not a link) is held
    by no process and, on a network file system (which may lock per machine only), names this
    host; on a local one a free lock is a dead process's whatever host it names (a container
    restarted with another hostname on the same volume). A folder
    being made (its lock file empty), another user's, another host's, one without a lock file, or
    one this process holds is not."""
    if folder in _HELD:
        return False
    try:
        if not _mine(os.lstat(folder), stat.S_ISDIR):
            return False
        lock = os.open(os.path.join(folder, LOCK_FILE), os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:  # no lock file (made where nothing locks), a link, or removed meanwhile
        return False
    try:
        if not _mine(os.fstat(lock), stat.S_ISREG):
            return False
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        owner = os.read(lock, 4096).decode(errors="replace").split()
        return bool(owner) and (owner[0] == socket.gethostname() or not network_fs(folder))
    except OSError:  # held: its process goes on
        return False
    finally:
        os.close(lock)


LOCAL_FS = {"ext2", "ext3", "ext4", "xfs", "btrfs", "zfs", "f2fs", "bcachefs", "jfs", "reiserfs", "tmpfs", "ramfs",
            "overlay", "vfat", "exfat", "ntfs", "ntfs3", "hfsplus", "apfs"}
"""File systems of this machine's own disks and memory: a lock one process holds there, every
process of the machine sees. Any other (NFS, Lustre, a FUSE mount of a bucket, virtiofs, a cluster
file system, one not known here) is taken to be shared with other machines."""


def network_fs(folder: str) -> bool:
    """Whether ``folder`` lies on a file system that other machines may share (by ``/proc/self/mounts``:
    the type of the deepest mount point above it, not one of :data:`LOCAL_FS`); where that cannot be
    told, it is taken to."""
    try:
        with open("/proc/self/mounts", encoding="utf-8", errors="replace") as mounts:
            table = [line.split()[1:3] for line in mounts if len(line.split()) > 2]
    except OSError:
        return True
    path = os.path.realpath(folder)
    found = [(point.replace("\\040", " "), kind) for point, kind in table
             if path == point.replace("\\040", " ") or path.startswith(point.replace("\\040", " ").rstrip("/") + "/")]
    return not found or max(found, key=lambda pair: len(pair[0]))[1] not in LOCAL_FS


def _mine(info: os.stat_result, kind: Callable[[int], bool]) -> bool:
    return kind(info.st_mode) and info.st_uid == os.geteuid()
