"""``infra.paths``: where a command will write, checked before it runs."""

import os
from pathlib import Path

import pytest

from infra.paths import writable_dir, writable_file
from schemas.errors import GovernorError


def test_a_file_that_cannot_be_written_over_is_refused_before_the_run(tmp_path: Path, monkeypatch):
    """``sim --json`` or ``demo --json`` naming an existing file the user may not write
    (another user's): before, only its folder was checked, and the file was found unwritable
    after the run (``cannot write --json ...: Permission denied``). ``workload build --out``
    writes a new file and renames it over the old one: only the folder counts there."""
    out = tmp_path / "report.json"
    out.write_text("{}")
    writable_file("--json", out)  # writable: no error
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == out and mode & os.W_OK
                        else real(p, mode))  # (root may write any file: as another user would)
    with pytest.raises(GovernorError, match=rf"^--json {out}: not writable$"):
        writable_file("--json", out)
    writable_file("--json", tmp_path / "new.json")  # a new file in a writable folder: fine
    writable_file("--out", out, renamed=True)  # replaced, not written to: fine


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="no /proc")
@pytest.mark.parametrize("renamed", [False, True])
def test_a_folder_where_no_file_can_be_made_is_refused_before_the_run(renamed: bool):
    """``sim --json /proc/sim.json``: ``os.access`` says root may write in ``/proc``, so before
    the check passed and the run's report was lost after it (``cannot write --json
    /proc/sim.json: No such file or directory``). A new file is now made and removed to find
    out (``workload build --out``: its ``.tmp``)."""
    with pytest.raises(GovernorError, match=r"^--json /proc(/governor-test\.json)?: cannot write "
                                            "there"):
        writable_file("--json", Path("/proc/governor-test.json"), renamed=renamed)


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="no /proc")
def test_a_folder_that_takes_no_file_is_refused_before_the_run():
    """``bench --out /proc`` (root): the folder exists and ``os.access`` says it may be written,
    so before, every run of the bench ran and the report was then lost."""
    with pytest.raises(GovernorError, match=r"^--out /proc: cannot write there"):
        writable_dir("--out", Path("/proc"))


def test_a_file_name_too_long_is_refused_before_the_run(tmp_path: Path):
    """A writable folder, but a name past the file system's 255 bytes: before, the run ran
    and its report could not be written (``File name too long``)."""
    with pytest.raises(GovernorError, match=r"cannot write there: File name too long"):
        writable_file("--json", tmp_path / ("r" * 300 + ".json"))


def test_the_check_leaves_no_file_behind(tmp_path: Path):
    for renamed in (False, True):
        writable_file("--out", tmp_path / "w.jsonl", renamed=renamed)
    assert list(tmp_path.iterdir()) == []


def test_a_file_that_opens_but_takes_no_byte_is_refused_before_the_run(tmp_path: Path):
    """A new file that can be made but not written to (a full file system; here a file size
    limit of 0, which refuses the write as a full disk does): before, the file was only made
    and removed, the run ran, and its report could not be written (``File too large``). A
    byte is now written to the probe. (Python ignores SIGXFSZ: the write fails, EFBIG.)"""
    import resource
    import subprocess
    import sys

    out = tmp_path / "sim.json"
    check = ("from pathlib import Path\nfrom infra.paths import writable_file, writable_dir\n"
             "from schemas.errors import GovernorError\n"
             f"for check, path in ((writable_file, {str(out)!r}), (writable_dir, {str(tmp_path)!r})):\n"
             "    try:\n        check('--json', Path(path))\n        print('passed')\n"
             "    except GovernorError as exc:\n        print(exc)\n")
    done = subprocess.run(
        [sys.executable, "-c", check], capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[3])},
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0)))
    assert done.stdout.splitlines() == [  # (the file's folder is probed first: it is named)
        f"--json {tmp_path}: cannot write there: File too large"] * 2, done.stderr
    assert list(tmp_path.iterdir()) == []  # the probes removed


def test_a_report_whose_write_fails_leaves_the_previous_one_whole(tmp_path: Path):
    """``sim --json`` or ``demo --json`` over the report of an earlier run, on a file system
    that fills up midway (here a file size limit of 64 bytes): before, the file was truncated
    and written in place, so it held the first 64 bytes of the new report, neither report.
    It is now written beside and renamed into place: the earlier report stays whole."""
    import resource
    import subprocess
    import sys

    out = tmp_path / "sim.json"
    out.write_text('{"run": "earlier"}\n')
    write = ("from pathlib import Path\nfrom infra.paths import print_report\n"
             "from schemas.errors import GovernorError\n"
             "try:\n"
             f"    print_report('{{\"run\": \"' + 'x' * 1000 + '\"}}', Path({str(out)!r}))\n"
             "except GovernorError as exc:\n    print(exc)\n")
    done = subprocess.run(
        [sys.executable, "-c", write], capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[3])},
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (64, 64)))
    assert done.stdout.splitlines()[-1] == f"cannot write --json {out}: File too large", done
    assert out.read_text() == '{"run": "earlier"}\n'
    assert list(tmp_path.iterdir()) == [out]  # no .tmp left behind


def test_a_report_to_a_pipe_or_through_a_link_is_written_there(tmp_path: Path, capsys):
    """The report is renamed into place only where the path is a regular file or none: a
    pipe (``--json /dev/stdout`` piped on) is written in place, not replaced by a file, and
    a link to a file has its file written, the link kept."""
    from infra.paths import print_report

    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    reader = os.open(pipe, os.O_RDONLY | os.O_NONBLOCK)  # (so that opening it to write does
    try:                                                 # not wait for a reader)
        print_report('{"run": 1}', pipe)
        assert pipe.is_fifo() and os.read(reader, 100) == b'{"run": 1}\n'
    finally:
        os.close(reader)
    target, link = tmp_path / "reports" / "sim.json", tmp_path / "latest.json"
    target.parent.mkdir()
    target.write_text("{}")
    link.symlink_to(target)
    print_report('{"run": 2}', link)
    assert link.is_symlink() and target.read_text() == '{"run": 2}\n'
    assert sorted(p.name for p in target.parent.iterdir()) == ["sim.json"]
    assert capsys.readouterr().out == '{"run": 1}\n{"run": 2}\n'


def test_two_runs_writing_one_report_at_once_each_write_it_whole(tmp_path: Path, monkeypatch):
    """Two runs given the same ``--json``, the second writing while the first renames: before,
    both wrote ``<file>.tmp``; the second's rename took the first's file and removed the name,
    and the first's rename failed (``No such file or directory``), or renamed the other's text
    half written. Each now writes a file of its own beside the report: the last rename wins."""
    from infra.paths import write_atomically

    out = tmp_path / "sim.json"
    rename = os.replace
    writes = ['{"run": 2}\n']

    def second_run_writes_meanwhile(src, dst):
        if writes:
            write_atomically(out, writes.pop())
        rename(src, dst)

    monkeypatch.setattr(os, "replace", second_run_writes_meanwhile)
    write_atomically(out, '{"run": 1}\n')
    assert out.read_text() == '{"run": 1}\n'  # the last renamed, whole
    assert list(tmp_path.iterdir()) == [out]  # neither run's own file left behind


def test_a_report_gets_the_mode_a_new_file_gets(tmp_path: Path):
    """The file renamed into place is made as ``write_text`` makes one, its mode the umask's
    (``tempfile.mkstemp`` would make it 0600: a report no one else could read)."""
    from infra.paths import write_atomically
    from infra.traces import TraceRequest, write_governor_jsonl

    umask = os.umask(0o027)
    try:
        write_atomically(tmp_path / "sim.json", "{}\n")
        write_governor_jsonl([TraceRequest(arrival_s=0, prompt_tokens=1, output_tokens=1)],
                             tmp_path / "w.jsonl")
    finally:
        os.umask(umask)
    assert {p.name: p.stat().st_mode & 0o777 for p in tmp_path.iterdir()} == {
        "sim.json": 0o640, "w.jsonl": 0o640}


def test_a_name_the_writers_own_file_cannot_have_is_refused_before_the_run(tmp_path: Path):
    """The check of a file renamed into place makes a file named as the writer's own
    (``temp_beside``): a name that fits but whose writer's file would not (past 255 bytes) is
    refused before the run, not found after it."""
    from infra.paths import write_atomically

    out = tmp_path / ("r" * 245 + ".json")  # 250 bytes: its writer's file's name, 268
    with pytest.raises(GovernorError, match=r"cannot write there: File name too long"):
        writable_file("--json", out, renamed=True)
    with pytest.raises(OSError, match=r"File name too long"):
        write_atomically(out, "{}\n")
