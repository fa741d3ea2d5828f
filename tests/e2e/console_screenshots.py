"""`make screenshots`: one PNG (1280x800) per admin-console page into docs/console/.

Serves `weir serve`'s app (build_server_app) on 127.0.0.1 over two tiny random Llamas (versions v1
and v2 of the model `tiny`, in a temporary folder), adds a few tenants, keys and bounded requests
through the admin API and the openai client, then opens each page in Debian's chromium with
playwright and saves what the browser shows.

Run: python -m tests.e2e.console_screenshots --out docs/console
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path

import httpx
import openai

from tests.e2e.console_browser import console_context, launch_chromium
from tests.engine.tiny_models import make_tiny_model
from tests.gateway.harness import serve_in_thread, wait_until
from weir.gateway.server.bootstrap import build_server_app
from weir.gateway.settings.settings import AuthMode, LogLevel, Settings

MODEL = "tiny"
TOKEN = "screenshots-admin-token"
TENANTS = {"acme": 6, "globex": 3, "initech": 1}  # requests each
USERS = ("alice", "bob", "carol")


def _populate(url: str, paths: dict[str, Path]) -> None:
    with httpx.Client(base_url=url, headers={"authorization": f"Bearer {TOKEN}"}, timeout=300) as admin:
        register = {"name": MODEL, "version": "v2", "path": str(paths["v2"]), "kv_cache_tokens": 2048}
        admin.post("/admin/v1/models", json=register).raise_for_status()
        admin.post(f"/admin/v1/models/{MODEL}/versions/v2/load").raise_for_status()
        for tenant in TENANTS:
            admin.post("/admin/v1/tenants", json={"name": tenant}).raise_for_status()
        split = {"split": {"v1": 80, "v2": 20}, "pins": {"initech": "v2"}}
        admin.put(f"/admin/v1/models/{MODEL}/traffic", json=split).raise_for_status()
        for tenant, num_requests in TENANTS.items():
            admin.post(f"/admin/v1/tenants/{tenant}/keys", json={}).raise_for_status()
            key = admin.post(f"/admin/v1/tenants/{tenant}/keys", json={}).json()["key"]
            with openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=120) as client:
                for i in range(num_requests):
                    client.chat.completions.create(
                        model=MODEL,
                        messages=[{"role": "user", "content": f"Hello number {i}"}],
                        max_tokens=8,
                        user=USERS[i % len(USERS)],
                    )
        total = sum(TENANTS.values())

        def settled() -> bool:
            report = admin.get(
                "/admin/v1/usage/report", params={"since": "2000-01-01", "until": "2100-01-01"}
            )
            return bool(report.status_code == 200 and report.json()["totals"]["requests"] == total)

        wait_until(settled, timeout_s=60)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=Path("docs/console"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory(prefix="weir-screenshots-") as tmp:
        root = Path(tmp)
        paths = {
            v: make_tiny_model(root / v, arch="llama", num_kv_heads=2, seed=s)
            for v, s in (("v1", 0), ("v2", 1))
        }
        settings = Settings(
            data_dir=root / "data",
            admin_token=TOKEN,
            auth=AuthMode.KEYS,
            model_path=paths["v1"],
            served_model_name=MODEL,
            model_version="v1",
            device="cpu",
            kv_cache_tokens=2048,
            log_level=LogLevel.WARNING,
        )
        with serve_in_thread(build_server_app(settings)) as url, sync_playwright() as pw:
            _populate(url, paths)
            browser = launch_chromium(pw)
            with console_context(browser, url) as console:
                page = console.page
                page.goto(f"{console.ui}/login")
                page.screenshot(path=args.out / "login.png")
                console.log_in(TOKEN)
                shots = {
                    "tenants": "/tenants",
                    "tenant": "/tenants/acme",
                    "usage": "/usage?tenant=acme&group_by=user",
                    "models": "/models",
                    "engine": "/engine",
                    "audit": "/audit",
                }
                for name, path in shots.items():
                    page.goto(console.ui + path)
                    if name == "engine":  # after one refresh of the live table
                        page.get_by_text("Updated").wait_for(timeout=30_000)
                    page.screenshot(path=args.out / f"{name}.png")
                    print(f"wrote {args.out / name}.png", flush=True)
                page.goto(f"{console.ui}/tenants/acme")
                page.get_by_role("link", name=re.compile("details and limits")).first.click()
                page.screenshot(path=args.out / "key.png")
            browser.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
