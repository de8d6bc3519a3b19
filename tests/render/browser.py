"""Headless Chromium driven through Selenium for the HTML report's tests: a page's console messages, the requests
it made, and real mouse moves and clicks (CDP input events, as a user's). Chromium and its driver are Debian's
packages (.ci/run installs them); without them the browser tests skip with the reason."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)
DRIVER = shutil.which("chromedriver")
MISSING = ("no chromium on PATH (Debian: apt-get install chromium)" if CHROMIUM is None else
           "no chromedriver on PATH (Debian: apt-get install chromium-driver)" if DRIVER is None else None)
# the flags that keep Chromium off the network on a closed machine (it would otherwise try Google's hosts)
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--window-size=1400,1000")

# Text of every element in the page, shadow roots included (Bokeh draws its tooltips inside them).
SHADOW_TEXT = """
const out = [], wanted = arguments[0];
function walk(node) {
  if (node.shadowRoot) walk(node.shadowRoot);
  for (const child of node.children || []) walk(child);
  if (node.classList && [...node.classList].some((c) => c.toLowerCase().includes(wanted)))
    out.push(node.innerText || node.textContent);
}
walk(document.body);
return out;"""

# Per Bokeh plot: its title and the share of its composed canvas's pixels that are not white (blank: 0).
PLOTS = """
const out = [];
for (const doc of Bokeh.documents) for (const model of doc.all_models) {
  if (model.type !== "Figure") continue;
  const canvas = Bokeh.index.find_one(model).canvas_view.compose().canvas;
  const data = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
  let ink = 0;
  for (let i = 0; i < data.length; i += 4)
    if (data[i + 3] > 0 && Math.min(data[i], data[i + 1], data[i + 2]) < 230) ink++;
  out.push([model.title ? model.title.text : "", ink / (data.length / 4)]);
}
return out;"""

# Where in the window a data point of a named plot is drawn (the plot view's scales plus the plot's offset), after
# scrolling the point to the window's middle.
POINT = """
const [title, x, y] = arguments;
for (const doc of Bokeh.documents) for (const model of doc.all_models) {
  if (model.type !== "Figure" || !model.title || model.title.text !== title) continue;
  const view = Bokeh.index.find_one(model), frame = view.frame;
  const sx = frame.x_scale.compute(typeof x === "string" ? frame.x_range.synthetic(x) : x);
  const sy = frame.y_scale.compute(y);
  window.scrollBy(0, view.el.getBoundingClientRect().top + sy - window.innerHeight / 2);
  const box = view.el.getBoundingClientRect();
  return [box.left + sx, box.top + sy];
}
return null;"""


class Browser:
    """One Chromium session: open a page, read what it logged and requested, hover and click."""

    def __init__(self, driver: Any) -> None:
        self.driver = driver
        self.url = ""

    def open(self, page: Path) -> None:
        """Load ``page`` and wait until every Bokeh document has drawn."""
        self.url = page.as_uri()
        self.driver.get(self.url)
        deadline = time.monotonic() + 30
        while not self.driver.execute_script("return !window.Bokeh || Bokeh.documents.length > 0 && "
                                             "Bokeh.documents.every((d) => d.is_idle)"):
            if time.monotonic() > deadline:
                raise AssertionError(f"{page}: Bokeh never became idle; console: {self.console()}")
            time.sleep(0.1)

    def console(self, least: str = "WARNING") -> list[str]:
        """Console messages since the last call of level ``least`` or above (errors are SEVERE)."""
        levels = ["DEBUG", "INFO", "WARNING", "SEVERE"]
        return [e["message"] for e in self.driver.get_log("browser") if levels.index(e["level"]) >= levels.index(least)]

    def requests(self) -> list[str]:
        """URLs the page requested (its documentURL), but itself and inline data: URLs (file: ones count)."""
        sent = [m["params"] for m in (json.loads(e["message"])["message"] for e in self.driver.get_log("performance"))
                if m["method"] == "Network.requestWillBeSent"]
        return [p["request"]["url"] for p in sent if p.get("documentURL") == self.url
                and not p["request"]["url"].startswith("data:") and p["request"]["url"] != self.url]

    def plots(self) -> dict[str, float]:
        """Each chart's title -> its share of inked pixels."""
        return dict(self.driver.execute_script(PLOTS))

    def tooltips(self) -> list[str]:
        return [t for t in self.driver.execute_script(SHADOW_TEXT, "tooltip") if t and t.strip()]

    def point(self, title: str, x: object, y: float) -> tuple[float, float]:
        where = self.driver.execute_script(POINT, title, x, y)
        assert where is not None, f"no plot titled {title!r}"
        return where

    def hover(self, x: float, y: float) -> None:
        self._pointer("mouseMoved", x, y)

    def click(self, x: float, y: float) -> None:
        self._pointer("mouseMoved", x, y)
        for kind in ("mousePressed", "mouseReleased"):
            self._pointer(kind, x, y, button="left", clickCount=1)

    def _pointer(self, kind: str, x: float, y: float, **extra: object) -> None:
        self.driver.execute_cdp_cmd("Input.dispatchMouseEvent", {"type": kind, "x": x, "y": y, **extra})
        time.sleep(0.15)

    def visible_rows(self, caption: str) -> list[list[str]]:
        """The shown rows of the table with that caption (neither picked away nor filtered out), as cell texts."""
        return self.driver.execute_script("""
            for (const table of document.querySelectorAll("table.data"))
              if (table.caption && table.caption.textContent === arguments[0])
                return [...table.tBodies[0].rows].filter((r) => getComputedStyle(r).display !== "none")
                  .map((r) => [...r.cells].map((c) => c.textContent));
            return null;""", caption)

    def screenshot(self, path: Path) -> None:
        self.driver.save_screenshot(str(path))


@contextmanager
def chromium(tmp: Path) -> Iterator[Browser]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*FLAGS, f"--user-data-dir={tmp / 'profile'}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    try:
        yield Browser(driver)
    finally:
        driver.quit()
