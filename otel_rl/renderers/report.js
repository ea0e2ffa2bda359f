/* otel-rl HTML report. Inlined into the page by otel_rl/renderers/html.py.
 * Every string from the data (timer names come from user code) is set with textContent or
 * setAttribute, never as markup. */
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("report-data").textContent);
  var tooltip = document.getElementById("tooltip");
  var HUES = [214, 188, 162, 136, 96, 48, 30, 12, 350, 318, 284, 250];

  function fmtS(s) {
    if (s === null || !isFinite(s)) return String(s);
    var a = Math.abs(s);
    if (a === 0) return "0 s";
    if (a >= 1) return s.toFixed(3) + " s";
    if (a >= 1e-3) return (s * 1e3).toFixed(2) + " ms";
    if (a >= 1e-6) return (s * 1e6).toFixed(1) + " µs";
    return (s * 1e9).toFixed(0) + " ns";
  }
  function fmtN(n) { return Number(n).toLocaleString("en-US", { maximumFractionDigits: 1 }); }
  function pct(part, whole) { return whole > 0 ? (100 * part / whole).toFixed(1) + "%" : "–"; }
  function hue(name) {
    var h = 2166136261;  // FNV-1a: a block keeps its colour across views and reports
    for (var i = 0; i < name.length; i++) { h ^= name.charCodeAt(i); h = Math.imul(h, 16777619); }
    return HUES[(h >>> 0) % HUES.length];
  }
  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }

  // Tooltip: rows of [label, value] built as text.
  function showTip(ev, name, path, rows, note, error) {
    tooltip.textContent = "";
    tooltip.appendChild(el("div", "tt-name", name));
    if (path) tooltip.appendChild(el("div", "tt-path", path));
    var table = el("table");
    rows.forEach(function (r) {
      var tr = el("tr"); tr.appendChild(el("td", "", r[0])); tr.appendChild(el("td", "", r[1]));
      table.appendChild(tr);
    });
    tooltip.appendChild(table);
    if (note) tooltip.appendChild(el("div", "tt-note", note));
    if (error) tooltip.appendChild(el("div", "tt-error", error));
    tooltip.hidden = false;
    moveTip(ev);
  }
  function moveTip(ev) {
    var w = tooltip.offsetWidth, h = tooltip.offsetHeight;
    var x = ev.clientX + 14, y = ev.clientY + 14;
    if (x + w > window.innerWidth - 8) x = Math.max(8, ev.clientX - w - 14);
    if (y + h > window.innerHeight - 8) y = Math.max(8, ev.clientY - h - 14);
    tooltip.style.left = x + "px"; tooltip.style.top = y + "px";
  }
  function hideTip() { tooltip.hidden = true; }

  // ---------------------------------------------------------------- icicle
  var icicle = document.getElementById("icicle");
  var nodes = [];
  var maxDepth = 0;
  // Paths are kept as parent links, not arrays: a tree thousands of levels deep would make
  // per-node path copies quadratic. Loops, not recursion, for the same reason.
  var MAX_PATH_ATTR_DEPTH = 64;
  function makeNode(raw, parent) {
    var node = { name: raw.n, total: raw.t || 0, self: raw.s || 0, count: raw.c, parallel: !!raw.p,
                 gpu: raw.g, parent: parent, depth: parent ? parent.depth + 1 : 0, children: [],
                 scale: 1, squeezed: 0 };
    nodes.push(node);
    maxDepth = Math.max(maxDepth, node.depth);
    return node;
  }
  function index(rawRoot) {
    var top = makeNode(rawRoot, null);
    var todo = [[rawRoot, top]];
    while (todo.length) {
      var item = todo.pop();
      (item[0].k || []).forEach(function (c) {
        var child = makeNode(c, item[1]);
        item[1].children.push(child);
        todo.push([c, child]);
      });
    }
    return top;
  }
  function namesOf(node) {
    var names = [];
    for (var n = node; n && n.parent; n = n.parent) names.push(n.name);
    return names.reverse();
  }
  function keyOf(node) { return JSON.stringify(namesOf(node)); }
  function findByKey(key) {
    var names;
    try { names = JSON.parse(key); } catch (err) { return null; }
    var node = root;
    for (var i = 0; node && i < names.length; i++) {
      node = node.children.filter(function (c) { return c.name === names[i]; })[0];
    }
    return node || null;
  }
  var root = index(data.tree);
  var zoom = root, mode = "total", query = "";
  var ROW = 24;
  icicle.style.height = (maxDepth + 1) * ROW + "px";

  nodes.forEach(function (node) {
    var e = el("div", "node" + (node.parallel ? " parallel" : ""));
    e.setAttribute("data-name", node.name);
    if (node.depth <= MAX_PATH_ATTR_DEPTH) e.setAttribute("data-path", keyOf(node));
    e.setAttribute("data-total", String(node.total));
    e.setAttribute("data-self", String(node.self));
    e.setAttribute("data-count", String(node.count));
    e.setAttribute("data-depth", String(node.depth));
    e.setAttribute("data-parallel", node.parallel ? "true" : "false");
    e.style.top = node.depth * ROW + "px";
    var lbl = el("span", "lbl");
    lbl.appendChild(el("span", "nm", node.name));
    node.val = el("span", "val");
    lbl.appendChild(node.val);
    e.appendChild(lbl);
    e.addEventListener("click", function (ev) {
      ev.stopPropagation();
      // Clicking the zoomed block again steps out one level; an ancestor zooms out to it.
      setZoom(node === zoom && node.parent ? node.parent : node);
    });
    e.addEventListener("mousemove", function (ev) { nodeTip(ev, node); });
    e.addEventListener("mouseleave", hideTip);
    node.el = e;
    icicle.appendChild(e);
  });

  function nodeTip(ev, node) {
    var rows = [["total", fmtS(node.total)], ["self", fmtS(node.self)], ["count", fmtN(node.count)],
                ["mean", node.count ? fmtS(node.total / node.count) : "–"]];
    if (node.gpu !== undefined) rows.splice(1, 0, ["gpu", fmtS(node.gpu)]);
    if (node.parent) {
      // Time beside the parent is a multiple of it; inside a parallel branch, a share.
      var beside = node.parallel && (!node.parent.parallel || node.total > node.parent.total);
      rows.push(beside ? ["× parent", times(node.total, node.parent.total)]
                       : ["% of parent", pct(node.total, node.parent.total)]);
    }
    rows.push(node.parallel ? ["× run", times(node.total, root.total)]
                            : ["% of run", pct(node.total, root.total)]);
    var names = namesOf(node).slice(0, -1);
    if (names.length > 8) names = names.slice(0, 3).concat(["… " + (names.length - 6) + " levels …"], names.slice(-3));
    var notes = [];
    if (node.parallel) notes.push("∥ parallel branch: ran in other threads or processes, summed");
    if (node.scale < 0.999) notes.push("drawn at " + pctScale(node.scale) + " of the time scale: it needs more width than its parent has free");
    if (node.squeezed > 0) notes.push("holds " + fmtS(node.squeezed) + " of parallel time drawn smaller than scale: click to zoom in");
    showTip(ev, node.name, names.join(" › "), rows, notes.join(" · "));
  }
  function times(part, whole) { return whole > 0 ? (part / whole).toFixed(2) + "×" : "–"; }
  function pctScale(f) { return f >= 0.01 ? (100 * f).toFixed(0) + "%" : (100 * f).toPrecision(2) + "%"; }

  // One time scale for the whole icicle: a block's width is its time. A serial child gets its
  // share of its parent's width (its share of the parent's time). Parallel children ran beside
  // their parent (other threads or processes, summed), so together they can be many times its
  // time: they take the width their serial siblings leave free, at the same scale when it fits,
  // shrunk to fit (and marked, with the scale they are drawn at) when not. No block is ever
  // wider than its parent's share; the parent of shrunk parallel time is marked too.
  function place(top, x0, w0, width, maxSelf) {
    var todo = [[top, x0, w0, 1]];
    while (todo.length) {
      var item = todo.pop();
      var node = item[0], x = item[1], w = item[2], scale = item[3];
      var e = node.el;
      e.classList.remove("hidden", "zoom-ancestor");
      e.style.left = (x * 100) + "%";
      e.style.width = "calc(" + (w * 100) + "% - 1px)";
      e.classList.toggle("narrow", w * width < 36);
      node.val.textContent = fmtS(mode === "self" ? node.self : node.total);
      if (mode === "self") {
        // Heat: the more self time, the hotter; what is left is time spent in children.
        var f = maxSelf > 0 ? Math.sqrt(node.self / maxSelf) : 0;
        e.style.backgroundColor = "hsl(" + (44 - 40 * f) + ", " + (30 + 60 * f) + "%, " + (92 - 32 * f) + "%)";
        e.classList.toggle("hot", f > 0.75);
      } else {
        e.style.backgroundColor = "hsl(" + hue(node.name) + ", 58%, 80%)";
        e.classList.remove("hot");
      }
      node.scale = scale;
      e.setAttribute("data-scale", String(scale));
      e.classList.toggle("scaled", scale < 0.999);
      var serialSum = 0, parallelSum = 0;
      node.children.forEach(function (c) { if (c.parallel) parallelSum += c.total; else serialSum += c.total; });
      var base = node.total > 0 ? node.total : (serialSum + parallelSum) || 1;
      // Serial children never add up to more than their parent (unless clocks disagree).
      var serialFit = serialSum > base ? base / serialSum : 1;
      var cx = x;
      node.children.forEach(function (c) {
        if (c.parallel) return;
        var cw = w * c.total / base * serialFit;
        todo.push([c, cx, cw, scale * serialFit]);
        cx += cw;
      });
      var free = Math.max(0, x + w - cx);
      var wanted = w * parallelSum / base;
      var parallelFit = wanted > free ? free / wanted : 1;
      node.children.forEach(function (c) {
        if (!c.parallel) return;
        var cw = w * c.total / base * parallelFit;
        todo.push([c, cx, cw, scale * parallelFit]);
        cx += cw;
      });
      node.squeezed = parallelFit < 0.999 && parallelSum > 0 ? parallelSum : 0;
      e.classList.toggle("squeezes", node.squeezed > 0);
      e.setAttribute("data-squeezed", String(node.squeezed));
    }
  }

  function subtreeMaxSelf(top) {
    var m = 0, todo = [top];
    while (todo.length) {
      var node = todo.pop();
      m = Math.max(m, node.self);
      Array.prototype.push.apply(todo, node.children);
    }
    return m;
  }

  function squeezeNotes() {
    // Where parallel time is drawn smaller than the time scale: say so, biggest first, with a
    // link that zooms in (a block's own zoom gives its parallel time the full width).
    var box = document.getElementById("icicle-notes");
    box.textContent = "";
    var found = [];
    nodes.forEach(function (n) { if (n.squeezed > 0 && !n.el.classList.contains("hidden") && !n.el.classList.contains("zoom-ancestor")) found.push(n); });
    if (!found.length) return;
    found.sort(function (a, b) { return b.squeezed - a.squeezed; });
    box.appendChild(el("span", "", "∥ Parallel time drawn smaller than the time scale (it ran beside its parent, summed over threads/processes): "));
    found.slice(0, 5).forEach(function (n, i) {
      if (i) box.appendChild(el("span", "", " · "));
      var b = el("button", "squeeze-link", n.name + " holds " + fmtS(n.squeezed));
      b.type = "button";
      b.addEventListener("click", function () { setZoom(n); });
      box.appendChild(b);
    });
    if (found.length > 5) box.appendChild(el("span", "", " · and " + (found.length - 5) + " more"));
  }

  function layout() {
    var width = icicle.clientWidth || 1000;
    nodes.forEach(function (n) { n.el.classList.add("hidden"); });
    for (var a = zoom.parent; a; a = a.parent) {
      place1(a, width);
    }
    place(zoom, 0, 1, width, subtreeMaxSelf(zoom));
    icicle.setAttribute("data-zoom", keyOf(zoom));
    squeezeNotes();
    icicle.setAttribute("data-mode", mode);
    document.getElementById("zoom-reset").disabled = zoom === root;
    breadcrumb();
  }
  function place1(node, width) {
    // An ancestor of the zoomed block: a full-width bar to click to zoom back out.
    var e = node.el;
    e.classList.remove("hidden", "narrow");
    e.classList.add("zoom-ancestor");
    e.classList.remove("hot");
    e.style.left = "0%"; e.style.width = "calc(100% - 1px)";
    node.val.textContent = fmtS(mode === "self" ? node.self : node.total);
    e.style.backgroundColor = mode === "self" ? "hsl(44, 30%, 92%)" : "hsl(" + hue(node.name) + ", 58%, 80%)";
  }

  function breadcrumb() {
    var bc = document.getElementById("breadcrumb");
    bc.textContent = "";
    var chain = [];
    for (var n = zoom; n; n = n.parent) chain.push(n);
    chain.reverse();
    if (chain.length === 1) { bc.textContent = "Showing the whole run."; return; }
    if (chain.length > 12) {  // a deep zoom: the first and last few levels
      var skipped = chain.length - 9;
      chain = chain.slice(0, 3).concat([null], chain.slice(-6));
    }
    chain.forEach(function (n, i) {
      if (i) bc.appendChild(el("span", "sep", "›"));
      if (n === null) { bc.appendChild(el("span", "sep", "… " + skipped + " levels …")); return; }
      var b = el("button", "", n.name);
      b.type = "button";
      b.addEventListener("click", function () { setZoom(n); });
      bc.appendChild(b);
    });
  }

  function setZoom(node) { zoom = node; layout(); }
  function setMode(m) {
    mode = m;
    document.getElementById("mode-total").classList.toggle("active", m === "total");
    document.getElementById("mode-self").classList.toggle("active", m === "self");
    document.getElementById("legend-mode").textContent =
      m === "self" ? ", colour = self time (the hotter, the more time spent in the block itself)" : "";
    layout();
  }
  document.getElementById("mode-total").addEventListener("click", function () { setMode("total"); });
  document.getElementById("mode-self").addEventListener("click", function () { setMode("self"); });
  document.getElementById("zoom-reset").addEventListener("click", function () { setZoom(root); });
  document.getElementById("search").addEventListener("input", function (ev) {
    query = ev.target.value.trim().toLowerCase();
    icicle.classList.toggle("searching", query.length > 0);
    nodes.forEach(function (n) {
      n.el.classList.toggle("match", query.length > 0 && n.name.toLowerCase().indexOf(query) >= 0);
    });
  });
  document.addEventListener("keydown", function (ev) {
    if (ev.key === "Escape" && document.activeElement.tagName !== "INPUT") setZoom(root);
  });
  Array.prototype.forEach.call(document.querySelectorAll("#hotspots .hot"), function (e) {
    e.addEventListener("click", function () {
      var node = findByKey(e.getAttribute("data-path"));
      if (!node) return;
      setZoom(node.parent || node);
      document.getElementById("tree-section").scrollIntoView({ behavior: "smooth" });
    });
  });
  var resizeTimer = null;
  window.addEventListener("resize", function () {
    clearTimeout(resizeTimer);
    resizeTimer = setTimeout(function () { layout(); drawTimeline(); }, 100);
  });
  layout();

  // ---------------------------------------------------------------- timeline
  var tl = data.timeline;
  var tlBox = document.getElementById("timeline");
  var tlNote = document.getElementById("timeline-note");
  var spanEls = [], axis = null, view = [0, 1], dragged = false;
  var TROW = 18;

  function niceStep(range) {
    var raw = range / 8, p = Math.pow(10, Math.floor(Math.log10(raw))), m = raw / p;
    return p * (m < 1.5 ? 1 : m < 3.5 ? 2 : m < 7.5 ? 5 : 10);
  }

  function drawTimeline() {
    if (!tl || !tl.shown) return;
    var range = view[1] - view[0] || 1;
    axis.textContent = "";
    var step = niceStep(range);
    for (var t = Math.ceil(view[0] / step) * step; t <= view[1]; t += step) {
      var tick = el("div", "tick", fmtS(t / 1000));
      tick.style.left = ((t - view[0]) / range * 100) + "%";
      axis.appendChild(tick);
    }
    for (var i = 0; i < spanEls.length; i++) {
      var s = tl.spans[i], e = spanEls[i];
      var off = s[2] < view[0] || s[1] > view[1];
      e.classList.toggle("off", off);
      if (off) continue;
      var left = Math.max(s[1], view[0]), right = Math.min(s[2], view[1]);
      e.style.left = ((left - view[0]) / range * 100) + "%";
      e.style.width = ((right - left) / range * 100) + "%";
    }
    document.getElementById("timeline-reset").disabled = view[0] === 0 && view[1] === tl.end;
  }

  function spanTip(ev, i) {
    var s = tl.spans[i], lane = tl.lanes[s[0]];
    var rows = [["duration", fmtS((s[2] - s[1]) / 1000)], ["start", "+" + fmtS(s[1] / 1000)],
                ["process", lane.process], ["thread", lane.thread]];
    var err = (s[5] & 1) ? "error: " + (tl.errors[String(i)] || "") : "";
    var chain = [];
    for (var p = s[6]; p >= 0; p = tl.spans[p][6]) chain.unshift(tl.names[tl.spans[p][4]]);
    showTip(ev, tl.names[s[4]], chain.join(" › "), rows, "", err);
  }
  function markAncestors(i, on) {
    for (var p = tl.spans[i][6]; p >= 0; p = tl.spans[p][6]) spanEls[p].classList.toggle("ancestor", on);
  }

  if (!tl) {
    tlNote.textContent = "No spans: this report was made from a timers.json. Give otel-rl report a spans file to see the timeline.";
    tlBox.hidden = true;
  } else if (!tl.shown) {
    tlNote.textContent = "The spans file holds no spans.";
    tlBox.hidden = true;
  } else {
    var procs = {};
    tl.lanes.forEach(function (l) { procs[l.process] = 1; });
    var summary = (tl.shown < tl.total
      ? "Showing the " + fmtN(tl.shown) + " longest of " + fmtN(tl.total) + " spans (each at least " +
        fmtS(tl.minMs / 1000) + "), over the whole run of " + fmtS(tl.runEnd / 1000) +
        " (summarised to keep the page responsive)"
      : fmtN(tl.total) + " spans") +
      " in " + tl.lanes.length + " lanes (" + Object.keys(procs).length + " processes, by thread)." +
      " Drag across the lanes to zoom in, click a span to fit it; hover to see its parents.";
    if (tl.shown < tl.total) tlBox.setAttribute("data-capped", "true");
    tlNote.textContent = summary;
    view = [0, tl.end];
    axis = el("div", "axis");
    tlBox.appendChild(axis);
    var tracks = [], lastProcess = null;
    tl.lanes.forEach(function (lane, li) {
      var row = el("div", "lane" + (lastProcess !== null && lane.process !== lastProcess ? " new-process" : ""));
      row.setAttribute("data-lane", String(li));
      lastProcess = lane.process;
      var label = el("div", "lane-label");
      label.appendChild(el("div", "proc", lane.process));
      label.appendChild(el("div", "thr", lane.thread));
      row.appendChild(label);
      var track = el("div", "track");
      track.style.height = lane.depth * TROW + "px";
      row.appendChild(track);
      tracks.push(track);
      tlBox.appendChild(row);
    });
    tl.spans.forEach(function (s, i) {
      var name = tl.names[s[4]];
      var e = el("div", "span" + ((s[5] & 1) ? " error" : "") + ((s[5] & 2) ? " marker" : ""), name);
      e.setAttribute("data-name", name);
      e.setAttribute("data-index", String(i));
      e.setAttribute("data-parent", String(s[6]));
      e.setAttribute("data-depth", String(s[3]));
      e.style.top = s[3] * TROW + "px";
      if (!(s[5] & 3)) e.style.backgroundColor = "hsl(" + hue(name) + ", 58%, 80%)";
      e.addEventListener("mousemove", function (ev) { spanTip(ev, i); });
      e.addEventListener("mouseenter", function () { markAncestors(i, true); });
      e.addEventListener("mouseleave", function () { markAncestors(i, false); hideTip(); });
      e.addEventListener("click", function () {
        if (dragged) return;
        var pad = (s[2] - s[1]) * 0.05 || 0.001;
        view = [Math.max(0, s[1] - pad), Math.min(tl.end, s[2] + pad)];
        drawTimeline();
      });
      spanEls.push(e);
      tracks[s[0]].appendChild(e);
    });
    // Drag across the tracks to zoom into a time range.
    var brush = el("div", "brush");
    brush.hidden = true;
    tlBox.appendChild(brush);
    var drag = null;
    tlBox.addEventListener("mousedown", function (ev) {
      var track = ev.target.closest(".track");
      if (!track || ev.button !== 0) return;
      var r = track.getBoundingClientRect();
      drag = { x0: ev.clientX, left: r.left, width: r.width };
      dragged = false;
      ev.preventDefault();
    });
    window.addEventListener("mousemove", function (ev) {
      if (!drag) return;
      if (Math.abs(ev.clientX - drag.x0) > 4) dragged = true;
      if (!dragged) return;
      var box = tlBox.getBoundingClientRect();
      var a = Math.max(drag.left, Math.min(drag.x0, ev.clientX));
      var b = Math.min(drag.left + drag.width, Math.max(drag.x0, ev.clientX));
      brush.style.left = (a - box.left) + "px";
      brush.style.width = Math.max(0, b - a) + "px";
      brush.hidden = false;
    });
    window.addEventListener("mouseup", function (ev) {
      if (!drag) return;
      if (dragged) {
        var f0 = (Math.min(drag.x0, ev.clientX) - drag.left) / drag.width;
        var f1 = (Math.max(drag.x0, ev.clientX) - drag.left) / drag.width;
        var range = view[1] - view[0];
        view = [view[0] + range * Math.max(0, f0), view[0] + range * Math.min(1, f1)];
        drawTimeline();
      }
      brush.hidden = true;
      drag = null;
      setTimeout(function () { dragged = false; }, 0);
    });
    document.getElementById("timeline-reset").addEventListener("click", function () {
      view = [0, tl.end]; drawTimeline();
    });
    drawTimeline();
  }
})();
