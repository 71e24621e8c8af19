// migronaut dashboard: live progress without a reload, and a confirmation before each control.
// No framework, no build step. The page names its poll endpoint in <body data-live>; the poll
// runs at most once a second, and the partition map (a migration's page) every fifth poll.
(function () {
  "use strict";
  var POLL_MS = 1000;
  var MAP_EVERY = 5;
  var SMOOTHING = 0.5;
  var body = document.body;
  var live = body.getAttribute("data-live");
  var partitionsUrl = body.getAttribute("data-partitions");
  var last = {};  // migration -> {at, done, rate}: the rate between this page's own polls
  var polls = 0;

  function text(el, value) { if (el && el.textContent !== value) { el.textContent = value; } }

  function duration(seconds) {
    if (typeof seconds !== "number") { return "—"; }
    var total = Math.round(seconds), h = Math.floor(total / 3600);
    var m = Math.floor((total % 3600) / 60), s = total % 60;
    if (h) { return h + "h" + String(m).padStart(2, "0") + "m"; }
    return m ? m + "m" + String(s).padStart(2, "0") + "s" : s + "s";
  }

  function rowFor(name) {
    var rows = document.querySelectorAll("tr[data-migration]");
    for (var i = 0; i < rows.length; i++) {
      if (rows[i].getAttribute("data-migration") === name) { return rows[i]; }
    }
    return null;
  }

  function update(view, now) {
    var row = rowFor(view.migration);
    if (!row) { return false; }
    // a state that became unreadable (or was repaired) changes the row's cells: reload
    if ((view.status === "invalid") !== !!row.querySelector("[data-field=error]")) { return false; }
    var p = view.progress || {};
    var prev = last[view.migration];
    var rate = p.rate, eta = p.etaSeconds;
    if (prev && now > prev.at && p.done >= prev.done && view.status === "running") {
      var instant = (p.done - prev.done) / ((now - prev.at) / 1000);
      rate = prev.rate == null ? instant : SMOOTHING * instant + (1 - SMOOTHING) * prev.rate;
      // no ETA against an estimate that is only a lower bound (or already passed)
      eta = rate > 0 && p.percent != null && p.estimate > p.done ? (p.estimate - p.done) / rate : null;
    }
    last[view.migration] = {at: now, done: p.done, rate: view.status === "running" ? rate : null};
    var bar = row.querySelector("[data-field=bar]");
    var total = (p.atLeast ? "≥" : "") + (p.estimate || "?");
    if (bar) {
      if (p.percent == null) { bar.removeAttribute("value"); } else { bar.value = p.percent; }
      bar.setAttribute("aria-label", view.migration + " progress: " + p.done + " of " + total +
                       " documents read" + (p.percent == null ? "" : ", " + p.percent + "%"));
    }
    text(row.querySelector("[data-field=percent]"), p.percent != null ? p.percent + "%" :
         p.partitionPercent != null ? p.partitionPercent + "% of partitions" : "?");
    text(row.querySelector("[data-field=done]"), String(p.done));
    text(row.querySelector("[data-field=estimate]"), total);
    text(row.querySelector("[data-field=rate]"),
         rate == null || view.status !== "running" ? "—" : (Math.round(rate * 10) / 10) + "/s");
    text(row.querySelector("[data-field=eta]"), view.status === "running" ? duration(eta) : "—");
    text(row.querySelector("[data-field=lanes]"), (view.liveLeases || 0) + "/" + view.maxParallel);
    text(row.querySelector("[data-field=failed]"), String(view.failedDocuments || 0));
    var status = row.querySelector("[data-field=status]");
    if (status) { status.className = "status s-" + view.status; text(status, view.status); }
    var buttons = document.querySelectorAll("form.control button");
    for (var i = 0; i < buttons.length; i++) {
      buttons[i].disabled = (view.controls || []).indexOf(buttons[i].value) < 0;
    }
    return true;
  }

  function cellLabel(p) {  // the same words as the template's aria-label
    var c = p.counters || {};
    return "Partition " + p.seq + ", " + p.status +
      (p.lease ? ", lane " + p.lease.slot : "") + ", " + ((c.scanned || 0) + (c.processed || 0)) +
      " of " + (p.estimate || "?") + " documents read";
  }

  function updateMap(rows) {
    var map = document.getElementById("partition-map");
    if (!map) { return; }
    var cells = {};
    map.querySelectorAll(".cell").forEach(function (cell) { cells[cell.getAttribute("data-seq")] = cell; });
    rows.forEach(function (p) {
      var cell = cells[String(p.seq)];
      if (!cell) { return; }
      cell.className = "cell s-" + p.status;
      cell.setAttribute("aria-label", cellLabel(p));
      text(cell.querySelector(".lane"), p.lease ? "L" + p.lease.slot : "");
    });
  }

  function fetchJson(url) {
    return fetch(url, {credentials: "same-origin", headers: {"Accept": "application/json"}})
      .then(function (r) { if (!r.ok) { throw new Error(r.status); } return r.json(); });
  }

  function poll() {
    polls += 1;
    fetchJson(live).then(function (doc) {
      var now = Date.now(), missing = false;
      (doc.background || []).forEach(function (view) { if (!update(view, now)) { missing = true; } });
      text(document.getElementById("live-state"), "live · " + new Date(now).toLocaleTimeString());
      if (missing) { window.location.reload(); return; }  // registered meanwhile, or invalid
      if (partitionsUrl && polls % MAP_EVERY === 0) {
        fetchJson(partitionsUrl).then(function (d) { updateMap(d.partitions || []); });
      }
      window.setTimeout(poll, POLL_MS);
    }).catch(function (error) {
      text(document.getElementById("live-state"), String(error.message) === "503" ?
           "database unreachable — retrying" : "offline — retrying");
      window.setTimeout(poll, POLL_MS * 5);
    });
  }

  document.querySelectorAll("form.control").forEach(function (form) {
    form.addEventListener("submit", function (event) {
      if (!window.confirm(form.getAttribute("data-confirm"))) { event.preventDefault(); return; }
      var actor = document.getElementById("actor");
      form.querySelector("input[name=requested_by]").value = actor ? actor.value : "";
    });
  });

  if (live) { window.setTimeout(poll, POLL_MS); }
}());
