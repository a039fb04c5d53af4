"""Fetch the jars of an Apache Kafka broker from Maven Central, once per version.

Governor runs a real Kafka broker on the JVM but ships no Kafka binaries. ``install_kafka`` writes
the package's ``pom.xml`` into a work directory and lets Maven copy Kafka's runtime classpath
(plus Log4j 2 and a matching SLF4J 2) into ``<cache root>/kafka/<version>/libs``.

The download goes to a temporary directory next to the final one and is renamed into place only
when Maven succeeded, with a ``.complete`` marker inside, so a half download is never used. Once
the marker is there a second call returns at once, without running Java or Maven.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from importlib import resources
from pathlib import Path

from infra.kafka import BrokerError

logger = logging.getLogger(__name__)

KAFKA_VERSION = "4.4.0"
"""The Kafka release Governor runs (Kafka 4.x needs Java 17 or newer)."""

MIN_JAVA_MAJOR = 17
MARKER = ".complete"
MVN_TIMEOUT_S = 900.0
_JAVA_HINT = "Java 17+ is required to run Kafka; install it, e.g. `apt-get install openjdk-17-jre-headless`"
_MAVEN_HINT = "Maven is required to download Kafka from Maven Central; install it, e.g. `apt-get install maven`"

Which = Callable[[str], str | None]
Run = Callable[..., subprocess.CompletedProcess]


def cache_root() -> Path:
    """Where Governor keeps downloads and broker data: ``$GOVERNOR_HOME`` or ``~/.cache/governor``."""
    home = os.environ.get("GOVERNOR_HOME")
    return Path(home).expanduser() if home else Path.home() / ".cache" / "governor"


def parse_java_major(version_output: str) -> int | None:
    """Read the major version from ``java -version`` output (``"17.0.15"`` -> 17, ``"1.8.0"`` -> 8)."""
    match = re.search(r'version "(\d+)(?:\.(\d+))?', version_output)
    if match is None:
        return None
    major = int(match.group(1))
    if major == 1 and match.group(2) is not None:
        major = int(match.group(2))
    return major


def require_java(*, which: Which = shutil.which, run: Run = subprocess.run) -> str:
    """Return the path of a ``java`` of version 17 or newer, or raise BrokerError saying what to install."""
    java = which("java")
    if java is None:
        raise BrokerError(f"`java` is not on PATH. {_JAVA_HINT}")
    try:
        result = run([java, "-version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        raise BrokerError(f"could not run `{java} -version`: {exc}. {_JAVA_HINT}") from exc
    output = f"{result.stderr or ''}\n{result.stdout or ''}"
    major = parse_java_major(output)
    if major is None:
        raise BrokerError(f"could not read the version of {java} from: {output.strip()[:200]!r}. {_JAVA_HINT}")
    if major < MIN_JAVA_MAJOR:
        raise BrokerError(f"{java} is Java {major}, too old for Kafka {KAFKA_VERSION}. {_JAVA_HINT}")
    return java


def render_pom(version: str) -> str:
    """The packaged ``pom.xml`` with the Kafka version filled in."""
    template = resources.files("infra.kafka").joinpath("pom.xml").read_text(encoding="utf-8")
    return template.replace("${kafka.version}", version)


def _tail(text: str, lines: int = 30) -> str:
    """The last ``lines`` lines of ``text``, without the colour codes Maven emits even with -B."""
    return "\n".join(re.sub(r"\x1b\[[0-9;]*m", "", text).strip().splitlines()[-lines:])


def install_kafka(
    version: str = KAFKA_VERSION,
    *,
    root: Path | None = None,
    progress: Callable[[str], None] = logger.info,
    which: Which = shutil.which,
    run: Run = subprocess.run,
) -> Path:
    """Make sure the jars of Kafka ``version`` are on disk and return their directory.

    The result is ``<root>/kafka/<version>/libs`` (``root`` defaults to :func:`cache_root`). The
    first call needs Java 17+, Maven and a reachable Maven Central; later calls only check the
    marker file. ``which`` and ``run`` stand in for ``shutil.which`` and ``subprocess.run``.
    """
    base = (root if root is not None else cache_root()) / "kafka"
    dest = base / version
    libs = dest / "libs"
    if (dest / MARKER).is_file() and libs.is_dir():
        return libs

    require_java(which=which, run=run)
    mvn = which("mvn")
    if mvn is None:
        raise BrokerError(f"`mvn` is not on PATH. {_MAVEN_HINT}")

    base.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{version}-", dir=base))
    try:
        (work / "pom.xml").write_text(render_pom(version), encoding="utf-8")
        command = [
            mvn, "-B", "-q", "-Dstyle.color=never", "-f", str(work / "pom.xml"),
            "dependency:copy-dependencies", f"-DoutputDirectory={work / 'libs'}", "-DincludeScope=runtime",
        ]  # fmt: skip
        progress(f"downloading Apache Kafka {version} from Maven Central into {dest} ...")
        try:
            result = run(command, cwd=work, capture_output=True, text=True, timeout=MVN_TIMEOUT_S)
        except subprocess.TimeoutExpired as exc:
            raise BrokerError(
                f"Maven did not finish downloading Kafka {version} within {MVN_TIMEOUT_S:.0f}s; "
                "Maven Central (https://repo.maven.apache.org) must be reachable"
            ) from exc
        except OSError as exc:
            raise BrokerError(f"could not run {mvn}: {exc}. {_MAVEN_HINT}") from exc
        if result.returncode != 0:
            output = _tail(f"{result.stdout or ''}\n{result.stderr or ''}")
            raise BrokerError(
                f"Maven failed (exit {result.returncode}) to download Kafka {version}; Maven Central "
                f"(https://repo.maven.apache.org) must be reachable and the version must exist. "
                f"Last lines of its output:\n{output}"
            )
        jar = work / "libs" / f"kafka_2.13-{version}.jar"
        if not jar.is_file():
            raise BrokerError(f"Maven succeeded but {jar.name} is missing from {work / 'libs'}")
        (work / MARKER).write_text(f"{version}\n", encoding="utf-8")
        _commit(work, dest)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    progress(f"Kafka {version} is installed in {libs}")
    return libs


def _commit(work: Path, dest: Path) -> None:
    """Rename the finished download ``work`` to ``dest``, replacing an incomplete leftover."""
    if dest.exists() and not (dest / MARKER).is_file():
        logger.warning("removing the incomplete Kafka download in %s", dest)
        shutil.rmtree(dest)
    try:
        work.rename(dest)
    except OSError:
        if (dest / MARKER).is_file():  # another process finished the same download first
            return
        raise
