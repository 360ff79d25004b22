"""Headless Chromium driven over the Chrome DevTools Protocol, for the web page tests (test_web_page.py).

Chromium (Debian's `chromium` package, installed by scripts/install-deps.sh) runs with --remote-debugging-pipe:
the protocol's JSON messages travel over two pipes (the browser reads fd 3, writes fd 4, each message ends
with a NUL byte), so no port, no websocket and no Python package is needed. Every wait polls a condition in
the page until a deadline; nothing depends on how fast the machine is.

The browser records what a test checks beyond the DOM: every URL the page requested (Network domain), and
every JavaScript exception, console error and browser log error (e.g. a Content-Security-Policy violation).
"""

import base64
import fcntl
import json
import os
import queue
import shutil
import subprocess
import tempfile
import threading
import time

SKIP_ENV = "PD_SKIP_BROWSER_TESTS"


def find_chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def missing_chromium_message():
    """Why the browser tests cannot run without Chromium, and how to skip them outside CI."""
    return ("headless Chromium was not found (Debian: apt-get install chromium, which scripts/install-deps.sh "
            f"does). Locally you may skip the browser tests with {SKIP_ENV}=1; in CI (CI set) they must run.")


class BrowserError(RuntimeError):
    pass


class Browser:
    """One Chromium process with one page (tab), attached with a flat session."""

    def __init__(self, width=1280, height=860):
        path = find_chromium()
        if not path:
            raise BrowserError(missing_chromium_message())
        self.profile = tempfile.mkdtemp(prefix="pd-chromium-")
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()

        def child_fds():  # the protocol's fixed descriptors in the child: 3 reads commands, 4 writes replies
            # Moved above 10 first, so that neither end can be overwritten by the other's dup2. Only 3 and 4
            # are inheritable (Python's own descriptors are not), so close_fds=False passes just these two:
            # close_fds=True would close them again after this function.
            high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in (to_browser_r, from_browser_w)]
            os.dup2(high[0], 3)
            os.dup2(high[1], 4)

        args = [path, "--headless=new", "--remote-debugging-pipe", f"--user-data-dir={self.profile}",
                "--no-first-run", "--no-default-browser-check", "--disable-gpu", "--disable-extensions",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--disable-default-apps", "--mute-audio", "--hide-scrollbars", f"--window-size={width},{height}"]
        if os.geteuid() == 0:
            args.append("--no-sandbox")  # Chromium refuses to run as root with its sandbox (CI runs as root)
        self.log = tempfile.NamedTemporaryFile(prefix="chromium-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(args + ["about:blank"], stdin=subprocess.DEVNULL, stdout=self.log,
                                     stderr=self.log, preexec_fn=child_fds, close_fds=False)
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._next_id = 0
        self._replies = {}
        self._cond = threading.Condition()
        self.events = queue.Queue()
        self.requests = []  # URLs the page asked for
        self.errors = []  # JS exceptions, console errors, browser log errors
        self._reader = threading.Thread(target=self._read_loop, daemon=True)
        self._reader.start()
        self.session = None
        target = self.call("Target.createTarget", {"url": "about:blank"}, session=False)["targetId"]
        self.session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True},
                                 session=False)["sessionId"]
        for domain in ("Page", "Runtime", "Network", "Log"):
            self.call(domain + ".enable")
        self.call("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})

    # --- protocol ---
    def _read_loop(self):
        buf = b""
        while True:
            try:
                data = os.read(self._from_browser, 1 << 16)
            except OSError:
                data = b""
            if not data:
                with self._cond:
                    self._replies[None] = "closed"
                    self._cond.notify_all()
                return
            buf += data
            while b"\0" in buf:
                raw, buf = buf.split(b"\0", 1)
                msg = json.loads(raw)
                if "id" in msg:
                    with self._cond:
                        self._replies[msg["id"]] = msg
                        self._cond.notify_all()
                else:
                    self._on_event(msg)

    def _on_event(self, msg):
        method, params = msg.get("method"), msg.get("params", {})
        if method == "Network.requestWillBeSent":
            self.requests.append(params["request"]["url"])
        elif method == "Runtime.exceptionThrown":
            d = params["exceptionDetails"]
            self.errors.append("exception: " + d.get("exception", {}).get("description", d.get("text", "")))
        elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            self.errors.append("console: " + " ".join(str(a.get("value", a.get("description", "")))
                                                      for a in params.get("args", [])))
        elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
            entry = params["entry"]
            # A request the page made that failed on purpose (the stop button's aborted stream) is no error.
            if entry.get("source") != "network":
                self.errors.append(f"log ({entry.get('source')}): {entry['text']}")
        self.events.put(msg)

    def call(self, method, params=None, session=True, timeout=60):
        with self._cond:
            self._next_id += 1
            mid = self._next_id
        msg = {"id": mid, "method": method, "params": params or {}}
        if session and self.session:
            msg["sessionId"] = self.session
        os.write(self._to_browser, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        with self._cond:
            while mid not in self._replies:
                if None in self._replies:
                    raise BrowserError(f"Chromium exited during {method}:\n{self.log_text()}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise BrowserError(f"no reply to {method} in {timeout} s")
                self._cond.wait(left)
            reply = self._replies.pop(mid)
        if "error" in reply:
            raise BrowserError(f"{method}: {reply['error']}")
        return reply.get("result", {})

    # --- page helpers ---
    def eval(self, expression):
        """The value of a JavaScript expression in the page (promises awaited)."""
        r = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True})
        if "exceptionDetails" in r:
            raise BrowserError(f"{expression!r} threw: {r['exceptionDetails']}")
        return r["result"].get("value")

    def wait_for(self, expression, timeout=60, what=None):
        """Polls a JavaScript condition until it is truthy; returns its value."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.eval(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise BrowserError(f"timed out after {timeout} s waiting for {what or expression}; page state: "
                                   f"{self.eval('document.body && document.body.dataset.state')!r}")
            time.sleep(0.05)

    def navigate(self, url, ready="true", timeout=30):
        """Loads url and waits until `ready` holds in the new document (the old one is marked, so that a
        reload of the same URL is not mistaken for its end)."""
        self.eval("window.__pdOldDocument = true")
        self.call("Page.navigate", {"url": url})
        loaded = (f"!window.__pdOldDocument && location.href === {json.dumps(url)} && "
                  f"document.readyState === 'complete' && ({ready})")
        self.wait_for(f"(() => {{ try {{ return {loaded}; }} catch (e) {{ return false; }} }})()", timeout,
                      f"{url} to load")

    def text(self, selector):
        return self.eval(f"(e => e ? e.textContent : null)(document.querySelector({json.dumps(selector)}))")

    def click(self, selector):
        """A real mouse click at the element's centre (as a person would), after scrolling it into view."""
        box = self.eval(f"""(() => {{ const e = document.querySelector({json.dumps(selector)});
            if (!e) return null; e.scrollIntoView({{block: 'center'}}); const r = e.getBoundingClientRect();
            return [r.x + r.width / 2, r.y + r.height / 2]; }})()""")
        if not box:
            raise BrowserError(f"no element {selector}")
        for kind in ("mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent",
                      {"type": kind, "x": box[0], "y": box[1], "button": "left", "clickCount": 1})

    def type_into(self, selector, text):
        """Focuses a field and types text into it (Input.insertText: input events fire as for typing)."""
        self.eval(f"(e => {{ e.focus(); e.value = ''; }})(document.querySelector({json.dumps(selector)}))")
        self.call("Input.insertText", {"text": text})

    def screenshot(self, path):
        data = self.call("Page.captureScreenshot", {"format": "png"})["data"]
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))

    def log_text(self):
        with open(self.log.name, encoding="utf-8", errors="replace") as f:
            return f.read()[-4000:]

    def close(self):
        try:
            self.call("Browser.close", session=False, timeout=10)
        except BrowserError:
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._to_browser)
        shutil.rmtree(self.profile, ignore_errors=True)
        os.unlink(self.log.name)
