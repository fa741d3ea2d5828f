"""Helpers to drive the admin console in Debian's chromium with playwright: launch, a context per
test, log in, keyboard focus, the accessible-name check and the inert-markup check.

Used by tests/e2e/test_console_browser.py and tests/e2e/console_screenshots.py (`make screenshots`).
playwright is imported lazily, so importing this module never needs it.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

CHROMIUM = "/usr/bin/chromium"  # Debian's package; `playwright install` is never run
UI = "/admin/ui"
VIEWPORT = {"width": 1280, "height": 800}
# Markup through every field the console shows: if any of it became markup, the flag would be set
# or a dialog would open. (The page's CSP would block both as well; the checks below do not rely on
# it: they look for the elements themselves.)
HOSTILE = '<script>window.__weirPwned=1</script><img src=x onerror="window.__weirPwned=2;alert(2)">'
CONTROLS = "input:not([type=hidden]), select, textarea, button"
PAGES = ("/tenants", "/engine", "/usage", "/models", "/audit")


def launch_chromium(playwright: Any) -> Any:
    """Debian's chromium, headless."""
    return playwright.chromium.launch(executable_path=CHROMIUM, headless=True)


@dataclass
class Console:
    """One browser context (its own cookies) on the console of the server at `url`."""

    page: Any
    url: str
    dialogs: list[str] = field(default_factory=list)

    @property
    def ui(self) -> str:
        return self.url + UI

    def page_paths(self, tenant: str | None = None) -> list[str]:
        return [*PAGES, *([f"/tenants/{tenant}"] if tenant else [])]

    def log_in(self, token: str) -> None:
        self.page.goto(f"{self.ui}/login")
        self.page.get_by_label("Admin token").fill(token)
        self.page.get_by_role("button", name="Log in").click()
        self.page.wait_for_url(re.compile(r"/admin/ui/tenants$"))

    def tab_to(self, selector: str, max_presses: int = 60) -> None:
        """Press Tab until the element matching `selector` has the focus (bounded)."""
        for _ in range(max_presses):
            if self.page.evaluate("(s) => document.activeElement?.matches(s) ?? false", selector):
                return
            self.page.keyboard.press("Tab")
        raise AssertionError(f"Tab never reached {selector}")

    def assert_controls_labelled(self) -> None:
        """Every control has an accessible name, as the browser's accessibility tree computes it."""
        from playwright.sync_api import expect

        controls = self.page.locator(CONTROLS)
        assert controls.count() > 0
        for i in range(controls.count()):
            expect(controls.nth(i)).to_have_accessible_name(re.compile(r"\S"))

    def assert_inert(self, expect_text: bool = True) -> None:
        """Nothing of HOSTILE ran or became an element; with `expect_text`, it shows as text."""
        assert self.page.evaluate("() => window.__weirPwned") is None
        assert self.dialogs == []
        assert self.page.locator("script:not([src])").count() == 0
        assert self.page.locator('img[src="x"]').count() == 0
        if expect_text:
            assert HOSTILE in self.page.locator("main").inner_text()

    def reload_and_count_text(self, text: str) -> int:
        self.page.reload()
        return self.page.locator("main").inner_text().count(text)


@contextlib.contextmanager
def console_context(browser: Any, url: str, extra_headers: dict[str, str] | None = None) -> Iterator[Console]:
    """A fresh browser context and page; dialogs are recorded and dismissed."""
    context = browser.new_context(viewport=VIEWPORT, extra_http_headers=extra_headers)
    try:
        page = context.new_page()
        console = Console(page, url)

        def on_dialog(dialog: Any) -> None:
            console.dialogs.append(dialog.message)
            dialog.dismiss()

        page.on("dialog", on_dialog)
        yield console
    finally:
        context.close()
