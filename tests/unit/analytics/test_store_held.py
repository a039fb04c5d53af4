"""An embedded store another process runs is refused at once, with what to do (a second sink on
one ``--data-dir`` used to retry for ever). Both engines run in processes of their own: a real
chdb each, as two sinks would."""

import subprocess
import sys
from pathlib import Path

#: Opens the namespace's embedded store under argv[1], says so, and holds it until stdin closes
#: (or says why it could not).
OPEN = """
import sys
from pathlib import Path
from analytics.store import Store, StoreLocation
try:
    store = Store.open(StoreLocation.for_namespace("held", Path(sys.argv[1])))
except Exception as exc:
    print(type(exc).__name__, exc, flush=True)
else:
    print("opened", flush=True)
    sys.stdin.read()
"""


def _open(data_dir: Path, stderr=subprocess.DEVNULL) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", OPEN, str(data_dir)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=stderr, text=True,
                            cwd=Path(__file__).resolve().parents[3])


def test_a_store_another_process_holds_is_refused_with_what_to_do(tmp_path: Path) -> None:
    holder = _open(tmp_path)
    try:
        assert holder.stdout.readline().strip() == "opened"
        second = _open(tmp_path, stderr=subprocess.PIPE)
        said, printed = second.communicate(timeout=120)
        assert "Cannot lock" not in printed  # refused before the engine tried (and printed so)
        assert said.startswith("StoreHeld another process holds the analytics store at "
                               f"{tmp_path / 'chdb'}"), said
        assert "stop it first, or query it through the SQL endpoint" in said
    finally:
        holder.communicate(timeout=120)  # (stdin closed: it lets go)
    third = _open(tmp_path)  # free again: it opens
    assert third.stdout.readline().strip() == "opened"
    third.communicate(timeout=120)


#: Opens the store under argv[1] and, while the engine is open but its open call has not
#: returned, opens it again in the same process (as a second sink's thread does).
OPEN_TWICE = """
import sys
from pathlib import Path
import clickhouse_connect
from analytics.store import Store, StoreLocation
location = StoreLocation.for_namespace("twice", Path(sys.argv[1]))
real, second = clickhouse_connect.get_client, []
def opening(**options):
    client = real(**options)
    if not second:
        second.append("opening")
        try:
            Store.open(location).close()
            second.append("opened")
        except Exception as exc:
            second.append(type(exc).__name__)
    return client
clickhouse_connect.get_client = opening
Store.open(location).close()
print(second[-1], flush=True)
"""


def test_a_store_this_process_is_opening_is_not_taken_for_one_another_holds(tmp_path: Path):
    """Two sinks of one process opened it at once: the second found the engine's lock, its own
    process's, and was refused (from a full test run, 5 Dec)."""
    said = subprocess.run([sys.executable, "-c", OPEN_TWICE, str(tmp_path)], capture_output=True,
                          text=True, timeout=120, cwd=Path(__file__).resolve().parents[3])
    assert said.stdout.strip() == "opened", said.stdout + said.stderr[-2000:]
