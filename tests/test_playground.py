"""``trace serve --ui``: the web playground, driven in headless Chromium through the DevTools protocol.

A scripted oracle episode is played through the page as a person would: pick the env and seed, start,
choose each tool in the list and fill its form (built from the tool's schema), or type to the customer.
The test then asserts on the page's content (the conversation, the reward and its breakdown) and saves
a screenshot (its path is printed).
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import time

import gymnasium as gym
import httpx
import pytest
from websockets.sync.client import connect

pytest.importorskip("openenv", reason="the serve extra (pip install 'trace-rl[serve]') is part of `all`")

from trace_envs.adapters.openenv_server import ServerThread, build_app  # noqa: E402
from trace_envs.core.parsing import parse_action  # noqa: E402

TAU = "trace/tau_airline-v0"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (scripts/setup_docker.sh)")


class Page:
    """One Chromium tab over the DevTools protocol (enough for navigate, evaluate and screenshot)."""

    def __init__(self, ws_url: str):
        self.ws = connect(ws_url, max_size=None).__enter__()
        self.next_id = 0

    def call(self, method: str, **params):
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            reply = json.loads(self.ws.recv(timeout=60))
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]

    def js(self, expression: str):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"page script failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait(self, expression: str, timeout: float = 30.0):
        deadline = time.monotonic() + timeout
        while True:
            value = self.js(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                shown = self.js("document.getElementById('error').textContent")
                raise AssertionError(f"timed out waiting for {expression!r}; error shown: {shown!r}")
            time.sleep(0.05)


@pytest.fixture()
def chromium(tmp_path):
    profile = tmp_path / "profile"
    proc = subprocess.Popen([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                             "--remote-debugging-port=0", f"--user-data-dir={profile}", "--window-size=1280,1000",
                             "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not (port_file.exists() and port_file.read_text().strip()):
            assert proc.poll() is None and time.monotonic() < deadline, "chromium did not start"
            time.sleep(0.05)
        port = int(port_file.read_text().split()[0])
        targets = httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=10).json()
        page = Page(next(t for t in targets if t["type"] == "page")["webSocketDebuggerUrl"])
        yield page
        page.ws.close()
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def _fill_and_call(page: Page, name: str, arguments: dict) -> None:
    page.js(f"(() => {{ const s = document.getElementById('tool'); s.value = {json.dumps(name)};"
            "s.dispatchEvent(new Event('change')); })()")
    for key, value in arguments.items():
        page.js(f"""(() => {{ const i = document.getElementById({json.dumps('arg-' + key)});
            if (!i) throw new Error('no field for ' + {json.dumps(key)});
            const v = {json.dumps(value)}, kind = i.dataset.kind;
            i.value = (kind === 'string') ? v : (kind === 'boolean' || kind === 'integer' || kind === 'number')
                ? String(v) : JSON.stringify(v); }})()""")
    page.js("document.getElementById('call').click()")


def test_the_playground_plays_an_oracle_episode_in_headless_chromium(chromium, tmp_path):
    page = chromium
    with ServerThread(build_app([TAU, "trace/tau_retail-v0"], ui=True, token="pw")) as srv:
        assert httpx.get(srv.url + "/ui", timeout=10).status_code == 401  # the token guards the page too
        page.call("Page.enable")
        page.call("Page.navigate", url=srv.url + "/ui?token=pw")
        page.wait("document.querySelectorAll('#env option').length === 2")
        page.js(f"document.getElementById('env').value = {json.dumps(TAU)}; document.getElementById('seed').value = '4';"
                "document.getElementById('start').click()")
        page.wait("!document.getElementById('call').disabled")
        assert page.js("document.querySelectorAll('#tool option').length") > 5
        # The form is built from the schema: get_reservation_details takes one required string.
        page.js("(() => { const s = document.getElementById('tool'); s.value = 'get_reservation_details';"
                "s.dispatchEvent(new Event('change')); })()")
        assert page.js("document.getElementById('arg-reservation_id').dataset.kind") == "string"
        assert "required" in page.js("document.getElementById('toolform').textContent")

        env = gym.make(TAU)
        obs, info = env.reset(seed=4)
        policy = env.unwrapped.oracle()
        for _ in range(60):
            parsed = parse_action(policy(obs, info))
            if parsed.tool_calls:
                call = parsed.tool_calls[0]
                _fill_and_call(page, call.name, dict(call.arguments))
            else:
                page.js(f"document.getElementById('reply').value = {json.dumps(parsed.content)};"
                        "document.getElementById('send').click()")
            state = page.wait("document.getElementById('outcome').textContent.startsWith('Reward') ? 'done' : "
                              "(!document.getElementById('call').disabled ? 'running' : '')")
            if state == "done":
                break
        env.close()
        outcome = page.js("document.getElementById('outcome').textContent")
        assert "Reward: 1.00" in outcome and "termination: user_stop" in outcome and "success: true" in outcome
        assert "db1" in outcome and "db_hash" in outcome  # the breakdown's rows: db = 1, the two DB hashes
        conversation = page.js("document.getElementById('conversation').textContent")
        assert "Airline customer service policy" in conversation and "→ " in conversation
        assert page.js("document.getElementById('error').textContent") == ""
        assert page.js("document.getElementById('call').disabled") is True  # the episode is over
        shot = tmp_path / "playground.png"
        shot.write_bytes(base64.b64decode(page.call("Page.captureScreenshot", format="png")["data"]))
        print(f"playground screenshot: {shot}")
        assert shot.stat().st_size > 10_000
