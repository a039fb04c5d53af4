"""Size-bounded log files of the stack's child processes.

Each component writes its stdout and stderr to ``<log_dir>/<name>.log``, a file it holds open in
append mode (``O_APPEND``) for as long as it runs. Such a file cannot be renamed from under the
process (it would go on writing to the renamed file), so it is rotated by copy and truncate:
``name.log`` is copied to ``name.log.1`` (the older copies shifted up to ``name.log.<keep>``,
the oldest dropped) and then cut to nothing in place; every later write of the process lands at
the new end. A line written between the copy and the cut is lost, a window of one file copy.
"""

import shutil
from pathlib import Path

#: A component's log is rotated past this size, and this many older copies are kept (as the
#: embedded broker's ``server.log``: ``infra/kafka/log4j2.properties``).
MAX_LOG_BYTES = 50 * 2**20
LOG_BACKUPS = 3


def rotate(path: Path, max_bytes: int = MAX_LOG_BYTES, keep: int = LOG_BACKUPS) -> bool:
    """Rotate ``path`` if it has grown past ``max_bytes``; return whether it was."""
    try:
        if path.stat().st_size <= max_bytes:
            return False
    except FileNotFoundError:
        return False
    for i in range(keep - 1, 0, -1):
        older = path.with_name(f"{path.name}.{i}")
        if older.exists():
            older.replace(path.with_name(f"{path.name}.{i + 1}"))
    if keep > 0:
        shutil.copyfile(path, path.with_name(f"{path.name}.1"))
    with open(path, "r+b") as log:
        log.truncate(0)
    return True
