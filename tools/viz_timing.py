"""How fast a `tgc viz` page opens: its size, and in headless Chromium (Selenium, as tests/test_viz.py drives it)
the navigation's load event, the page ready (summary inflated, tables drawn, the slowest kernel shown) and the
graph drawn, in ms since navigation started (the Navigation Timing API and the page's own marks), each opening
after the first (a warm browser, as a user's second look) and the first.

    python3 tools/viz_timing.py PAGE.html [PAGE.html ...] [--repeat N] [--screenshot OUT.png]

Exit 2 where no Chromium, chromedriver or selenium is found, or a page fails to open (the console errors printed).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile

ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage", "--window-size=1600,1000"]
MARKS = ("const n = performance.getEntriesByType('navigation')[0], d = document.body.dataset;"
         "return {load: n.loadEventEnd, ready: Number(d.readyMs), graph: Number(d.graphMs)}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("pages", nargs="+")
    ap.add_argument("--repeat", type=int, default=3, help="openings of each page (default 3)")
    ap.add_argument("--screenshot", metavar="OUT.png", help="save the last page as shown (1600x1000)")
    args = ap.parse_args(argv)
    binary = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
        from selenium.webdriver.support.ui import WebDriverWait
    except ImportError:
        binary = None
    if not binary or not shutil.which("chromedriver"):
        print("error: needs selenium, Chromium and chromedriver (see tests/test_viz.py)", file=sys.stderr)
        return 2
    opts = webdriver.ChromeOptions()
    for a in ARGS:
        opts.add_argument(a)
    profile = tempfile.mkdtemp(prefix="viz-timing-")
    opts.add_argument(f"--user-data-dir={profile}")
    opts.binary_location = binary
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=opts, service=Service(shutil.which("chromedriver")))
    status = 0
    try:
        for page in args.pages:
            runs = []
            for _ in range(max(args.repeat, 1)):
                driver.get_log("browser")
                driver.get("file://" + os.path.abspath(page))
                WebDriverWait(driver, 120).until(lambda d: d.execute_script(
                    "const s = document.body.dataset; return s.ready === 'error' || (s.ready === '1' && "
                    "(s.graph === '1' || !document.querySelector('#graph svg, #graph-wait')))"))
                errors = [e["message"] for e in driver.get_log("browser") if e["level"] in ("SEVERE", "WARNING")]
                if errors:
                    print(f"error: {page}: {errors}", file=sys.stderr)
                    status = 2
                runs.append(driver.execute_script(MARKS))
            later = runs[1:] or runs
            med = {k: statistics.median(r[k] for r in later) for k in ("load", "ready", "graph")}
            print(f"{page}: {os.path.getsize(page) / 1e6:.2f} MB; first opening: load {runs[0]['load']:.0f} ms, "
                  f"ready {runs[0]['ready']:.0f} ms, graph {runs[0]['graph']:.0f} ms; median of the next "
                  f"{len(later)}: load {med['load']:.0f} ms, ready {med['ready']:.0f} ms, graph {med['graph']:.0f} ms")
        if args.screenshot:
            driver.save_screenshot(args.screenshot)
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
