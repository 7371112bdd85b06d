"""Write a plan's files into an output folder so that the folder always holds exactly one plan and
never costs the user a file.

- **Manifest.** ``.planner-manifest.json`` names every file planner wrote there and its SHA-256.
  A file is planner's only while the manifest lists it and its content is unchanged; anything else
  at a planner file name (the user's own ``deepspeed_config.json``, an edited ``PLAN.md``, a
  symlink, a directory) is the user's. Without ``force`` any of them refuses the write; with it,
  planner's files are replaced or removed, and the user's are kept: named in the result when the
  new plan does not need the name, refused (nothing written) when it does.
- **No redirection.** New content goes to a fresh private staging folder inside the output folder
  (``tempfile.mkdtemp``: a random name, created exclusively, mode 0700), each file opened with
  ``O_CREAT | O_EXCL | O_NOFOLLOW``. It enters the folder by ``os.link`` (fails when anything,
  a planted symlink included, holds the name; never follows one) after planner's old file, if
  any, was moved aside. Any failure puts every moved file back: the folder is as it was.
- **One writer.** The output folder itself is locked (``flock`` on its descriptor, no lock file)
  for the whole check-and-replace, so two planners writing one folder take turns; the second sees
  the first one's plan (and, without ``force``, refuses).
- **A killed writer.** A writer killed mid-write (``kill -9``, a power cut aside) released its
  lock and left its staging folder. The next writer of the folder, under the lock, finishes that
  write when its staged manifest exists (the manifest is staged after every file and before any
  old file moves: each new file placed, each of planner's old files the plan drops removed) and
  otherwise removes the staging folder (nothing had moved): the folder holds the old plan or the
  new one, whole, and then the new write runs.
"""

import errno
import hashlib
import json
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from planner import __version__
from planner.core.errors import PlannerInputError

MANIFEST = ".planner-manifest.json"
MANIFEST_MAX_BYTES = 1 << 20
#: How long a writer waits for another one writing the same folder before it gives up (seconds).
LOCK_WAIT_SECONDS = 60.0
_OPEN_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


@dataclass
class Written:
    """What a write did: the files it wrote, and the user's files it left where they were."""

    paths: list[Path] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)  # "NAME (why)"


def digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def present(out: Path, name: str) -> bool:
    """Anything at ``out/name``: a file, a directory, a symlink (a dangling one too)."""
    return os.path.lexists(out / name)


def read_manifest(out: Path) -> dict[str, str]:
    """name -> digest of the files planner wrote in ``out`` ({} when there is no readable manifest:
    then no file there counts as planner's)."""
    path = out / MANIFEST
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return {}
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return {}
        data = json.loads(os.read(fd, MANIFEST_MAX_BYTES + 1)[:MANIFEST_MAX_BYTES])
        files = data.get("files") if isinstance(data, dict) else None
        return {k: v for k, v in files.items() if isinstance(k, str) and isinstance(v, str)} if isinstance(files, dict) else {}
    except (OSError, ValueError, RecursionError):
        return {}
    finally:
        os.close(fd)


def owned(out: Path, name: str, manifest: dict[str, str]) -> bool:
    """``out/name`` is a regular file (not a link) planner wrote and nobody changed since."""
    if name not in manifest:
        return False
    try:
        fd = os.open(out / name, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return False
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > 64 * MANIFEST_MAX_BYTES:
            return False
        with os.fdopen(os.dup(fd), "rb") as f:
            return digest(f.read()) == manifest[name]
    except OSError:
        return False
    finally:
        os.close(fd)


class _FolderLock:
    """An exclusive ``flock`` on the folder's own descriptor, waited for up to LOCK_WAIT_SECONDS
    (no-op where the platform has no flock)."""

    def __init__(self, folder: Path):
        self.folder, self.fd = folder, None

    def __enter__(self):
        try:
            import fcntl
        except ImportError:  # (not POSIX: no lock)
            return self
        self.fd = os.open(self.folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        deadline = time.monotonic() + LOCK_WAIT_SECONDS
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return self
            except BlockingIOError:
                if time.monotonic() > deadline:
                    os.close(self.fd)
                    raise PlannerInputError(f"another planner has been writing to {self.folder} for "
                                            f"{LOCK_WAIT_SECONDS:.0f} s", hint="Try again when it is done.") from None
                time.sleep(0.05)

    def __exit__(self, *exc):
        if self.fd is not None:
            os.close(self.fd)  # (closing releases the flock)


def _refusal(out: Path, names: list[str], force: bool, manifest: bool = True) -> PlannerInputError:
    if not force:
        return PlannerInputError(f"{out} already has {', '.join(names)}", hint="Pass --force to overwrite them.")
    older = "" if manifest else (f" ({out} has no {MANIFEST}: files an older planner wrote there count as yours; "
                                 "delete them if they are planner's)")
    return PlannerInputError(
        f"{out} has {', '.join(names)}, which planner did not write (or which changed since): --force replaces "
        "only planner's own files",
        hint=f"Move them away, or write the plan to another --out{older}.")


def _bytes(content: str | bytes) -> bytes:
    return content.encode("utf-8") if isinstance(content, str) else content


def _stage(staging: Path, name: str, content: str | bytes) -> None:
    mode = 0o755 if name.endswith(".sh") else 0o644
    fd = os.open(staging / name, _OPEN_NEW, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(_bytes(content))
    os.chmod(staging / name, mode)  # (the umask may have narrowed it)


def _place(source: Path, target: Path) -> None:
    """``source`` at ``target``, which must be free: a hard link never replaces or follows anything
    there; where the file system has no hard links, a rename after an lstat check."""
    try:
        os.link(source, target, follow_symlinks=False)
    except OSError as e:
        if e.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK) or os.path.lexists(target):
            raise
        os.rename(source, target)


def write_files(files: Mapping[str, str | bytes], out: Path, force: bool, plan_names: tuple[str, ...],
                replace_own: bool = False) -> Written:
    """Write ``files`` (name -> text or bytes) into ``out`` as one plan (module docstring); ``plan_names``:
    every file name a plan of planner's may have (the old plan's files are among them);
    ``replace_own``: planner's own unchanged files are replaced without ``force`` (a resumed tune
    rewrites the plan it wrote; anything else there still needs ``force``)."""
    if os.path.lexists(out) and not out.is_dir():
        raise PlannerInputError(f"--out {out} is a file, not a directory", hint="Pass a folder for the plan's files.")
    made = [p for p in (out, *out.parents) if not os.path.lexists(p)]  # the folders this write creates
    try:
        out.mkdir(parents=True, exist_ok=True)
        with _FolderLock(out):
            return _write_locked(files, out, force, plan_names, replace_own)
    except (OSError, PlannerInputError) as e:
        for folder in made:  # a failed write leaves no folder of its own behind
            try:
                folder.rmdir()
            except OSError:
                break
        if isinstance(e, PlannerInputError):
            raise
        raise PlannerInputError(f"cannot write to {out}: {e.strerror or e}", hint="Check the folder and its "
                                "permissions; nothing was changed there.") from None


STAGING_PREFIX = ".planner-staging-"


def _recover(out: Path) -> None:
    """Finish, or undo, the writes of writers killed in this folder (module docstring); called
    under the folder's lock, so every staging folder there is a dead writer's."""
    for staging in sorted(out.glob(STAGING_PREFIX + "*")):
        if staging.is_symlink() or not staging.is_dir():
            continue
        new = read_manifest(staging)
        if new:
            old = read_manifest(staging / "old") or read_manifest(out)
            for name in sorted(set(new) | set(old)):
                if name in new and owned(out, name, new):
                    continue
                if present(out, name) and owned(out, name, old):
                    os.unlink(out / name)  # the old plan's file, not yet moved aside
                if name in new and not present(out, name) and owned(staging, name, new):
                    _place(staging / name, out / name)
            if present(out, MANIFEST) and read_manifest(out) != new and (out / MANIFEST).is_file():
                os.unlink(out / MANIFEST)
            if not present(out, MANIFEST) and (staging / MANIFEST).is_file():
                _place(staging / MANIFEST, out / MANIFEST)
        shutil.rmtree(staging, ignore_errors=True)


def recover(out: Path) -> None:
    """``_recover`` under the folder's lock (a live writer there is waited for, not undone)."""
    with _FolderLock(out):
        _recover(out)


def _write_locked(files: Mapping[str, str | bytes], out: Path, force: bool, plan_names: tuple[str, ...],
                  replace_own: bool = False) -> Written:
    _recover(out)
    names = sorted(set(plan_names) | set(files) | {MANIFEST})
    there = [n for n in names if present(out, n)]
    manifest = read_manifest(out)
    ours = {n for n in there if n != MANIFEST and owned(out, n, manifest)}
    if there and not force and not (replace_own and set(there) - {MANIFEST} <= ours):
        raise _refusal(out, [n for n in there if n != MANIFEST] or there, force)
    if MANIFEST in there and ((out / MANIFEST).is_symlink() or not (out / MANIFEST).is_file()):
        raise _refusal(out, [MANIFEST], force)
    blocking = [n for n in there if n != MANIFEST and n not in ours and n in files]
    if blocking:
        raise _refusal(out, blocking, force, manifest=MANIFEST in there)
    result = Written(kept=[f"{n} (not written by planner, or changed since)" for n in there
                           if n != MANIFEST and n not in ours])
    new_manifest = {"written_by": f"planner {__version__}",
                    "files": {n: digest(_bytes(content)) for n, content in sorted(files.items())}}
    staging = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=out))
    moved: list[str] = []  # planner's old files moved into staging/old/
    placed: list[str] = []
    try:
        for name, text in files.items():
            _stage(staging, name, text)
        _stage(staging, MANIFEST, json.dumps(new_manifest, indent=2) + "\n")
        (staging / "old").mkdir()
        for name in sorted(ours | ({MANIFEST} & set(there))):
            os.rename(out / name, staging / "old" / name)
            moved.append(name)
        for name in [*files, MANIFEST]:
            _place(staging / name, out / name)
            placed.append(name)
    except OSError:
        for name in placed:
            os.unlink(out / name)
        for name in moved:
            _place(staging / "old" / name, out / name)
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    result.paths = [out / n for n in files]
    return result
