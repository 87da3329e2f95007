"""The run report opened in a real browser: headless Chromium (Debian's `chromium`, installed by
scripts/setup_docker.sh, which `make test` runs) loads report.html, and the test checks that its tables
and inlined images render; the screenshot is kept in tests/artifacts/ (gitignored)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from trace_train.cli import main

ARTIFACTS = Path(__file__).parent / "artifacts"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars", "--virtual-time-budget=5000"]

# Appended to a copy of the page: after load, it records what the browser actually laid out and decoded.
PROBE = """<script>window.addEventListener('load', () => {
  const imgs = [...document.images].map(i => [i.complete, i.naturalWidth, i.naturalHeight, i.src.slice(0, 22)]);
  const tables = [...document.querySelectorAll('table')].map(t => [t.rows.length, t.offsetWidth, t.offsetHeight]);
  const probe = document.createElement('pre'); probe.id = 'probe';
  probe.textContent = JSON.stringify({imgs, tables}); document.body.appendChild(probe);
});</script>"""


def chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.fail("Debian's chromium is not installed: run `bash scripts/setup_docker.sh` (make test does)")
    return exe


def render(html: Path, work: Path, screenshot: Path) -> dict:
    """The probe's findings from Chromium's DOM after load, plus a full-page screenshot."""
    page = work / "probe.html"
    page.write_text(html.read_text(encoding="utf-8").replace("</body>", PROBE + "</body>"), encoding="utf-8")
    base = [chromium(), *CHROMIUM_FLAGS]
    dom = subprocess.run(base + [f"--user-data-dir={work / 'profile-dom'}", "--dump-dom", page.as_uri()],
                         capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    found = re.search(r'<pre id="probe">(.*?)</pre>', dom.stdout, re.S)
    assert found, "the probe did not run: " + dom.stdout[-500:]
    shot = subprocess.run(base + [f"--user-data-dir={work / 'profile-shot'}", f"--screenshot={screenshot}",
                                  "--window-size=1280,3200", html.as_uri()], capture_output=True, text=True, timeout=120)
    assert shot.returncode == 0 and screenshot.exists(), shot.stderr[-2000:]
    import html as html_lib

    return json.loads(html_lib.unescape(found.group(1)))


def test_report_html_renders_its_tables_and_images_in_chromium(tmp_path):
    run = tmp_path / "run"
    cfg = tmp_path / "run.yaml"
    cfg.write_text(f"out: {run}\n"
                   "base: {kind: scripted, agent: 'tau:noisy', agent_kwargs: {p: 0.7, capabilities: "
                   "[multi_step_completion, tool_calling_precision]}}\n"
                   "rollout: {seeds: '1000:1040'}\ntrain: {model: /nonexistent}\n")
    assert main(["run", str(cfg), "--until", "diagnose", "--no-progress"]) == 0
    html = run / "report.html"
    text = html.read_text(encoding="utf-8")
    # Self-contained: every image is a data URI, nothing is fetched from a file or the network.
    assert 'src="data:image/png;base64,' in text
    assert not re.search(r'src="(?!data:)', text) and "<link" not in text

    screenshot = tmp_path / "report.png"
    probe = render(html, tmp_path, screenshot)
    # Every image decoded (a broken data URI has naturalWidth 0) and every table was laid out with rows.
    assert probe["imgs"] and all(done and w > 100 and h > 100 for done, w, h, _ in probe["imgs"]), probe["imgs"]
    assert len(probe["tables"]) >= 2
    assert all(rows >= 2 and w > 0 and h > 0 for rows, w, h in probe["tables"]), probe["tables"]

    # The screenshot is a real picture of the page, not a blank canvas.
    from PIL import Image

    img = Image.open(screenshot).convert("L")
    assert img.size == (1280, 3200)
    lo, hi = img.getextrema()
    assert hi - lo > 100
    ARTIFACTS.mkdir(exist_ok=True)
    shutil.copy(screenshot, ARTIFACTS / "report_screenshot.png")
    shutil.copy(html, ARTIFACTS / "report.html")
