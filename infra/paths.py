"""Where the commands write: checked before a run starts, so a bad path costs no run."""

import os
import secrets
from pathlib import Path

from schemas.errors import GovernorError


def writable_dir(option: str, path: Path) -> None:
    """Create ``path`` if need be; an error naming ``option`` if it cannot be written."""
    _no_file_above(option, path, path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise GovernorError(f"{option} {path}: cannot create it: {exc.strerror or exc}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise GovernorError(f"{option} {path}: not writable")
    _can_create(option, path, path / f".governor-write-check-{os.getpid()}")


def writable_file(option: str, path: Path, renamed: bool = False) -> None:
    """An error naming ``option`` unless a file can be written at ``path`` (its folder is made
    now if need be). ``renamed``: the writer writes a new file beside it (``temp_beside``) and
    renames it into place, so an existing file need not be writable, only its folder (a name of
    that form is checked: longer than ``path``'s, it fits where the writer's will). A new file
    is made and removed to find out (``os.access`` tells root that ``/proc`` or a read-only
    mount is writable, and a name may be too long where its folder is writable)."""
    try:
        if path.is_dir():
            raise GovernorError(f"{option} {path} is a folder; give a file name")
        _no_file_above(option, path, path.parent)
        writable_dir(option, path.parent)
        if renamed:
            _can_create(option, path, temp_beside(path))
        elif not path.exists():
            _can_create(option, path, path)
        elif not os.access(path, os.W_OK):  # another user's
            raise GovernorError(f"{option} {path}: not writable")
    except OSError as exc:  # (a name too long: even is_dir() raises)
        raise GovernorError(f"{option} {path}: cannot write there: {exc.strerror or exc}"
                            ) from None


def writable_report(option: str, path: Path) -> None:
    """An error naming ``option`` unless ``write_atomically`` can write ``path``, checked where
    it writes: in place where ``path`` is there and no regular file (``/dev/stdout``, a pipe),
    else a new file beside the file (``temp_beside``; a link's: beside the file it names),
    renamed over it. ``sim`` and ``demo`` checked it as written in place (as before 7 Dec), a
    link's own folder too: a link to a writable file in a folder that takes no new file passed,
    and the run's report was lost after the run (``cannot write --json link.json: Operation not
    permitted``)."""
    if path.exists() and not path.is_file():
        writable_file(option, path)
    else:
        writable_file(option, path.resolve() if path.is_symlink() else path, renamed=True)


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` as a new file beside it renamed into place (``temp_beside``,
    the name ``writable_file(renamed=True)`` checks), so that the file is never half written: a
    reader, or a run stopped while it writes, finds the text before or the text after; of two
    runs writing it at once, the last to rename wins, whole. A path that is there and no
    regular file (``/dev/stdout``, a pipe) is written in place: renamed over, it would be
    replaced by a file (as root, ``/dev/null`` itself); a link to a file has that file replaced,
    and stays a link."""
    if path.exists() and not path.is_file():
        path.write_text(text)
        return
    path = Path(os.path.realpath(path))
    tmp = temp_beside(path)
    try:
        with open(tmp, "x") as fh:  # (made new, mode per the umask, as write_text's)
            fh.write(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def temp_beside(path: Path) -> Path:
    """A name in ``path``'s folder, ``.<name>.<random>.tmp``, of this writer alone, for the text
    to be written to before it is renamed to ``path``. Before 7 Dec every writer used
    ``<path>.tmp``: of two runs writing the same report at once, one removed the other's (whose
    rename then failed) or renamed its text half written."""
    return path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")


def print_report(text: str, json_out: Path | None) -> None:
    """Print the report ``text`` on stdout, written to ``--json`` ``json_out`` first: a stdout
    whose reader has gone (``... | true``) ends the command at the print, which lost the file
    written after it (``sim`` before 7 Dec, ``demo`` too). Where the file cannot be written, the
    report is printed all the same, and a ``GovernorError`` says why."""
    try:
        if json_out is not None:
            _write_report(json_out, text)
    finally:
        print(text)


def _write_report(path: Path, text: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, text + "\n")  # (a reader never finds half a report)
    except OSError as exc:
        raise GovernorError(f"cannot write --json {path}: {exc.strerror or exc}") from None


def not_the_trace(option: str, path: Path, trace: Path | None) -> None:
    """An error naming ``option`` if ``path`` is the trace file a run reads (the report
    would be written over it)."""
    try:
        same = trace is not None and path.exists() and path.samefile(trace)
    except OSError:  # (the trace is missing: its loader says so)
        same = False
    if same:
        raise GovernorError(f"{option} {path} is the trace itself; the report would be "
                            "written over it: give another file")


def not_the_data(option: str, path: Path, data_dir: Path) -> None:
    """An error naming ``option`` if ``path`` is a file already in ``data_dir``, the folder a
    workload is built from: written over, a file of the data would be lost (before 7 Dec
    ``workload build sharegpt --out`` the ShareGPT CSV replaced it with the workload built
    from it). A new file there is left to the writer."""
    try:
        inside = path.exists() and path.resolve().is_relative_to(data_dir.resolve())
    except OSError:  # (a name too long: nothing there to lose)
        inside = False
    if inside:
        raise GovernorError(f"{option} {path} is a file of the data the workload is built from "
                            f"({data_dir}): it would be written over; give another file")


def _can_create(option: str, given: Path, probe: Path) -> None:
    """An error naming ``option`` and ``given`` unless a new file ``probe`` can be made and a
    byte written to it (a full file system, a quota or a file size limit refuses the write,
    not the open); it is removed at once. An existing file is not probed: a byte written to it
    would change it, or reach a terminal or a pipe's reader (``/dev/full`` is told from
    ``/dev/null`` only by writing to it), so ``--json /dev/full`` fails after the run."""
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:  # (made meanwhile)
        return
    except OSError as exc:
        raise GovernorError(f"{option} {given}: cannot write there: {exc.strerror or exc}"
                            ) from None
    try:
        os.write(fd, b"\n")
    except OSError as exc:
        raise GovernorError(f"{option} {given}: cannot write there: {exc.strerror or exc}"
                            ) from None
    finally:
        os.close(fd)
        probe.unlink(missing_ok=True)


def _no_file_above(option: str, given: Path, folder: Path) -> None:
    """An error naming ``option`` and ``given`` if the nearest of ``folder`` and its parents that
    exists is no folder (``mkdir`` would say only "File exists")."""
    for nearest in (folder, *folder.parents):
        if nearest.exists():
            if not nearest.is_dir():
                where = "" if nearest == given else f": {nearest}"
                raise GovernorError(f"{option} {given}{where} is a file, not a folder")
            return
