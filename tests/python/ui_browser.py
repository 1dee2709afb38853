"""The dashboard in a real browser: headless Chromium driven by selenium, against a running corral.

    ui_browser.py URL open [SCREENSHOT_DIR]   models, load/unload, live updates, playground, logs,
                                              performance charts
    ui_browser.py URL keys KEY [SCREENSHOT_DIR] [APP_KEY]
                                              with apiKeys: nothing shows before the key is given;
                                              with APP_KEY (an inference key named `apps`), the
                                              activity page tells and filters requests by key

Exits 0 when every check passed, 77 when Chromium or chromedriver is not installed, 1 otherwise.
The corral at URL runs the config tests/ui.rs writes: models `m1` (chat), `m2` (embeddings) and
`m3` (never loaded before the logs check; `-c 8192 -np 2` and tools) and `slow` (loads for 4 s) on a device `gpu0`; with keys, a model `hidden-model`.
"""

import json
import os
import signal
import shutil
import sys
import threading
import time
import urllib.parse
import urllib.request

from selenium.webdriver.common.keys import Keys

SKIP = 77


DRIVER = None


def fail(msg):
    print(f"FAIL: {msg}", flush=True)
    if DRIVER:
        print(f"at {DRIVER.current_url}; browser log: {DRIVER.get_log('browser')}", flush=True)
        print(f"page text: {DRIVER.find_element('css selector', 'body').text[:3000]}", flush=True)
    sys.exit(1)


def browser():
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_path = shutil.which("chromedriver")
    if not chromium or not driver_path:
        print("SKIP: chromium or chromedriver is not installed", flush=True)
        sys.exit(SKIP)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1280,860", "--force-prefers-reduced-motion"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(options=opts, service=Service(executable_path=driver_path))


class Page:
    def __init__(self, driver, url, allowed_errors=()):
        self.d, self.url, self.allowed = driver, url.rstrip("/"), allowed_errors

    def open(self, path):
        self.d.get(self.url + path)
        self.no_console_errors(path)

    def wait(self, what, cond, timeout=15):
        deadline = time.time() + timeout
        last = None
        while time.time() < deadline:
            try:
                value = cond()
                if value:
                    return value
            except Exception as e:  # the element may not exist yet, or be replaced while read
                last = e
            time.sleep(0.05)
        fail(f"timed out waiting for {what} (last error: {last})")

    def press(self, selector, keys=None):
        """Clicks (or types `keys` into) an element, again if a redraw replaced it meanwhile."""
        from selenium.common.exceptions import StaleElementReferenceException

        def attempt():
            try:
                el = self.css(selector)[0]
                el.send_keys(keys) if keys else el.click()
                return True
            except (StaleElementReferenceException, IndexError):
                return False
        self.wait(f"{selector} to take the input", attempt)

    def css(self, selector):
        return self.d.find_elements("css selector", selector)

    def text(self, selector, attribute=None):
        """An element's text (or attribute), read again if a redraw replaced it meanwhile."""
        from selenium.common.exceptions import StaleElementReferenceException
        for _ in range(20):
            try:
                found = self.css(selector)
                if not found:
                    return None if attribute else ""
                return found[0].get_attribute(attribute) if attribute else found[0].text
            except StaleElementReferenceException:
                time.sleep(0.05)
        fail(f"{selector} keeps being replaced")

    def no_console_errors(self, where):
        errors = [e["message"] for e in self.d.get_log("browser")
                  if e["level"] == "SEVERE" and not any(a in e["message"] for a in self.allowed)]
        if errors:
            fail(f"console errors on {where}: {errors}")

    def shot(self, shots, name):
        if shots:
            time.sleep(0.3)  # let the last frame paint
            self.d.save_screenshot(f"{shots}/ui-{name}.png")


def http(method, url, key=None, body=None):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    req = urllib.request.Request(url, method=method, headers=headers, data=data)
    with urllib.request.urlopen(req, timeout=30) as resp:
        return resp.read()


def metrics(url):
    return http("GET", url + "/metrics").decode()


def running(url):
    return {m["model"]: m["state"] for m in json.loads(http("GET", url + "/running"))["running"]}


def model_state(page, model):
    return page.text(f'tr[data-model="{model}"] td.state', "data-state")


def check_pages(page, url, shots):
    """Each page loads, draws its heading and logs no console error."""
    for path, heading in [("/ui/", "Models"), ("/ui/models", "Models"), ("/ui/activity", "Activity"),
                          ("/ui/performance", "Performance"), ("/ui/logs", "Logs"),
                          ("/ui/playground", "Playground"), ("/ui/events", "Events")]:
        page.open(path)
        page.wait(f"the {heading} heading on {path}", lambda: page.text("main h1") == heading)
        time.sleep(0.3)
        page.no_console_errors(path)
    light = page.d.execute_script("return getComputedStyle(document.body).backgroundColor")
    page.d.execute_cdp_cmd("Emulation.setEmulatedMedia",
                           {"features": [{"name": "prefers-color-scheme", "value": "dark"}]})
    dark = page.d.execute_script("return getComputedStyle(document.body).backgroundColor")
    page.d.execute_cdp_cmd("Emulation.setEmulatedMedia", {"features": []})
    if light == dark:
        fail(f"the dark scheme changes nothing ({light})")


def check_load_and_unload(page, url, shots):
    """The Load and Unload buttons change what /running says, and the page follows."""
    page.open("/ui/models")
    page.wait("m1 listed as stopped", lambda: model_state(page, "m1") == "stopped")
    panel = page.text("section[aria-label='Memory']")
    if "gpu0" not in panel:
        fail("the memory panel does not show gpu0")
    host = page.text("section[aria-label='Memory'] [data-host]")
    if "hostMemory 16.0 GiB" not in host or "charged" not in host:
        fail(f"the memory panel's host row does not show the hostMemory budget: {host!r}")
    page.press('button[aria-label="Load m1"]')
    page.wait("/running to list m1 ready", lambda: running(url).get("m1") == "ready")
    page.wait("the page to show m1 ready", lambda: model_state(page, "m1") == "ready")
    page.wait("m1's lifecycle status to read active",
              lambda: page.text('tr[data-model="m1"] [data-lifecycle]') == "active")
    # by keyboard: a real button answers Enter
    page.press('button[aria-label="Unload m1"]', Keys.ENTER)
    page.wait("/running to drop m1", lambda: "m1" not in running(url))
    page.wait("the page to show m1 stopped", lambda: model_state(page, "m1") == "stopped")
    page.wait("m1's lifecycle status to read inactive",
              lambda: page.text('tr[data-model="m1"] [data-lifecycle]') == "inactive")
    page.no_console_errors("load and unload")


def check_context_column(page, url, shots):
    """The Context column tells the context one request can use and the capabilities."""
    page.open("/ui/models")
    cell = 'tr[data-model="m3"] td.context'
    page.wait("m3's context", lambda: page.text(f"{cell} [data-context]", "data-context") == "4096")
    if "4,096 tokens" not in page.text(cell):
        fail(f"m3's context cell reads {page.text(cell)!r}")
    if "function calling" not in page.text(cell):
        fail(f"m3's capabilities are missing: {page.text(cell)!r}")
    page.no_console_errors("context column")


def check_live_update(page, url, shots):
    """A model loaded through the API shows as ready without reloading the page."""
    page.d.execute_script("window.__sameDocument = true")
    http("POST", url + "/api/models/load/m2")
    page.wait("m2 to show ready", lambda: model_state(page, "m2") == "ready")
    if not page.d.execute_script("return window.__sameDocument === true"):
        fail("the page reloaded")


def check_playground(page, url, shots):
    """The chat streams the fake engine's tokens as they come; the embeddings try answers."""
    http("POST", url + "/api/models/load/m1")
    page.open("/ui/playground")
    page.wait("m1 in the model picker", lambda: page.css('#pg-model option[value="m1"]'))
    page.d.execute_script("document.getElementById('pg-model').value = 'm1'")
    page.css("#pg-input")[0].send_keys("Say something in **bold**")
    page.css("#pg-send")[0].click()
    lengths = set()
    deadline = time.time() + 30
    while time.time() < deadline:
        answer = page.text("[data-role=assistant]")
        lengths.add(len(answer))
        if page.css("#pg-send") and page.css("#pg-send")[0].is_enabled() and answer:
            break
        time.sleep(0.02)
    answer = page.text("[data-role=assistant]")
    if "tok" not in answer:
        fail(f"the answer does not hold the engine's tokens: {answer!r}")
    partial = {n for n in lengths if 0 < n < len(answer)}
    if not partial:
        fail(f"the answer appeared at once, not streamed (lengths seen: {sorted(lengths)})")
    page.d.execute_script("document.getElementById('pg-model').value = 'm2'")
    page.css("#pg-embed-input")[0].send_keys("hello")
    page.css("#pg-embed")[0].click()
    page.wait("the embedding's size", lambda: "16 dimensions" in page.text("#pg-embed-out"))
    check_markdown(page)
    page.no_console_errors("playground")
    page.shot(shots, "playground")


def check_load_progress(page, url, shots):
    """A load shows its elapsed time against its deadline, moving while the engine loads."""
    page.open("/ui/models")
    page.wait("slow listed", lambda: model_state(page, "slow") == "stopped")
    loading = threading.Thread(target=http, args=("POST", url + "/api/models/load/slow"))
    loading.start()
    row = 'tr[data-model="slow"]'
    first = page.wait("the load's progress", lambda: page.css(f'{row} [aria-label="loading slow"]')
                      and "deadline" in page.text(row) and page.text(row))
    page.shot(shots, "loading")
    time.sleep(1.2)
    if model_state(page, "slow") == "starting" and page.text(row) == first:
        fail(f"the load's elapsed time does not move: {first!r}")
    loading.join()
    page.wait("slow ready", lambda: model_state(page, "slow") == "ready")
    page.no_console_errors("load progress")


MARKDOWN_PROBE = """
const done = arguments[arguments.length - 1];
import('/ui/markdown.js').then((m) => {
  const div = document.createElement('div');
  div.append(m.render('**bold** <img src=x onerror="window.__xss = 1"> `code`\\n\\n- item'));
  done([div.querySelectorAll('img').length, div.querySelector('strong')?.textContent,
        div.querySelector('code')?.textContent, div.querySelectorAll('li').length]);
});
"""


def check_markdown(page):
    """Model output is rendered as Markdown built from text nodes: HTML in it stays text."""
    images, bold, code, items = page.d.execute_async_script(MARKDOWN_PROBE)
    if (images, bold, code, items) != (0, "bold", "code", 1):
        fail(f"markdown rendered {images} images, bold {bold!r}, code {code!r}, {items} items")


def check_captures(page, url, shots):
    """A captured request's body and its answer show on the activity page, as text."""
    http("POST", url + "/v1/chat/completions",
         body={"model": "m2", "messages": [{"role": "user", "content": "<b>captured</b>"}]})
    page.open("/ui/activity")
    page.wait("a request with a capture", lambda: page.css("button[data-capture]"))
    page.press("button[data-capture]")
    page.wait("the capture's request body", lambda: "<b>captured</b>" in page.text("#capture pre.body"))
    if page.css("#capture b"):
        fail("a captured body was rendered as HTML")
    if "Response" not in page.text("#capture"):
        fail("the capture shows no response")
    page.no_console_errors("captures")


def check_logs(page, url, shots):
    """The logs page shows, live, a line corral logs after it opened; a config reload ends the
    stream (its keys and masks may change) and the page opens it again, so a line logged after
    the reload shows too (CORRAL_PID: corral's process, sent SIGHUP)."""
    page.open("/ui/logs")
    page.wait("corral's log", lambda: page.css("pre[data-log=proxy]") and page.text("pre[data-log=proxy]"))
    logged = lambda: [line for line in page.text("pre[data-log=proxy]").splitlines()
                      if "starting" in line and "m3" in line]
    if logged():
        fail("m3 was started before the check")
    http("POST", url + "/api/models/load/m3")
    page.wait("the line that says m3 is starting", logged)
    pid = os.environ.get("CORRAL_PID")
    if pid:
        os.kill(int(pid), signal.SIGHUP)
        reloaded = 'corral_config_reloads_total{result="success"} 1'
        page.wait("the reload applied", lambda: reloaded in metrics(url))
        http("POST", url + "/api/models/unload/m3")
        page.wait("/running to drop m3", lambda: "m3" not in running(url))
        http("POST", url + "/api/models/load/m3")
        page.wait("m3's second start, logged after the reload", lambda: len(logged()) >= 2, timeout=20)
    page.no_console_errors("logs")


def check_performance(page, url, shots):
    """The performance page draws its charts as SVG paths: the system's at once, a model's once it
    has served requests; each chart is reachable by keyboard and reads its latest values."""
    http("POST", url + "/v1/chat/completions", body={"model": "m1", "messages": [{"role": "user", "content": "hi"}]})
    page.open("/ui/performance")
    page.wait("the Performance heading", lambda: page.text("main h1") == "Performance")
    page.wait("a system chart drawn", lambda: page.css("#perf-system svg path.line"))
    page.wait("a model chart drawn (the sampler ticks every 5 s)",
              lambda: page.css("#perf-models svg path.line"), timeout=20)
    # a model joins the charts at the first sample after its requests (every 5 s)
    label = lambda: page.text("#perf-models figure.chart", "aria-label") or ""
    page.wait("the model chart's label reading m1's latest values",
              lambda: "m1" in label() and "Latest" in label(), timeout=20)
    # by keyboard: the window picker, then Pause (a real button), then the charts themselves
    page.d.execute_script("document.querySelector('#perf-window').focus()")
    active = lambda: page.d.execute_script(
        "const a = document.activeElement; return a.id || a.tagName")
    page.d.switch_to.active_element.send_keys(Keys.TAB)
    if active() != "perf-pause":
        fail(f"Pause does not follow the window picker by keyboard (focus on {active()})")
    page.d.switch_to.active_element.send_keys(Keys.ENTER)
    page.wait("Pause pressed", lambda: page.text("#perf-pause", "aria-pressed") == "true")
    page.d.switch_to.active_element.send_keys(Keys.ENTER)
    page.d.switch_to.active_element.send_keys(Keys.TAB)
    if active() != "FIGURE":
        fail(f"the charts are not reachable by keyboard (focus on {active()})")
    page.no_console_errors("performance")
    page.shot(shots, "performance")


def screenshots(page, url, shots):
    """Each page once it has drawn its data (the activity page also proves rows arrive)."""
    for path, name, drawn in [("/ui/models", "models", 'tr[data-model="m1"]'),
                              ("/ui/models/m1", "model-details", "pre.cmd"),
                              ("/ui/activity", "activity", "table.activity tbody tr"),
                              ("/ui/logs", "logs", "pre[data-log=proxy]"),
                              ("/ui/events", "events", "#event-list tr")]:
        page.open(path)
        page.wait(f"{path} drawn", lambda: page.css(drawn))
        page.shot(shots, name)


def open_mode(driver, url, shots):
    page = Page(driver, url)
    started = time.time()
    for check in (check_pages, check_load_and_unload, check_context_column, check_live_update, check_load_progress,
                  check_playground, check_captures,
                  check_logs, check_performance, screenshots):
        check(page, url, shots)
        print(f"{check.__name__}: done at {time.time() - started:.1f} s", flush=True)


def keys_mode(driver, url, key, shots):
    """Before a key is given only the key form shows and no data route is asked; then the models do."""
    page = Page(driver, url, allowed_errors=("status of 401",))
    page.open("/ui/")
    page.wait("the key form", lambda: page.css("#api-key"))
    time.sleep(0.5)
    if "hidden-model" in page.d.page_source:
        fail("a model name shows before the key is given")
    asked = page.d.execute_script(
        "return performance.getEntriesByType('resource').map(e => e.name)")
    data = [u for u in asked if not urllib.parse.urlparse(u).path.startswith("/ui/")]
    if data:
        fail(f"data routes were asked before the key was given: {data}")
    if page.css("#nav")[0].is_displayed():
        fail("the navigation shows before the key is given")
    page.shot(shots, "key")
    page.css("#api-key")[0].send_keys("not-the-key")
    page.css("form.keyform button")[0].click()
    page.wait("the refusal", lambda: "not accepted" in page.text("form.keyform [role=alert]"))
    if "hidden-model" in page.d.page_source:
        fail("a model name shows after a wrong key")
    page.css("#api-key")[0].clear()
    page.css("#api-key")[0].send_keys(key)
    page.css("form.keyform button")[0].click()
    page.wait("the models after the key", lambda: page.css('tr[data-model="hidden-model"]'))
    asked = page.d.execute_script(
        "return performance.getEntriesByType('resource').map(e => e.name)")
    if any(key in u for u in asked):
        fail("the key appeared in a URL")
    page.no_console_errors("keys")


def check_usage_by_key(page, url, admin_key, app_key, shots):
    """Requests made with two keys show on the activity page under each key's label (`apps`, and
    the admin key's fingerprint), never the key; the key filter keeps one key's requests."""
    chat = {"model": "hidden-model", "messages": [{"role": "user", "content": "hi"}]}
    for k in (app_key, app_key, admin_key):
        http("POST", url + "/v1/chat/completions", key=k, body=chat)
    page.press('a[href="/ui/activity"]')
    cells = lambda: [c.text for c in page.css('table.activity td[data-col="key"]')]
    page.wait("three rows with their keys", lambda: len(cells()) == 3)
    labels = cells()
    if labels.count("apps") != 2 or any(k in " ".join(labels) for k in (admin_key, app_key)):
        fail(f"the key column shows {labels}")
    page.wait("the key filter's options", lambda: "apps" in page.text("#activity-key"))
    from selenium.webdriver.support.ui import Select
    Select(page.css("#activity-key")[0]).select_by_value("apps")
    page.wait("only the apps key's rows", lambda: cells() == ["apps", "apps"])
    page.shot(shots, "activity-keys")
    page.no_console_errors("activity by key")


def main():
    global DRIVER
    url, mode = sys.argv[1], sys.argv[2]
    driver = DRIVER = browser()
    try:
        if mode == "open":
            open_mode(driver, url, sys.argv[3] if len(sys.argv) > 3 else None)
        elif mode == "keys":
            shots = sys.argv[4] if len(sys.argv) > 4 and sys.argv[4] else None
            keys_mode(driver, url, sys.argv[3], shots)
            if len(sys.argv) > 5:
                check_usage_by_key(Page(driver, url), url, sys.argv[3], sys.argv[5], shots)
        else:
            fail(f"unknown mode {mode}")
    finally:
        driver.quit()
    print("OK", flush=True)


if __name__ == "__main__":
    main()
