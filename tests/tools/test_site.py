"""The manual as a site: `mkdocs build --strict` (what `make docs` serves) builds offline,
every page of docs/ is in it, its pages load nothing from another host, and the generated
reference tables hold every configuration key, REST route and gRPC method."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from doq_lib.config import IGNORED, KEY_DOCS, KEYS
from doq_lib.http import ROUTES, openapi
from tests.harness import REPO

sys.path.insert(0, os.path.join(REPO, "scripts"))
import docs_hooks  # noqa: E402

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    # no way out: a fetch would go to a proxy that is not there
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "HTTP_PROXY": "http://127.0.0.1:9",
           "HTTPS_PROXY": "http://127.0.0.1:9", "http_proxy": "http://127.0.0.1:9",
           "https_proxy": "http://127.0.0.1:9", "NO_PROXY": "", "no_proxy": ""}
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                           str(out)], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=240)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "WARNING" not in done.stderr, done.stderr[-4000:]
    return out


def _nav_pages(nav: list[object]) -> list[str]:
    out: list[str] = []
    for item in nav:
        value = next(iter(item.values())) if isinstance(item, dict) else item
        out += _nav_pages(value) if isinstance(value, list) else [str(value)]
    return out


def test_every_page_of_docs_is_in_the_site_and_its_nav(site: Path) -> None:
    config = yaml.safe_load((Path(REPO) / "mkdocs.yml").read_text(encoding="utf-8"))
    pages = sorted(p.name for p in (Path(REPO) / "docs").glob("*.md"))
    assert sorted(_nav_pages(config["nav"])) == pages
    for page in pages:
        built = site / ("index.html" if page == "index.md" else f"{page[:-3]}/index.html")
        assert built.is_file(), page


def test_the_pages_load_nothing_from_another_host(site: Path) -> None:
    """No font, style sheet or script from a CDN: the site works offline, as the node's own
    /docs page does."""
    remote = []
    for path in site.rglob("*"):
        if path.suffix not in (".html", ".css", ".js"):
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        remote += [f"{path.name}: {m}" for m in re.findall(
            r'<(?:script|link|img)[^>]*(?:src|href)="(?:https?:)?//[^"]*"', text)]
        if path.suffix == ".css":
            remote += [f"{path.name}: {m}" for m in re.findall(
                r"(?:@import|url\()\s*['\"]?(?:https?:)?//[^)'\"]*", text)]
    assert not remote, remote[:10]


def test_the_reference_tables_are_generated_from_the_code(site: Path) -> None:
    config = (site / "configuration" / "index.html").read_text(encoding="utf-8")
    for key in KEYS:
        assert (f"<code>{key}</code>" in config), key
    shown = [k for k in KEYS if IGNORED not in KEY_DOCS[k]]
    assert config.count("<tr>") == len(shown) + 1          # a header and a row per key
    api = (site / "api" / "index.html").read_text(encoding="utf-8")
    for _, rule, _, _ in ROUTES:
        assert f"<code>{openapi.openapi_path(rule)}</code>" in api, rule
    proto = (Path(REPO) / "proto" / "doq.proto").read_text(encoding="utf-8")
    methods = re.findall(r"^\s*rpc (\w+)\(", proto, re.M)
    assert len(methods) > 30
    for name in methods:
        assert f"<code>{name}</code>" in api, name


def test_an_unknown_generated_table_fails_the_build() -> None:
    with pytest.raises(ValueError, match="unknown generated table 'nope'"):
        docs_hooks.expand("text\n<!-- generated: nope -->\n")
    assert docs_hooks.expand("no marker here") == "no marker here"
