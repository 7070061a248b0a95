"""The live status page in a real headless Chromium (Debian's `chromium`, installed by scripts/ci-chromium):
scripts/status-screenshot starts the real server, pushes events over HTTP, and takes the screenshot README shows;
this test runs it and checks the picture and the DOM Chromium rendered (a gate-blocked task with its reset command,
a task stuck on a dead runner, the runners)."""

from __future__ import annotations

import shutil
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def png_pixels(path: Path) -> tuple[int, int, bytes]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    idat, pos = b"", 8
    while pos < len(data):
        (length,), kind = struct.unpack(">I", data[pos:pos + 4]), data[pos + 4:pos + 8]
        if kind == b"IDAT":
            idat += data[pos + 8:pos + 8 + length]
        pos += 12 + length
    return width, height, zlib.decompress(idat)


@pytest.mark.slow
def test_status_page_screenshot_shows_the_gate_blocked_task_the_stuck_one_and_the_runners(tmp_path):
    if not (shutil.which("chromium") or shutil.which("chromium-browser")):
        pytest.skip("chromium not installed: run scripts/ci-chromium (needs root and Debian's registry)")
    out = tmp_path / "status.png"
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "status-screenshot"), str(out),
                        str(tmp_path / "dom.html")], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    width, height, raw = png_pixels(out)
    assert (width, height) == (1100, 900)
    ink = sum(1 for b in raw if b < 128)  # dark pixels: text was drawn, the page is not blank
    assert ink > 2000, ink
    dom = (tmp_path / "dom.html").read_text()
    assert "http-equiv=\"refresh\"" not in dom and "live: updates every 5 s without reloading" in dom
    blocked = dom[dom.index('id="blocked"'):]
    blocked = blocked[:blocked.index("</table>")]
    assert "not logged in (auth refused)" in blocked
    assert "agent task reset 1 --reason 'what you fixed'" in blocked
    stuck = dom[dom.index('id="stuck"'):]
    stuck = stuck[:stuck.index("</table>")]
    assert "worker-2:5e1f20aa" in stuck and "not live" in stuck
    runners = dom[dom.index('id="runners"'):]
    runners = runners[:runners.index("</table>")]
    assert ("silent" in runners or "dead" in runners) and "alive" in runners and "25m ago" in runners
    assert dom.count("<script") == 1  # the live updater only


def test_readme_shows_the_committed_screenshot():
    readme = (ROOT / "README.md").read_text()
    assert "](docs/status-page.png)" in readme
    width, height, _ = png_pixels(ROOT / "docs" / "status-page.png")
    assert (width, height) == (1100, 900) and (ROOT / "docs" / "status-page.png").stat().st_size < 200_000
