"""The HTML report, checked in a real headless Chromium: DOM, interaction, escaping, looks."""

from __future__ import annotations

import json
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from mlagents_envs import timers as ml

from otel_rl._internal import semconv as sc
from otel_rl._internal.spandata import SpanData, SpanEvent
from otel_rl._internal.tree import Tree
from otel_rl._internal.treebuild import build_tree
from otel_rl.renderers import html

REPO = Path(__file__).resolve().parent.parent
XSS_NAMES = (
    "<script>window.__pwned=1</script>",
    '<img src=x onerror="window.__pwned=2">',
    "</script><script>window.__pwned=3</script>",
)
MS = 1_000_000


def run_spans(iterations: int = 12, workers: int = 3) -> list[SpanData]:
    """Spans of a PPO-like run, as otel_rl records them: a run span; env_step with rollout
    blocks in 3 worker processes (the last one slow) and a policy block in the main thread;
    update with a block in a summary-writer thread; one update fails; a block named like
    markup. Deterministic."""
    trace = "4bf92f3577b34da6a3ce929d0e0e4736"
    next_id = iter(range(1, 1_000_000))
    main = {sc.SERVICE_NAME: "ppo-train", sc.PROCESS_PID: 100, sc.RUN_ID: "run-1"}
    pools = [
        {**main, sc.PROCESS_PID: 201 + i, sc.WORKER_ROLE: "rollout", sc.WORKER_INDEX: i}
        for i in range(workers)
    ]
    t0 = 1_700_000_000_000_000_000
    spans: list[SpanData] = []

    def add(name: str, parent: str, start: float, end: float, resource: dict[str, Any] = main,
            tid: int = 1, thread: str = "MainThread", **attrs: Any) -> SpanData:  # fmt: skip
        span = SpanData(
            trace, f"{next(next_id):016x}", parent, name, int(start), int(end),
            {sc.THREAD_ID: tid, sc.THREAD_NAME: thread, **attrs}, resource,
        )  # fmt: skip
        spans.append(span)
        return span

    run = add("root", "", t0, t0, **{sc.KIND: sc.KIND_RUN, "otel_rl.gauge.reward.value": 1.5})
    t = t0 + 2 * MS
    for it in range(iterations):
        env = add("env_step", run.span_id, t, t + 14 * MS)
        for w in range(workers):
            start, length = t + (0.2 + 0.1 * w) * MS, (9 + w + (4 if w == workers - 1 else 0)) * MS
            step = add("rollout_step", env.span_id, start, start + length, pools[w], tid=7)
            add("sim", step.span_id, start + 0.5 * MS, start + 0.8 * length, pools[w], tid=7)
            add(XSS_NAMES[0], step.span_id, start + 0.8 * length, start + 0.95 * length,
                pools[w], tid=7)  # fmt: skip
        add("policy_forward", env.span_id, t + 0.2 * MS, t + 3 * MS)
        t += 14 * MS
        update = add("update", run.span_id, t, t + 6 * MS)
        if it == 3:
            update.is_error = True
            update.events.append(
                SpanEvent("exception", int(t + 5 * MS),
                          {"exception.type": "ValueError", "exception.message": "loss is NaN"})
            )  # fmt: skip
        add("backward", update.span_id, t + 0.5 * MS, t + 5 * MS)
        add("write_summary", update.span_id, t + 0.5 * MS, t + 2 * MS, tid=2, thread="writer")
        t += 7 * MS
    run.end_ns = int(t + 2 * MS)
    return spans


def mlagents_tree() -> Tree:
    """A real ML-Agents timer tree with a trainer thread merged in as a parallel branch."""
    stack = ml.TimerStack()
    for _ in range(4):
        with ml.hierarchical_timer("env_step", stack):
            with ml.hierarchical_timer("communicator.exchange", stack):
                sum(range(3000))
            with ml.hierarchical_timer("process_trajectory", stack):
                sum(range(1000))
    ml.set_gauge("reward.mean", 0.75, stack)
    ml.add_metadata("run_id", "ppo-7", stack)
    trainer = ml.TimerStack()
    with ml.hierarchical_timer("trainer_advance", trainer):
        with ml.hierarchical_timer("update_policy", trainer):
            sum(range(5000))
    stack.root.get_child("env_step").merge(trainer.root, root_name="thread_root", is_parallel=True)
    return Tree.from_dict(ml.get_timer_tree(stack))


def _data_block(page: str) -> Any:
    match = re.search(
        r'<script id="report-data" type="application/json">(.*?)</script>', page, re.S
    )
    assert match is not None
    return json.loads(match.group(1))


def _json_path(path: tuple[str, ...]) -> str:
    # What JSON.stringify writes for the path array.
    return json.dumps(list(path), separators=(",", ":"), ensure_ascii=False)


# -- the page as text ---------------------------------------------------------------------


def test_data_is_embedded_as_escaped_json_that_reads_back() -> None:
    tree = mlagents_tree()
    tree.root.child(XSS_NAMES[2]).add(0.5)
    page = html.render(tree, run_spans(iterations=2), title=XSS_NAMES[0])
    # Only the page's two script elements close: no name can end the data block early.
    assert page.count("</script") == 2
    data = _data_block(page)
    assert data["tree"]["k"][-1]["n"] == XSS_NAMES[2]
    assert data["title"] == XSS_NAMES[0]
    assert data["timeline"]["total"] == len(run_spans(iterations=2))
    assert f"<title>{XSS_NAMES[0]}" not in page
    assert "<title>&lt;script&gt;window.__pwned=1&lt;/script&gt;</title>" in page


def test_page_loads_nothing_from_the_network() -> None:
    page = html.render(mlagents_tree(), run_spans(iterations=2))
    assert re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page) is None
    assert "<link" not in page
    assert "Content-Security-Policy" in page and "default-src 'none'" in page


def test_capped_timeline_summarises_the_whole_run_with_its_longest_spans() -> None:
    spans = run_spans()
    data = _data_block(html.render(build_tree(spans), spans, max_spans=40))["timeline"]
    assert (data["shown"], data["total"]) == (40, len(spans))
    t0 = min(s.start_ns for s in spans)
    shown = {(round(row[1] * 1e6) + t0, round(row[2] * 1e6) + t0) for row in data["spans"]}
    durations = sorted((s.end_ns - s.start_ns for s in spans), reverse=True)
    # The longest spans, from anywhere in the run; every one at least minMs long...
    assert sorted((e - b for b, e in shown), reverse=True) == durations[:40]
    assert data["minMs"] == pytest.approx(durations[39] / 1e6)
    # ...with their parents (a parent lasts at least as long as its child)...
    rows = data["spans"]
    assert all(row[6] >= 0 or row[3] == 0 for row in rows)
    # ...and the view is the whole run, not its first seconds.
    assert data["end"] == pytest.approx((max(s.end_ns for s in spans) - t0) / 1e6)
    assert data["runEnd"] == data["end"]
    everything = _data_block(html.render(build_tree(spans), spans))["timeline"]
    assert everything["shown"] == everything["total"] == len(spans)
    assert everything["end"] == everything["runEnd"]


# -- the page in a real browser -------------------------------------------------------------


@pytest.fixture
def open_report(chromium_driver: Any, tmp_path: Path) -> Callable[..., Any]:
    """Render, write and load a report; fail on any console error the page produced."""

    def load(tree: Tree, spans: list[SpanData] | None = None, **kwargs: Any) -> Any:
        path = tmp_path / "report.html"
        path.write_text(html.render(tree, spans, **kwargs), encoding="utf-8")
        chromium_driver.get_log("browser")  # drop what earlier pages logged
        chromium_driver.get(path.as_uri())
        severe = [e for e in chromium_driver.get_log("browser") if e["level"] == "SEVERE"]
        assert severe == []
        return chromium_driver

    return load


def _icicle_nodes(driver: Any) -> list[dict[str, Any]]:
    return list(
        driver.execute_script(
            """return Array.from(document.querySelectorAll('#icicle div.node')).map(e => ({
                 name: e.dataset.name, path: e.dataset.path, total: +e.dataset.total,
                 self: +e.dataset.self, count: +e.dataset.count, parallel: e.dataset.parallel,
                 cls: e.className, text: e.querySelector('.nm').textContent,
                 width: e.getBoundingClientRect().width,
                 shown: getComputedStyle(e).display !== 'none'}))"""
        )
    )


def _wait(condition: Callable[[], bool], timeout: float = 3.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


@pytest.mark.chromium
def test_icicle_shows_every_node_of_a_real_mlagents_tree(open_report: Callable[..., Any]) -> None:
    tree = mlagents_tree()
    driver = open_report(tree)
    by_path = {node["path"]: node for node in _icicle_nodes(driver)}
    expected = [((), tree.root), *tree.root.walk()]
    assert len(by_path) == len(expected)
    for path, node in expected:
        shown = by_path[_json_path(path)]
        assert shown["name"] == node.name == shown["text"]
        assert shown["total"] == pytest.approx(node.total)
        assert shown["self"] == pytest.approx(node.self_time)
        assert shown["count"] == node.count
        assert shown["parallel"] == ("true" if node.is_parallel else "false")
        assert shown["shown"]
    parallel = by_path[_json_path(("env_step", "thread_root"))]
    assert "parallel" in parallel["cls"].split()
    assert "parallel" not in by_path[_json_path(("env_step",))]["cls"].split()


@pytest.mark.chromium
def test_clicking_a_node_zooms_in_and_clicking_root_zooms_out(
    open_report: Callable[..., Any],
) -> None:
    from selenium.webdriver.common.by import By

    spans = run_spans()
    driver = open_report(build_tree(spans), spans)
    icicle = driver.find_element(By.ID, "icicle")
    full = icicle.rect["width"]

    def node(path: tuple[str, ...]) -> Any:
        return driver.find_element(
            By.CSS_SELECTOR, f"#icicle div.node[data-path='{_json_path(path)}']"
        )

    env = node(("env_step",))
    assert env.rect["width"] < 0.9 * full
    env.click()
    assert icicle.get_attribute("data-zoom") == '["env_step"]'
    _wait(lambda: abs(env.rect["width"] - full) < 3)
    assert not node(("update",)).is_displayed()  # outside the zoomed block
    assert node(("env_step", "policy_forward")).is_displayed()
    assert [b.text for b in driver.find_elements(By.CSS_SELECTOR, "#breadcrumb button")] == [
        "root",
        "env_step",
    ]
    node(()).click()
    assert icicle.get_attribute("data-zoom") == "[]"
    _wait(lambda: node(("update",)).is_displayed())
    _wait(lambda: env.rect["width"] < 0.9 * full)


@pytest.mark.chromium
def test_self_toggle_and_tooltip(open_report: Callable[..., Any]) -> None:
    from selenium.webdriver import ActionChains
    from selenium.webdriver.common.by import By

    tree = Tree.from_dict(
        {"name": "root", "total": 2.0, "count": 1, "children": {
            "env_step": {"total": 1.5, "count": 10, "children": {
                "policy": {"total": 0.25, "count": 10}}}}}
    )  # fmt: skip
    driver = open_report(tree)
    env = driver.find_element(By.CSS_SELECTOR, "#icicle div.node[data-name='env_step'] .val")
    assert env.text == "1.500 s"
    driver.find_element(By.ID, "mode-self").click()
    assert driver.find_element(By.ID, "icicle").get_attribute("data-mode") == "self"
    assert env.text == "1.250 s"
    ActionChains(driver).move_to_element(env).perform()
    tip = driver.find_element(By.ID, "tooltip")
    _wait(tip.is_displayed)
    lines = tip.text.splitlines()
    assert lines[0] == "env_step"
    assert "total 1.500 s" in lines and "self 1.250 s" in lines and "count 10" in lines
    assert "% of parent 75.0%" in lines
    driver.find_element(By.ID, "mode-total").click()
    assert env.text == "1.500 s"


@pytest.mark.chromium
def test_markup_in_names_is_shown_as_text_never_run(open_report: Callable[..., Any]) -> None:
    from selenium.webdriver.common.by import By

    tree = mlagents_tree()
    for name in XSS_NAMES:
        tree.root.child(name).add(0.25)
        tree.metadata[name] = name
    tree.gauges.clear()
    spans = run_spans(iterations=2)
    driver = open_report(tree, spans, title=XSS_NAMES[1])
    assert driver.execute_script("return window.__pwned") is None
    shown = {n["name"]: n["text"] for n in _icicle_nodes(driver)}
    for name in XSS_NAMES:
        assert shown[name] == name
    assert driver.find_element(By.ID, "title").text == XSS_NAMES[1]
    assert XSS_NAMES[2] in driver.find_element(By.ID, "metadata").text
    bars = driver.find_elements(By.CSS_SELECTOR, "#timeline .span")
    assert XSS_NAMES[0] in {bar.get_attribute("data-name") for bar in bars}
    assert driver.find_elements(By.CSS_SELECTOR, "img") == []


@pytest.mark.chromium
def test_timeline_has_a_lane_per_thread_nested_bars_and_red_errors(
    open_report: Callable[..., Any],
) -> None:
    from selenium.webdriver.common.by import By

    spans = run_spans()
    driver = open_report(build_tree(spans), spans)
    lanes = driver.find_elements(By.CSS_SELECTOR, "#timeline .lane")
    labels = [lane.find_element(By.CSS_SELECTOR, ".lane-label").text.split("\n") for lane in lanes]
    assert labels == [
        ["ppo-train · pid 100", "MainThread"],
        ["ppo-train · pid 100", "writer"],
        ["rollout #0 · pid 201", "MainThread"],
        ["rollout #1 · pid 202", "MainThread"],
        ["rollout #2 · pid 203", "MainThread"],
    ]
    bars = driver.execute_script(
        """return Array.from(document.querySelectorAll('#timeline .span')).map(e => ({
             index: +e.dataset.index, name: e.dataset.name, parent: +e.dataset.parent,
             depth: +e.dataset.depth,
             lane: +e.closest('.lane').dataset.lane, error: e.classList.contains('error'),
             color: getComputedStyle(e).backgroundColor}))"""
    )
    assert len(bars) == len(spans)
    bars.sort(key=lambda bar: bar["index"])  # the DOM groups them by lane
    by_name: dict[str, list[dict[str, Any]]] = {}
    for bar in bars:
        by_name.setdefault(bar["name"], []).append(bar)
    backward = by_name["backward"][0]
    parent = bars[backward["parent"]]
    assert parent["name"] == "update" and backward["depth"] == parent["depth"] + 1
    sim = by_name["sim"][0]
    assert bars[sim["parent"]]["name"] == "rollout_step"
    assert sim["depth"] == bars[sim["parent"]]["depth"] + 1
    # a worker's first block starts its own lane's stack, though its parent is elsewhere
    assert bars[by_name["rollout_step"][0]["parent"]]["name"] == "env_step"
    assert by_name["rollout_step"][0]["depth"] == 0
    errors = [bar for bar in bars if bar["error"]]
    assert [bar["name"] for bar in errors] == ["update"]
    assert errors[0]["color"] == "rgb(220, 38, 38)"
    note = driver.find_element(By.ID, "timeline-note").text
    assert note.startswith(f"{len(spans)} spans in 5 lanes")


@pytest.mark.chromium
def test_dragging_across_the_timeline_zooms_into_that_range(
    open_report: Callable[..., Any],
) -> None:
    from selenium.webdriver import ActionChains
    from selenium.webdriver.common.by import By

    spans = run_spans()
    driver = open_report(build_tree(spans), spans)
    visible = "return document.querySelectorAll('#timeline .span:not(.off)').length"
    assert driver.execute_script(visible) == len(spans)
    track = driver.find_elements(By.CSS_SELECTOR, "#timeline .track")[2]
    width = track.rect["width"]
    reset = driver.find_element(By.ID, "timeline-reset")
    assert not reset.is_enabled()
    (
        ActionChains(driver)
        .move_to_element_with_offset(track, int(-0.45 * width), 0)
        .click_and_hold()
        .move_by_offset(int(0.2 * width), 0)
        .release()
        .perform()
    )
    assert reset.is_enabled()
    assert 0 < driver.execute_script(visible) < len(spans) / 2
    reset.click()
    assert driver.execute_script(visible) == len(spans)


@pytest.mark.chromium
def test_capped_timeline_says_so(open_report: Callable[..., Any]) -> None:
    from selenium.webdriver.common.by import By

    spans = run_spans()
    driver = open_report(build_tree(spans), spans, max_spans=50)
    assert len(driver.find_elements(By.CSS_SELECTOR, "#timeline .span")) == 50
    note = driver.find_element(By.ID, "timeline-note").text
    assert note.startswith(f"Showing the 50 longest of {len(spans)} spans (each at least ")
    assert "over the whole run" in note


@pytest.mark.chromium
def test_report_from_timers_json_explains_missing_timeline(open_report: Callable[..., Any]) -> None:
    from selenium.webdriver.common.by import By

    driver = open_report(mlagents_tree())
    assert "No spans" in driver.find_element(By.ID, "timeline-note").text
    assert not driver.find_element(By.ID, "timeline").is_displayed()
    gauges = driver.find_element(By.ID, "gauges").text
    assert "reward.mean" in gauges and "0.75" in gauges


@pytest.mark.chromium
def test_screenshot_of_a_full_report(open_report: Callable[..., Any], tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    spans = run_spans()
    tree = build_tree(spans)
    tree.metadata.update({"timer_format_version": "0.1.0", "run_id": "ppo-7"})
    driver = open_report(tree, spans, title="PPO · run 7")
    size = driver.get_window_size()
    try:
        height = driver.execute_script("return document.documentElement.scrollHeight")
        driver.set_window_size(1400, height + 120)
        assert driver.find_element(By.ID, "workers-0").is_displayed()
        shot = tmp_path / "report.png"
        assert driver.save_screenshot(str(shot))
    finally:
        driver.set_window_size(size["width"], size["height"])
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    artifacts = REPO / "artifacts"
    artifacts.mkdir(exist_ok=True)
    shutil.copyfile(shot, artifacts / "report.png")
    shutil.copyfile(tmp_path / "report.html", artifacts / "report.html")


@pytest.mark.chromium
def test_empty_tree_and_empty_span_list_render_cleanly(open_report: Callable[..., Any]) -> None:
    from selenium.webdriver.common.by import By

    driver = open_report(Tree(), [])
    assert [n["path"] for n in _icicle_nodes(driver)] == ["[]"]
    assert driver.find_element(By.ID, "timeline-note").text == "The spans file holds no spans."
    assert "The tree has no timed blocks." in driver.find_element(By.ID, "hotspots-section").text


@pytest.mark.chromium
def test_clicking_a_hotspot_zooms_the_icicle_to_its_parent(open_report: Callable[..., Any]) -> None:
    from selenium.webdriver.common.by import By

    spans = run_spans(iterations=3)
    driver = open_report(build_tree(spans), spans)
    rows = driver.find_elements(By.CSS_SELECTOR, "#hotspots .hot")
    assert rows[0].text == "sim"  # the most self time
    driver.execute_script("arguments[0].click()", rows[0])
    icicle = driver.find_element(By.ID, "icicle")
    assert icicle.get_attribute("data-zoom") == '["env_step","rollout_step"]'


def _scale_tree() -> Tree:
    """The shapes issue 12 found drawn wrong: a 98 % serial block beside a parallel branch that
    outgrows its free width, 1.16 s of worker time under a 0.47 %-wide setup block, and a
    parallel child worth 43.65x its parent."""
    return Tree.from_dict(
        {
            "name": "root",
            "total": 100.0,
            "count": 1,
            "children": {
                "setup": {
                    "total": 0.47,
                    "count": 1,
                    "children": {"env_worker": {"total": 1.16, "count": 4, "is_parallel": True}},
                },
                "TrainerController.advance": {
                    "total": 98.0,
                    "count": 500,
                    "children": {
                        "env_step": {
                            "total": 1.0,
                            "count": 500,
                            "children": {
                                "worker_step": {
                                    "total": 43.65,
                                    "count": 2000,
                                    "is_parallel": True,
                                }
                            },
                        },
                        "update": {"total": 90.0, "count": 10},
                    },
                },
                "env workers": {"total": 40.0, "count": 4, "is_parallel": True},
            },
        }
    )


def _settled_nodes(driver: Any) -> dict[str, dict[str, Any]]:
    """The icicle's nodes by path, read once their width transition has finished."""
    previous: list[dict[str, Any]] = []
    deadline = time.monotonic() + 5
    while True:
        nodes = [n for n in _icicle_nodes(driver) if n["shown"]]
        if nodes == previous or time.monotonic() > deadline:
            return {n["path"]: n for n in nodes}
        previous = nodes
        time.sleep(0.3)


@pytest.mark.chromium
def test_icicle_draws_one_time_scale_with_parallel_time_fitted_and_marked(
    open_report: Callable[..., Any],
) -> None:
    from selenium.webdriver.common.by import By

    tree = _scale_tree()
    driver = open_report(tree)
    full = driver.find_element(By.ID, "icicle").rect["width"]
    nodes = _settled_nodes(driver)
    advance = nodes[_json_path(("TrainerController.advance",))]
    assert advance["width"] / full == pytest.approx(0.98, abs=0.005)  # not squeezed by a sibling
    update = nodes[_json_path(("TrainerController.advance", "update"))]
    assert update["width"] / full == pytest.approx(0.90, abs=0.005)
    # No block is wider than its parent, nor its children together.
    for path, node in [((), tree.root), *tree.root.walk()]:
        shown = nodes[_json_path(path)]
        kids = [nodes[_json_path((*path, name))]["width"] for name in node.children]
        assert sum(kids) <= shown["width"] + 1.5 * len(kids), path
    # Parallel time that needs more width than is free is drawn smaller, and says at what scale.
    workers = driver.find_element(By.CSS_SELECTOR, f"#icicle div.node[data-path='{_json_path(('env workers',))}']")
    assert "scaled" in workers.get_attribute("class").split()
    assert float(workers.get_attribute("data-scale")) == pytest.approx(1.53 / 40, rel=0.01)
    root = driver.find_element(By.CSS_SELECTOR, "#icicle div.node[data-path='[]']")
    assert "squeezes" in root.get_attribute("class").split()
    # ... and the worker time hidden in the tiny setup block is named under the icicle.
    notes = driver.find_element(By.ID, "icicle-notes")
    assert "setup holds 1.160 s" in notes.text and "env workers" not in notes.text
    link = next(b for b in notes.find_elements(By.TAG_NAME, "button") if "setup" in b.text)
    link.click()
    zoomed = _settled_nodes(driver)
    env_worker = zoomed[_json_path(("setup", "env_worker"))]
    assert env_worker["width"] / full > 0.95  # zoomed in, the worker time fills the block


@pytest.mark.chromium
def test_a_tree_5000_levels_deep_renders_in_chromium(open_report: Callable[..., Any]) -> None:
    data: dict[str, Any] = {"name": "root", "total": 10.0, "count": 1}
    node = data
    for depth in range(5000):
        child = {"total": 10.0 - depth * 1e-3, "count": 1}
        node["children"] = {f"level{depth}": child}
        node = child
    driver = open_report(Tree.from_dict(data))  # no console error while it lays out
    count = driver.execute_script("return document.querySelectorAll('#icicle div.node').length")
    assert count == 5001
    deepest = driver.execute_script(
        "return document.querySelector('#icicle div.node[data-depth=\"5000\"]').dataset.name"
    )
    assert deepest == "level4999"
