"""scripts/systemd/agent-runner@.service: the keys "Running N runners" (DESIGN.md) relies on are there, and systemd's
own parser accepts the unit (`systemd-analyze verify`, offline, on an instance of the template)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

UNIT = Path(__file__).resolve().parent.parent / "scripts" / "systemd" / "agent-runner@.service"


def sections(text: str) -> dict[str, dict[str, list[str]]]:
    """systemd's unit syntax: [Section], Key=value lines (a key may repeat), # comments."""
    out: dict[str, dict[str, list[str]]] = {}
    current = None
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            current = out.setdefault(line.strip("[]"), {})
            continue
        key, _, value = line.partition("=")
        assert current is not None and _, f"not a Key=value line outside a section: {line}"
        current.setdefault(key.strip(), []).append(value.strip())
    return out


def test_each_instance_has_its_own_home_and_shares_the_ledger_from_an_environment_file():
    unit = sections(UNIT.read_text())
    service = unit["Service"]
    homes = [v for v in service["Environment"] if v.startswith("AGENT_HOME=")]
    assert homes == ["AGENT_HOME=/var/lib/agent/runner-%i"]                  # one home per instance
    assert service["StateDirectory"] == ["agent/runner-%i"] and service["StateDirectoryMode"] == ["0700"]
    assert service["EnvironmentFile"] == ["/etc/agent/runners.env"]          # AGENT_LEDGER_URL, tokens
    assert not any("AGENT_LEDGER_URL" in v or "TOKEN" in v for v in service["Environment"])   # never in the unit
    assert service["Restart"] == ["always"]
    assert service["KillMode"] == ["mixed"] and service["KillSignal"] == ["SIGTERM"]
    (start,) = service["ExecStart"]
    assert re.search(r"agent --config \S+ daemon\b", start)
    assert unit["Install"]["WantedBy"] == ["multi-user.target"]


def test_the_daemon_command_line_in_the_unit_parses(tmp_path):
    """The ExecStart arguments are ones `agent daemon` accepts (its own parser, with --help so nothing runs)."""
    from click.testing import CliRunner

    from agent.cli import cli

    (start,) = sections(UNIT.read_text())["Service"]["ExecStart"]
    args = start.split()[1:]
    config = tmp_path / "config.yaml"
    config.write_text("{}\n")
    args[args.index("--config") + 1] = str(config)
    res = CliRunner().invoke(cli, [*args, "--help"])
    assert res.exit_code == 0, res.output
    bad = CliRunner().invoke(cli, [*args, "--no-such-option"])
    assert bad.exit_code == 2


def test_systemd_analyze_verify_accepts_the_unit(tmp_path):
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (Debian package systemd); the key checks above still ran")
    # verify wants an instance of the template and executables that exist on this machine
    text = UNIT.read_text().replace("/usr/local/bin/agent", shutil.which("true") or "/bin/true")
    good = tmp_path / "agent-runner@1.service"
    good.write_text(text)
    res = subprocess.run([analyze, "verify", "--man=no", str(good)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and not res.stderr.strip(), res.stderr
    # the check bites: a typo is reported
    bad = tmp_path / "agent-typo@1.service"
    bad.write_text(text.replace("Restart=always", "Restart=sometimes"))
    res = subprocess.run([analyze, "verify", "--man=no", str(bad)], capture_output=True, text=True, timeout=60)
    assert "restart" in (res.stderr + res.stdout).lower()
