"""``sim --json`` checks, before the run, the write the report is made with: a new file
beside the file (``infra.paths.temp_beside``), renamed over it
(``infra.paths.write_atomically``), beside the file a link names where ``--json`` is a link.
Before, it checked the link's own folder: a link to a writable file in a folder that takes no
new file passed, the whole run ran, and its report was lost after it (``cannot write --json
link.json: Operation not permitted``); written in place through the link, as before 7 Dec's
atomic write, it was not. (The file itself given, its folder was checked and refused already:
kept here so that it stays so.)

The folder that takes no new file is made immutable (``chattr +i``): as root, the tests' usual
user, a folder's mode does not stop a new file, and the file in it stays writable."""

import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from infra.cli import app
from infra.traces import TraceRequest, write_governor_jsonl
from schemas.errors import GovernorError


@pytest.fixture
def closed_folder(tmp_path: Path):
    """A folder holding a writable ``report.json`` that takes no new file."""
    folder = tmp_path / "shared"
    folder.mkdir()
    (folder / "report.json").write_text("{}\n")
    made = subprocess.run(["chattr", "+i", str(folder)], capture_output=True)
    if made.returncode != 0:
        pytest.skip(f"chattr +i is refused here: {made.stderr.decode().strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["chattr", "-i", str(folder)], check=True)


@pytest.mark.parametrize("through_a_link", [False, True], ids=["the-file", "a-link-to-it"])
def test_a_report_its_folder_takes_no_new_file_for_is_refused_before_the_run(
        tmp_path: Path, closed_folder: Path, through_a_link: bool):
    trace = tmp_path / "t.jsonl"
    write_governor_jsonl([TraceRequest(arrival_s=i * 0.5, prompt_tokens=300, output_tokens=20)
                          for i in range(4)], trace)
    report = closed_folder / "report.json"
    given = report
    if through_a_link:
        given = tmp_path / "link.json"
        given.symlink_to(report)
    result = CliRunner().invoke(app, ["sim", str(trace), "--json", str(given), "--no-progress"])
    assert isinstance(result.exception, GovernorError)
    assert str(result.exception) == f"--json {closed_folder}: not writable"
    assert '"requests"' not in result.stdout  # refused before the run, not after it
    assert report.read_text() == "{}\n"


def test_a_device_is_checked_in_place(tmp_path: Path):
    """``--json /dev/null`` or a terminal's ``/dev/stdout`` is written in place: no file is made
    beside it to be renamed, and none is checked there."""
    from infra.paths import writable_report

    writable_report("--json", Path("/dev/null"))
    assert not list(Path("/dev").glob("*null*.tmp"))
