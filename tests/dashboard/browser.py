"""A headless Chromium for page tests, driven over the Chrome DevTools Protocol on one websocket
(`websockets`' sync client; no WebDriver): trusted mouse clicks and typed text as a user's, dialogs
answered (and kept), new tabs found, full-page screenshots. The browser is started with a fresh
profile and without background networking; its debugging port listens on 127.0.0.1 only.

    with Chromium(tmp_path / "chromium") as browser:
        page = browser.open("http://127.0.0.1:8300/")
        page.click("#token-form button")
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from websockets.sync.client import ClientConnection, connect

CHROMIUM = Path(os.environ.get("GPUYANTRA_CHROMIUM", "/usr/bin/chromium"))
START_WITHIN_S = 30.0
COMMAND_WITHIN_S = 30.0
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",  # small /dev/shm in containers
    "--hide-scrollbars",
    "--mute-audio",
    "--remote-debugging-address=127.0.0.1",
    "--remote-debugging-port=0",  # the port it picks is written to <profile>/DevToolsActivePort
    "--window-size=1400,1000",
]


class BrowserError(RuntimeError):
    pass


class Chromium:
    """One headless Chromium process and its browser-level DevTools connection (flat sessions)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        profile = folder / "profile"
        profile.mkdir(parents=True, exist_ok=True)
        self.log_path = folder / "chromium.log"
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [str(CHROMIUM), *FLAGS, f"--user-data-dir={profile}", "about:blank"],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # its renderers and helpers go with it at close()
            )
        self.dialogs: list[str] = []  # every alert/confirm message, each answered "OK"
        self._replies: dict[int, dict[str, Any]] = {}
        self._last_id = 0
        self._connection = contextlib.ExitStack()
        try:
            self.ws = self._connect(profile / "DevToolsActivePort")
        except BaseException:
            self.close()
            raise

    def _connect(self, port_file: Path) -> ClientConnection:
        deadline = time.monotonic() + START_WITHIN_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise BrowserError(f"chromium exited with {self.process.returncode}:\n{self.log()}")
            lines = port_file.read_text().split() if port_file.exists() else []
            if len(lines) == 2:
                url = f"ws://127.0.0.1:{lines[0]}{lines[1]}"
                return self._connection.enter_context(connect(url, max_size=None, open_timeout=10))
            time.sleep(0.1)
        raise BrowserError(f"chromium opened no DevTools port within {START_WITHIN_S:.0f} s:\n{self.log()}")

    def __enter__(self) -> Chromium:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:] if self.log_path.exists() else ""

    # ------------------------------------------------------------------ protocol

    def post(self, method: str, params: dict[str, Any] | None = None, session: str | None = None) -> int:
        """Send one command without waiting for its answer; its id."""
        self._last_id += 1
        message: dict[str, Any] = {"id": self._last_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        self.ws.send(json.dumps(message))
        return self._last_id

    def send(
        self,
        method: str,
        params: dict[str, Any] | None = None,
        session: str | None = None,
        within_s: float = COMMAND_WITHIN_S,
    ) -> dict[str, Any]:
        """One command's result; events that arrive meanwhile are handled (dialogs answered)."""
        command = self.post(method, params, session)
        deadline = time.monotonic() + within_s
        while command not in self._replies:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BrowserError(f"{method}: no answer within {within_s:.0f} s")
            try:
                message = json.loads(self.ws.recv(timeout=left))
            except TimeoutError:
                continue
            if "id" in message:
                self._replies[message["id"]] = message
            elif message.get("method") == "Page.javascriptDialogOpening":
                # A confirm() blocks the page until answered: answer as a user clicking OK would.
                self.dialogs.append(message["params"]["message"])
                self.post("Page.handleJavaScriptDialog", {"accept": True}, message.get("sessionId"))
        reply = self._replies.pop(command)
        if "error" in reply:
            raise BrowserError(f"{method}: {reply['error'].get('message')}")
        return reply.get("result", {})

    # ------------------------------------------------------------------ tabs

    def open(self, url: str) -> Page:
        """A new tab at `url`, loaded."""
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        page = self.attach(target)
        page.goto(url)
        return page

    def attach(self, target_id: str) -> Page:
        session = self.send("Target.attachToTarget", {"targetId": target_id, "flatten": True})["sessionId"]
        page = Page(self, session, target_id)
        self.send("Page.enable", session=session)
        self.send("Runtime.enable", session=session)
        return page

    def tabs(self) -> list[dict[str, Any]]:
        return [t for t in self.send("Target.getTargets")["targetInfos"] if t["type"] == "page"]

    def wait_for_tab(self, matches: Callable[[dict[str, Any]], bool], within_s: float, what: str) -> Page:
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            for tab in self.tabs():
                if matches(tab):
                    return self.attach(tab["targetId"])
            time.sleep(0.2)
        raise BrowserError(f"{what}: no such tab within {within_s:.0f} s; tabs: {self.tabs()}")

    def close(self) -> None:
        if getattr(self, "ws", None) is not None:
            try:
                self.post("Browser.close")
            except Exception:  # noqa: BLE001 - already gone
                pass
            self._connection.close()
        if self.process.poll() is None:
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)


class Page:
    """One tab: evaluate JavaScript, click and type as a user, take screenshots."""

    def __init__(self, browser: Chromium, session: str, target_id: str) -> None:
        self.browser = browser
        self.session = session
        self.target_id = target_id

    def send(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        return self.browser.send(method, params, self.session)

    def goto(self, url: str, within_s: float = 20.0) -> None:
        answer = self.send("Page.navigate", {"url": url})
        if answer.get("errorText"):
            raise BrowserError(f"navigating to {url}: {answer['errorText']}")
        self.wait(lambda: self.eval("document.readyState") == "complete", within_s, f"{url} loaded")

    def eval(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (a promise is awaited)."""
        answer = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True})
        if "exceptionDetails" in answer:
            details = answer["exceptionDetails"]
            raise BrowserError(f"{expression[:80]!r} threw: {details.get('exception', {}).get('description')}")
        return answer["result"].get("value")

    def wait(self, check: Callable[[], Any], within_s: float, what: str, every_s: float = 0.25) -> Any:
        """`check()` once it is truthy; BrowserError naming `what` and the last value when it never is."""
        deadline = time.monotonic() + within_s
        last = None
        while time.monotonic() < deadline:
            last = check()
            if last:
                return last
            time.sleep(every_s)
        raise BrowserError(f"{what}: not seen within {within_s:.0f} s (last: {last!r})")

    def click(self, selector: str) -> None:
        """A left click in the middle of the element, as a trusted mouse event (scrolled into view first)."""
        box = self.eval(
            f"""(() => {{
              const el = document.querySelector({json.dumps(selector)});
              if (!el) return null;
              el.scrollIntoView({{block: "center"}});
              const r = el.getBoundingClientRect();
              return r.width && r.height ? [r.x + r.width / 2, r.y + r.height / 2] : null;
            }})()"""
        )
        if not box:
            raise BrowserError(f"nothing visible to click at {selector!r}")
        x, y = box
        self.send("Input.dispatchMouseEvent", {"type": "mouseMoved", "x": x, "y": y})
        for kind in ("mousePressed", "mouseReleased"):
            self.send("Input.dispatchMouseEvent", {"type": kind, "x": x, "y": y, "button": "left", "clickCount": 1})

    def type(self, selector: str, text: str) -> None:
        """Click into a field and type `text` into it (the field is emptied first, as select-all would)."""
        self.click(selector)
        self.eval(f"document.querySelector({json.dumps(selector)}).select()")
        self.send("Input.insertText", {"text": text})

    def close(self) -> None:
        self.browser.send("Target.closeTarget", {"targetId": self.target_id})

    def text(self, selector: str) -> str | None:
        """The element's visible text (innerText), None when there is no such element."""
        return self.eval(f"document.querySelector({json.dumps(selector)})?.innerText ?? null")

    def screenshot(self, path: Path) -> Path:
        """The whole page, not only the window, as PNG."""
        size = self.send("Page.getLayoutMetrics")["cssContentSize"]
        clip = {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}
        shot = self.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True, "clip": clip})
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(shot["data"]))
        return path
