"""Drives the web console (issue 52) in Debian's headless Chromium through Playwright.

    with browser() as b:
        page = new_page(b)
        errors = ConsoleErrors(page)
        sign_in(page, hub)
        ...
        errors.assert_none()

The browser is /usr/bin/chromium (never a downloaded one). Screenshots go to docs/console/
(or FERROHUB_CONSOLE_SHOTS).
"""

import contextlib
import os
import re
import time
from pathlib import Path

from playwright.sync_api import sync_playwright

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("FERROHUB_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
DESKTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}


@contextlib.contextmanager
def browser():
    """A headless Chromium for the duration of the block."""
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


def new_page(b, viewport=None):
    """A page in a fresh context (own sessionStorage), trusting the hub's self-signed certificate."""
    ctx = b.new_context(ignore_https_errors=True, viewport=viewport or DESKTOP)
    page = ctx.new_page()
    page.set_default_timeout(20_000)
    return page


def console_url(hub, route: str = "") -> str:
    """https://localhost:{port}/console/ (with `#/{route}` when given)."""
    url = f"https://localhost:{hub.port}/console/"
    return url + (f"#/{route.lstrip('#/')}" if route else "")


def policy_connection_string(hub, policy: str = "iothubowner") -> str:
    return hub.connection_string(policy)


def sign_in(page, hub, policy: str = "iothubowner", connection_string: str | None = None):
    """Opens the console, pastes the policy's connection string and waits for the shell."""
    page.goto(console_url(hub, "signin"))
    page.wait_for_selector("textarea#connection-string")
    page.fill("textarea#connection-string", connection_string or policy_connection_string(hub, policy))
    page.click("button#sign-in")
    page.wait_for_selector("#whoami")
    page.wait_for_function("() => document.querySelector('#whoami').textContent.trim().length > 0")
    wait_state(page)
    return page


def wait_state(page, states=("ready", "empty"), timeout: float = 20_000):
    """Waits until main#page has one of `states` as data-state; returns the state."""
    states = list(states)
    page.wait_for_function(
        "(states) => states.includes(document.querySelector('main#page')?.dataset.state)",
        arg=states, timeout=timeout)
    return page.get_attribute("main#page", "data-state")


def go(page, route: str, states=("ready", "empty")):
    """Navigates to `#/{route}` (ids percent-encoded by the caller) and waits for the page."""
    # Already there: a hashchange event renders the page again (as a click on its nav link would not).
    page.evaluate("""(h) => {
        document.querySelector('main#page').dataset.state = 'loading';
        if (location.hash === h) window.dispatchEvent(new HashChangeEvent('hashchange'));
        else location.hash = h;
    }""", "#/" + route.lstrip("#/"))
    return wait_state(page, states)


def testid(name: str) -> str:
    """The CSS selector of `data-testid="{name}"`."""
    return f'[data-testid="{name}"]'


testid.__test__ = False  # a helper, not a test (pytest collects test* names a test module imports)


def shot(page, name: str, full_page: bool = False, at: str | None = None) -> Path:
    """Saves docs/console/{name}.png (or under FERROHUB_CONSOLE_SHOTS): the top of the page, or
    with `at` (a CSS selector) the window scrolled so that element is at its top."""
    out = Path(os.environ.get("FERROHUB_CONSOLE_SHOTS", REPO / "docs" / "console"))
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.png"
    # Let layout settle; no caret, no passing toasts, so shots are stable.
    page.evaluate("""(at) => {
        document.activeElement?.blur?.();
        const el = at && document.querySelector(at);
        // Below the sticky top bar, not under it.
        const bar = document.querySelector('.topbar')?.getBoundingClientRect().height || 0;
        window.scrollTo(0, el ? el.getBoundingClientRect().top + window.scrollY - bar - 16 : 0);
        document.querySelectorAll('.toast').forEach((t) => t.remove());
    }""", at)
    time.sleep(0.3)
    page.screenshot(path=str(path), full_page=full_page, animations="disabled")
    return path


class ConsoleErrors:
    """Records console errors and warnings and uncaught page errors; `assert_none()` fails on any.

    `allow` lists regular expressions of messages that are expected (for example the browser's
    own "Failed to load resource: ... 401" line when a test provokes a 401 on purpose).
    """

    def __init__(self, page, allow=()):
        self.page = page
        self.messages: list[str] = []
        self.allow = [re.compile(a) for a in allow]
        page.on("console", self._on_console)
        page.on("pageerror", lambda exc: self.messages.append(f"pageerror: {exc}"))

    def _on_console(self, msg):
        if msg.type in ("error", "warning"):
            loc = msg.location or {}
            self.messages.append(f"{msg.type}: {msg.text} ({loc.get('url', '')}:{loc.get('lineNumber', '')})")

    def allow_also(self, pattern: str):
        self.allow.append(re.compile(pattern))

    def allow_status(self, *codes: int):
        """Chromium logs every fetch answered 4xx/5xx as "Failed to load resource: ... status of N";
        a test that provokes such an answer on purpose allows it here."""
        for code in codes:
            self.allow.append(re.compile(rf"Failed to load resource: the server responded with a status of {code}\b"))

    def unexpected(self) -> list[str]:
        return [m for m in self.messages if not any(a.search(m) for a in self.allow)]

    def assert_none(self):
        bad = self.unexpected()
        assert not bad, "console errors:\n" + "\n".join(bad)
