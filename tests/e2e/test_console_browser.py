"""The admin console in a real browser: Debian's chromium driven by playwright, against `weir serve`'s
app (build_server_app: real engine, SQLite tenancy, the console) on a real uvicorn on 127.0.0.1,
serving two tiny random Llamas as versions v1 and v2 of one model.

One server and one browser for the module; each test opens its own browser context (own cookies).
Skipped, with the reason, where playwright or /usr/bin/chromium is missing (`.ci/run` installs
chromium; `pip install -e '.[dev]'` installs playwright).
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.e2e.console_browser import (
    CHROMIUM,
    HOSTILE,
    Console,
    console_context,
    launch_chromium,
)
from tests.engine.tiny_models import make_tiny_model
from tests.gateway.harness import serve_in_thread, wait_until
from weir.gateway.server.bootstrap import build_server_app
from weir.gateway.settings.settings import AuthMode, Settings

playwright_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (dev extra)")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        shutil.which(CHROMIUM) is None, reason=f"{CHROMIUM} is missing (apt-get install chromium)"
    ),
]
expect = playwright_api.expect

MODEL = "tiny"
ADMIN_TOKEN = "console-browser-admin-token"
ADMIN = {"authorization": f"Bearer {ADMIN_TOKEN}"}
WAIT_MS = 60_000  # a bound on waits for the page, never a timing assertion


@dataclass
class Served:
    url: str
    paths: dict[str, Path]
    keys: dict[str, str] = field(default_factory=dict)

    def admin(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=ADMIN, timeout=300)

    def client(self, key: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=key, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("console-browser")
    paths = {
        v: make_tiny_model(root / v, arch="llama", num_kv_heads=2, seed=seed)
        for v, seed in (("v1", 0), ("v2", 1))
    }
    settings = Settings(
        data_dir=root / "data",
        admin_token=ADMIN_TOKEN,
        auth=AuthMode.KEYS,
        model_path=paths["v1"],
        served_model_name=MODEL,
        model_version="v1",
        device="cpu",
        kv_cache_tokens=2048,
    )
    with serve_in_thread(build_server_app(settings)) as url:
        yield Served(url, paths)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with playwright_api.sync_playwright() as pw:
        chromium = launch_chromium(pw)
        yield chromium
        chromium.close()


@pytest.fixture
def console(served: Served, browser: Any) -> Iterator[Console]:
    with console_context(browser, served.url) as c:
        yield c


def _chat(served: Served, key: str, user: str = "alice") -> None:
    with served.client(key) as client:
        answer = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Hello"}], max_tokens=4, user=user
        )
    assert answer.choices[0].message.content is not None


# -- the flow the issue names ------------------------------------------------------------------------


def test_log_in_create_a_tenant_issue_a_key_use_it_and_see_the_usage(
    served: Served, console: Console
) -> None:
    page = console.page
    console.log_in(ADMIN_TOKEN)
    page.get_by_label("Name", exact=True).fill("acme")
    page.get_by_role("button", name="Create tenant").click()
    expect(page.get_by_role("heading", name="Tenant acme")).to_be_visible()

    page.get_by_role("button", name="Issue key").click()
    secret = page.get_by_label("Secret").input_value()
    assert secret.startswith("sk-weir-"), secret
    served.keys["acme"] = secret
    _chat(served, secret)

    # The record settles after the answer: reload the usage page until its table shows the request.
    page.goto(f"{console.ui}/usage?tenant=acme")
    assert wait_until(lambda: _usage_requests(console) == 1, timeout_s=30)
    bars = page.locator("#day-chart rect")
    expect(bars).to_have_count(1)
    assert float(bars.first.get_attribute("height") or 0) > 0
    expect(bars.first.locator("title")).to_contain_text("tokens")
    # Broken down by key: one bar, the key's public id (never its secret).
    by_key = page.locator("#breakdown-chart rect title")
    expect(by_key).to_have_count(1)
    assert secret not in page.content()


def _usage_requests(console: Console) -> int:
    console.page.goto(console.page.url)
    cells = console.page.locator("table tbody tr").first.locator("td")
    if cells.count() < 2:
        return 0
    return int(cells.nth(1).inner_text())


def test_register_load_and_split_traffic_then_see_the_live_page_move(
    served: Served, console: Console
) -> None:
    if "acme" not in served.keys:
        with served.admin() as admin:
            assert admin.post("/admin/v1/tenants", json={"name": "acme"}).status_code in (201, 409)
            served.keys["acme"] = admin.post("/admin/v1/tenants/acme/keys", json={}).json()["key"]
    page = console.page
    console.log_in(ADMIN_TOKEN)
    page.get_by_role("link", name="Model versions").click()
    page.get_by_label("Model name").fill(MODEL)
    page.get_by_label("Version label").fill("v2")
    page.get_by_label(re.compile("Path on the server")).fill(str(served.paths["v2"]))
    page.get_by_label(re.compile("KV cache tokens")).fill("2048")
    page.get_by_role("button", name="Register version").click()
    expect(page.get_by_role("status")).to_contain_text(f"Registered {MODEL}@v2")

    page.get_by_label("Version to change").select_option("v2")
    page.get_by_label("Action").select_option("load")
    page.get_by_role("button", name="Apply to version").click()  # unconfirmed: refused in place
    expect(page.get_by_role("heading", name="Model versions")).to_be_visible()
    assert page.get_by_role("alert").count() == 0  # the browser itself refused: the box is required
    page.get_by_label(re.compile("Yes, change this version")).check()
    page.get_by_role("button", name="Apply to version").click()
    expect(page.get_by_role("status")).to_contain_text(f"{MODEL}@v2 is ready", timeout=WAIT_MS)

    page.get_by_label("v1 %").fill("0")
    page.get_by_label("v2 %").fill("100")
    page.get_by_label(re.compile(f"Yes, send {MODEL}'s new requests")).check()
    page.get_by_role("button", name="Change traffic").click()
    expect(page.get_by_role("status")).to_contain_text(f"Traffic for {MODEL} saved")
    expect(page.get_by_role("row", name=re.compile(r"^v2 ready 100%"))).to_be_visible()

    page.get_by_role("link", name="Live engine").click()
    generated = page.locator('tr[data-version="tiny@v2"] td[data-field="generation_tokens"]')
    before = generated.inner_text()
    _chat(served, served.keys["acme"])  # all of it goes to v2 now
    # The page's script refreshes the table every few seconds: the counter moves without a reload.
    expect(generated).not_to_have_text(before, timeout=WAIT_MS)
    expect(page.locator("#live-status")).to_contain_text("Updated")
    # Per tenant: acme's row (added by a reload on its first request) with its TTFT percentiles.
    ttft = page.locator(f'#live-tenants tr[data-key="{MODEL}|acme"] td[data-field="ttft_p50"]')
    expect(ttft).to_have_text(re.compile(r"^\d+ ms$"), timeout=WAIT_MS)


# -- keyboard only, labels ---------------------------------------------------------------------------


def test_keyboard_only_log_in_and_create_a_tenant(console: Console) -> None:
    page = console.page
    page.goto(f"{console.ui}/login")
    console.tab_to("#token")
    page.keyboard.type(ADMIN_TOKEN)
    page.keyboard.press("Enter")
    expect(page.get_by_role("heading", name="Tenants")).to_be_visible()
    console.tab_to("#new-name")
    page.keyboard.type("keyboard-co")
    console.tab_to("#new-priority")
    page.keyboard.press("End")  # the last priority, by keyboard
    console.tab_to("form.card button[type=submit]")
    page.keyboard.press("Enter")
    expect(page.get_by_role("heading", name="Tenant keyboard-co")).to_be_visible()
    expect(page.get_by_label("Priority", exact=True)).not_to_have_value("standard")


def test_every_control_on_every_page_has_an_accessible_name(console: Console) -> None:
    page = console.page
    page.goto(f"{console.ui}/login")
    console.assert_controls_labelled()
    console.log_in(ADMIN_TOKEN)
    page.get_by_label("Name", exact=True).fill("labels-co")
    page.get_by_role("button", name="Create tenant").click()
    page.get_by_role("button", name="Issue key").click()  # the page with the new secret's field
    console.assert_controls_labelled()
    for path in console.page_paths("labels-co"):
        page.goto(f"{console.ui}{path}")
        console.assert_controls_labelled()
    page.goto(f"{console.ui}/tenants/labels-co")
    page.get_by_role("link", name=re.compile("details and limits")).first.click()  # a key's page
    console.assert_controls_labelled()


def test_every_page_fits_a_phone_width_without_sideways_scrolling(console: Console) -> None:
    page = console.page
    page.set_viewport_size({"width": 390, "height": 844})
    console.log_in(ADMIN_TOKEN)
    page.get_by_label("Name", exact=True).fill("phone-co")
    page.get_by_role("button", name="Create tenant").click()
    for path in console.page_paths("phone-co"):
        page.goto(f"{console.ui}{path}")
        # Wide tables scroll inside their own box; the page itself never scrolls sideways.
        overflow = page.evaluate("() => document.documentElement.scrollWidth - window.innerWidth")
        assert overflow <= 0, (path, overflow)


# -- hostile input -------------------------------------------------------------------------------------


def test_markup_in_names_user_values_and_models_stays_inert(served: Served, console: Console) -> None:
    page = console.page
    console.log_in(ADMIN_TOKEN)
    with served.admin() as admin:
        if admin.get("/admin/v1/tenants/hostile").status_code == 404:
            assert admin.post("/admin/v1/tenants", json={"name": "hostile"}).status_code == 201
        key = admin.post("/admin/v1/tenants/hostile/keys", json={}).json()["key"]
    _chat(served, key, user=HOSTILE)

    # A tenant name: refused with the input echoed in the form and in the search.
    page.get_by_label("Name", exact=True).fill(HOSTILE)
    page.get_by_role("button", name="Create tenant").click()
    expect(page.get_by_role("alert")).to_contain_text("name")
    console.assert_inert(expect_text=False)
    assert page.get_by_label("Name", exact=True).input_value() == HOSTILE[:64]  # the field's maxlength
    page.get_by_label("Search tenants").fill(HOSTILE)
    page.get_by_role("button", name="Search").click()
    console.assert_inert()

    # A key's fields: an expiry that is markup is refused in place.
    page.goto(f"{console.ui}/tenants/hostile")
    page.get_by_label(re.compile("Expires at")).fill(HOSTILE)
    page.get_by_role("button", name="Issue key").click()
    expect(page.get_by_role("alert")).to_be_visible()
    console.assert_inert(expect_text=False)

    # Model names: any string in a key's model list (shown on its tenant's page); refused as a
    # version's name.
    page.get_by_role("link", name=re.compile("details and limits")).first.click()
    page.get_by_label(re.compile(r"^Models")).fill(HOSTILE)
    page.get_by_role("button", name="Save key limits").click()
    expect(page.get_by_role("status")).to_contain_text("Key limits saved")
    console.assert_inert(expect_text=False)
    page.goto(f"{console.ui}/tenants/hostile")
    console.assert_inert()
    page.goto(f"{console.ui}/models")
    page.get_by_label("Model name").fill(HOSTILE)
    page.get_by_label("Version label").fill(HOSTILE[:64])
    page.get_by_label(re.compile("Path on the server")).fill(HOSTILE)
    page.get_by_role("button", name="Register version").click()
    expect(page.get_by_role("alert")).to_be_visible()
    console.assert_inert(expect_text=False)

    # The `user` value of a request, in the usage breakdown by user (after its record settles).
    page.goto(f"{console.ui}/usage?tenant=hostile&group_by=user")
    assert wait_until(lambda: console.reload_and_count_text(HOSTILE) > 0, timeout_s=30)
    console.assert_inert()

    # The audit filter, echoed.
    page.goto(f"{console.ui}/audit")
    page.get_by_label("Tenant").fill(HOSTILE)
    page.get_by_role("button", name="Filter").click()
    console.assert_inert(expect_text=False)


def test_a_missing_or_wrong_csrf_token_is_refused(console: Console) -> None:
    page = console.page
    console.log_in(ADMIN_TOKEN)
    for tamper in ("el.remove()", "el.value = 'wrong'"):
        page.goto(f"{console.ui}/tenants")
        page.get_by_label("Name", exact=True).fill("csrf-victim")
        page.evaluate(
            f"() => {{ const el = document.querySelector('form.card input[name=csrf_token]'); {tamper}; }}"
        )
        with page.expect_response(lambda r: r.request.method == "POST") as answer:
            page.get_by_role("button", name="Create tenant").click()
        assert answer.value.status == 403
        expect(page.get_by_role("heading", name="Refused")).to_be_visible()
    page.goto(f"{console.ui}/tenants?q=csrf-victim")
    expect(page.get_by_text("0 of")).to_be_visible()


def test_a_tenant_key_reaches_no_console_page_or_action(served: Served, browser: Any) -> None:
    with served.admin() as admin:
        if admin.get("/admin/v1/tenants/keyholder").status_code == 404:
            assert admin.post("/admin/v1/tenants", json={"name": "keyholder"}).status_code == 201
        key = admin.post("/admin/v1/tenants/keyholder/keys", json={}).json()["key"]
    headers = {"authorization": f"Bearer {key}"}
    with console_context(browser, served.url, extra_headers=headers) as c:
        for path in c.page_paths():
            c.page.goto(f"{c.ui}{path}")
            expect(c.page.get_by_role("heading", name="Log in")).to_be_visible()
        # The key as the login token: refused in place.
        c.page.get_by_label("Admin token").fill(key)
        c.page.get_by_role("button", name="Log in").click()
        expect(c.page.get_by_role("alert")).to_be_visible()
        expect(c.page.get_by_role("heading", name="Log in")).to_be_visible()
        answer = c.page.request.post(f"{c.ui}/tenants", form={"name": "via-key"}, headers=headers)
        assert answer.status == 403
        assert c.page.request.get(f"{c.ui}/engine.json", headers=headers).status == 401


def test_login_attempts_are_throttled_and_a_right_token_still_logs_in(console: Console) -> None:
    page = console.page
    statuses: list[int] = []
    for _ in range(40):  # the admin throttle's default is 20 failures a minute per address
        page.goto(f"{console.ui}/login")
        page.get_by_label("Admin token").fill("wrong-token")
        with page.expect_response(lambda r: r.request.method == "POST") as answer:
            page.get_by_role("button", name="Log in").click()
        statuses.append(answer.value.status)
        if statuses[-1] == 429:
            break
    assert statuses[0] == 401 and statuses[-1] == 429, statuses
    expect(page.get_by_role("alert")).to_be_visible()
    console.assert_inert(expect_text=False)
    console.log_in(ADMIN_TOKEN)  # the throttle never refuses a valid credential
