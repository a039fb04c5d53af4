"""``governor replay``'s progress: its counts written as its other lines write them."""

import asyncio
import io
import time

from rich.console import Console

from infra import cli


def _progress_printed(monkeypatch, terminal: bool) -> str:
    """What ``_show_progress`` prints of 1,234 sent of 12,345 once it has printed something."""
    out = io.StringIO()
    monkeypatch.setattr(cli, "console", Console(file=out, force_terminal=terminal, width=60))

    async def run() -> None:
        task = asyncio.create_task(cli._show_progress(lambda: 1234, 12_345, "sent",
                                                      every_s=0.01))
        deadline = time.monotonic() + 10
        while not out.getvalue() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)  # polling for the first line, with a deadline
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(run())
    return out.getvalue()


def test_the_plain_progress_line_has_thousands_separators(monkeypatch) -> None:
    # before: "sent 1234/12345", where the command's other lines say "12,345 requests"
    lines = _progress_printed(monkeypatch, terminal=False).splitlines()
    assert lines and set(lines) == {"sent 1,234/12,345"}


def test_the_progress_bar_has_thousands_separators(monkeypatch) -> None:
    printed = _progress_printed(monkeypatch, terminal=True)
    assert "1,234/12,345" in printed and "1234/12345" not in printed
