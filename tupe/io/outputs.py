"""The output policy of every command that writes: tupe writes over or deletes only what it wrote itself.

`tupe_files.json` in an output folder records every name tupe wrote at the top of that folder and which command
wrote it (`{"format": 1, "files": [...], "owners": {name: "tupe glue"}}`); a name is added *before* it is written,
so a kill never leaves an unrecorded file of tupe's. Before any work a command `claim`s the names it will write:
an existing entry that is not its own (a user's README.md, a file another tupe command wrote, a symbolic link tupe
never makes) stops it in one line naming the entry. Removal (`remove`) only touches entries this command owns, and
never follows a symbolic link: no path component below the output folder may be a link, so nothing outside it is
ever deleted. `tupe pretrain`'s run folder (`tupe/training/run_folder.py`) keeps its record in the same file, the
owner of names recorded without one.

Output *files* named by the user (`tupe evaluate --json FILE`, `tupe plot --out FILE`) follow the same rule, with
the record in the file's folder: a file tupe wrote there is replaced, anyone else's is refused.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import stat
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from tupe.errors import TupeError
from tupe.io.files import atomic_write_json
from tupe.io.reading import RECORD_LIMIT, Refused, read_json

RECORD_NAME = "tupe_files.json"
RECORD_FORMAT = 1
LEGACY_OWNER = "tupe pretrain"  # records written before owners were recorded were all pretrain's
LOCK_NAMES = (".lock", ".lock.info")
# atomic_write_*'s temporary file of NAME: ".NAME.tupe-XXXXXXXX.tmp" (mkstemp's 8 random characters), a name no
# other program makes, so a user's ".README.md.draft.tmp" is never taken for tupe's
TEMP_OF = re.compile(r"^\.(?P<name>.+)\.tupe-[a-z0-9_]{8}\.tmp$")
# the record's own lock file and temp files are part of the record
_RECORD_SELF = re.compile(r"^\.tupe_files\.json(\.tupe-[a-z0-9_]{8}\.tmp|\.lock(\.info)?)$")


def read_record(folder: str | os.PathLike) -> dict[str, str] | None:
    """{name: owning command} from `folder/tupe_files.json`; None where there is no readable record.

    A record that is not a regular file (a FIFO) or is absurdly large is refused (a `TupeError` naming it): it
    would otherwise block or exhaust memory. A record of the wrong shape counts as none."""
    path = Path(folder) / RECORD_NAME
    if not os.path.lexists(path):
        return None
    try:
        data = read_json(path, "record of tupe's files", RECORD_LIMIT, expect=dict)
    except Refused:
        raise
    except TupeError:
        return None
    names, owners = data.get("files"), data.get("owners") or {}
    if (
        not isinstance(names, list)
        or not all(isinstance(n, str) for n in names)
        or not isinstance(owners, dict)
    ):
        return None
    return {n: owners[n] if isinstance(owners.get(n), str) else LEGACY_OWNER for n in names}


def write_record(folder: str | os.PathLike, record: dict[str, str]) -> None:
    names = sorted(record)
    atomic_write_json(
        Path(folder) / RECORD_NAME,
        {"format": RECORD_FORMAT, "files": names, "owners": {n: record[n] for n in names}},
    )


@contextlib.contextmanager
def _record_locked(folder: Path) -> Iterator[None]:
    """An OS lock on the folder itself while its record is read, changed and written back (two commands writing
    different files of one folder must not lose each other's entries); a no-op where folders cannot be locked."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        yield
        return
    try:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the flock


def update_record(folder: str | os.PathLike, add: dict[str, str] = {}, drop: Iterable[str] = ()) -> None:  # noqa: B006
    """Add {name: owner} and drop names in the record of `folder` (made if missing), under the folder's lock."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    with _record_locked(folder):
        record = read_record(folder) or {}
        new = {n: o for n, o in record.items() if n not in set(drop)} | dict(add)
        if new != record or not (folder / RECORD_NAME).is_file():
            write_record(folder, new)


class OutputFolder:
    """What one command may write and delete in one output folder (see the module docstring).

    `legacy`: for a folder without a record (written by a tupe that kept none), a test telling whether an existing
    entry is this command's by its content (a GLUE `results.json` that parses as one); without it, nothing there
    is taken for the command's."""

    def __init__(
        self,
        folder: str | os.PathLike,
        command: str,
        flag: str = "--out",
        legacy: Callable[[Path], bool] | None = None,
    ) -> None:
        self.folder = Path(folder)
        self.command = command
        self.flag = flag
        self.legacy = legacy
        self._record = read_record(self.folder) if self.folder.is_dir() else None

    # ------------------------------------------------------------------ who owns what
    def owner(self, name: str) -> str | None:
        """The command that wrote the top-level entry `name`, or None (a user's file, or unknown)."""
        if self._record is not None:
            if name in self._record:
                return self._record[name]
            m = TEMP_OF.match(name)
            if m and (m["name"] in self._record or m["name"] == RECORD_NAME):
                return self._record.get(m["name"], self.command)
            return None
        if (
            self.legacy is not None
            and os.path.lexists(self.folder / name)
            and self.legacy(self.folder / name)
        ):
            return self.command
        return None

    def owns(self, name: str) -> bool:
        return self.owner(name) == self.command

    def foreign(self) -> list[str]:
        """Entries at the top of the folder that this command did not write (kept by any cleaning)."""
        if not self.folder.is_dir():
            return []
        return sorted(
            p.name
            for p in self.folder.iterdir()
            if p.name not in (*LOCK_NAMES, RECORD_NAME)
            and not _RECORD_SELF.match(p.name)
            and not self.owns(p.name)
        )

    # ------------------------------------------------------------------ writing
    def _refusal(self, name: str, why: str) -> TupeError:
        return TupeError(
            f"{self.flag} {self.folder} holds {name!r}, {why}; `{self.command}` would write over it: "
            f"move it away or choose another {self.flag}"
        )

    def check(self, *names: str) -> None:
        """Refuse (one line naming the entry) if any of `names` exists and is not this command's, or is a
        symbolic link (tupe never makes one, so it is the user's and may point anywhere)."""
        for name in names:
            path = self.folder / name
            if not os.path.lexists(path):
                continue
            who = self.owner(name)
            if who is None:
                raise self._refusal(name, "which tupe did not write")
            if who != self.command:
                raise self._refusal(name, f"which `{who}` wrote")
            if path.is_symlink():
                raise self._refusal(name, "a symbolic link tupe did not make")

    def claim(self, *names: str) -> None:
        """`check` the names, then record them as this command's before anything is written."""
        self.check(*names)
        self.folder.mkdir(parents=True, exist_ok=True)
        new = {n: self.command for n in names if (self._record or {}).get(n) != self.command}
        if new or self._record is None:
            if (
                self._record is None and self.legacy is not None
            ):  # adopt what an older tupe of ours wrote here
                new = {p.name: self.command for p in self.folder.iterdir() if self.owns(p.name)} | new
            update_record(self.folder, add=new)
            self._record = read_record(self.folder) or {}

    def path(self, name: str) -> Path:
        """`folder/name` claimed for writing."""
        self.claim(name)
        return self.folder / name

    # ------------------------------------------------------------------ deleting
    def remove(self, relpath: str | os.PathLike) -> None:
        """Delete `folder/relpath` (a file or a whole folder) if its top-level entry is this command's. No
        component below `folder` may be a symbolic link (a refusal naming it), so nothing outside is touched."""
        rel = Path(relpath)
        if rel.is_absolute() or ".." in rel.parts or not rel.parts:
            raise ValueError(f"remove: {relpath} is not a path inside the folder")
        if not self.owns(rel.parts[0]):
            raise self._refusal(rel.parts[0], "which tupe did not write")
        target = self.folder / rel
        current = self.folder
        for part in rel.parts:
            current = current / part
            if current.is_symlink():
                raise TupeError(
                    f"{current} is a symbolic link tupe did not make; tupe does not delete through it "
                    "(it may lead outside --out): remove the link yourself"
                )
        remove_tree(target)


def remove_tree(path: str | os.PathLike) -> None:
    """Delete a file or a folder tree without following any symbolic link (links inside are unlinked, never
    entered); a missing path is fine."""
    path = Path(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path)  # rmtree itself never follows links (it uses fd-based, symlink-safe walking)
    else:
        path.unlink()


def check_file(path: str | os.PathLike, command: str, flag: str) -> Path:
    """Refuse (one line) an output file named by the user that exists and that `command` did not write (a user's
    file, a symbolic link, another tupe command's file); nothing is recorded. Returns the path."""
    path = Path(path).expanduser()
    if not os.path.lexists(path):
        return path
    if path.is_symlink():
        raise TupeError(
            f"{flag} {path} is a symbolic link; tupe does not write through it: give the file itself"
        )
    who = OutputFolder(path.parent, command, flag).owner(path.name)
    if who is None:
        raise TupeError(
            f"{flag} {path} exists and tupe did not write it; tupe does not write over it: "
            "choose another file or move it away"
        )
    if who != command:
        raise TupeError(
            f"{flag} {path} was written by `{who}`; `{command}` does not write over it: choose another file"
        )
    return path


def claim_file(path: str | os.PathLike, command: str, flag: str) -> Path:
    """`check_file`, then record the file in its folder's `tupe_files.json` as `command`'s, before it is written."""
    path = check_file(path, command, flag)
    if OutputFolder(path.parent, command, flag).owner(path.name) != command:
        update_record(path.parent, add={path.name: command})
    return path
