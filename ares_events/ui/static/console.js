// ares-events console: live views without a reload. No eval, no inline handlers; the
// fragments come from this origin and are HTML the server escaped.
(function () {
  "use strict";
  var main = document.getElementById("main");
  if (!main) { return; }

  // A form being filled in is never replaced under the user's hands.
  function busy() {
    var fields = main.querySelectorAll("input, textarea");
    for (var i = 0; i < fields.length; i++) {
      var f = fields[i];
      if (f === document.activeElement) { return true; }
      if (f.type === "checkbox" ? f.checked !== f.defaultChecked : f.value !== f.defaultValue) {
        return true;
      }
    }
    return false;
  }

  function refresh() {
    if (busy()) { return Promise.resolve(); }
    return fetch(window.location.href, { headers: { "X-Ares-Fragment": "1" }, credentials: "same-origin" })
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (html) {
        if (html === null) { return; }
        var open = Array.prototype.map.call(main.querySelectorAll("details[open]"), function (d) {
          return d.parentElement ? d.parentElement.id : "";
        });
        main.innerHTML = html;
        main.setAttribute("data-refreshed", String(Date.now()));
        open.forEach(function (id) {
          if (!id) { return; }
          var parent = document.getElementById(id);
          var d = parent && parent.querySelector("details");
          if (d) { d.open = true; }
        });
      })
      .catch(function () {});
  }

  if (main.getAttribute("data-poll") === "1") {
    var timer = window.setInterval(function () {
      refresh().then(function () {
        if (main.querySelector("#audit-progress") === null) { window.clearInterval(timer); }
      });
    }, 700);
  }

  if (main.getAttribute("data-live") === "1" && window.EventSource) {
    var position = main.getAttribute("data-position") || "0";
    var source = new EventSource("./live?after=" + encodeURIComponent(position));
    source.addEventListener("position", function (ev) {
      if (ev.data !== position) {
        position = ev.data;
        refresh();
      }
    });
  }
})();
