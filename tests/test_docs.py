"""The README's command table is generated from --help and must stay current."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_readme_command_table_is_current():
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen-docs"), "--check"], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_readme_starts_with_the_two_setup_commands():
    text = (ROOT / "README.md").read_text()
    block = text.split("```bash\n", 1)[1].split("```", 1)[0].strip().splitlines()
    assert block[0].endswith("agent demo") and "pip install -e ." in block[0]
    assert block[1] == "bash scripts/test"
    assert "bash scripts/test" in (ROOT / ".ci" / "run").read_text()


def test_readme_config_example_is_valid():
    import re

    import yaml

    from agent.config import parse_config

    blocks = re.findall(r"```yaml\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert blocks
    for block in blocks:
        cfg = parse_config(yaml.safe_load(block), filename="README.md")
        assert cfg.repos and cfg.lanes
