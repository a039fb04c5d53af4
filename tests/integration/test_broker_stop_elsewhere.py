"""`governor broker stop --port P` where a broker answers that this GOVERNOR_HOME did not start."""
import pytest
from typer.testing import CliRunner

import infra.cli as cli


def test_stop_says_a_broker_of_another_home_answers_and_leaves_it(kafka_bootstrap, tmp_path,
                                                                  monkeypatch) -> None:
    """It said `no embedded broker was running` while one answered on the port, and exited 0: a
    script stopping a broker to free its port went on to find the port held."""
    host, _, port = kafka_bootstrap.rpartition(":")
    if host not in ("127.0.0.1", "localhost"):
        pytest.skip("the embedded broker's commands look on 127.0.0.1")
    monkeypatch.setenv("GOVERNOR_HOME", str(tmp_path))
    result = CliRunner().invoke(cli.app, ["broker", "stop", "--port", str(port)])
    assert result.exit_code == 1, result.output
    assert " ".join(result.output.split()) == (
        f"no broker of {tmp_path / f'broker-{port}'} runs on port {port}, but one answers at "
        f"127.0.0.1:{port}: stop it with the GOVERNOR_HOME it was started with")
    status = CliRunner().invoke(cli.app, ["broker", "status", "--port", str(port)])
    assert '"answers": true' in status.output  # (left running)
