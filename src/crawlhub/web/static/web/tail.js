/* Live log tail: every <div class="logview" data-tail="URL"> (macros.html log_view)
 * reads URL as Server-Sent Events and appends each line.
 *
 * The endpoint's format (GET /logs/tail?job=&run=&task=&level=&q=): text/event-stream,
 * one event per log line, "id: <line id>" and "data: <JSON LogLine>" with ts (epoch
 * seconds), level, source, job, run, task, message, id. On a dropped connection the
 * browser reconnects by itself and sends Last-Event-ID, so the endpoint resumes after it;
 * lines seen already are skipped here too (by id). Unnamed events only.
 *
 * Pause keeps the stream and buffers (up to data-max-lines); Continue shows the buffer.
 * At most data-max-lines lines stay in the view; it follows the bottom while the reader
 * is scrolled there. Built with textContent: a message is never parsed as HTML.
 */
(function () {
  'use strict';

  var LEVELS = /^[a-z]{1,12}$/;

  function pad(n, width) { return String(n).padStart(width, '0'); }

  /** "12:00:03.250" (UTC), as the server renders a line's time. */
  function clock(ts) {
    var d = new Date(ts * 1000);
    if (isNaN(d.getTime())) { return ''; }
    return pad(d.getUTCHours(), 2) + ':' + pad(d.getUTCMinutes(), 2) + ':' +
      pad(d.getUTCSeconds(), 2) + '.' + pad(d.getUTCMilliseconds(), 3);
  }

  function span(cls, text) {
    var s = document.createElement('span');
    s.className = cls;
    s.textContent = text == null ? '' : String(text);
    return s;
  }

  /** The <li> macros.html's log_line renders, for one LogLine. */
  function lineElement(line) {
    var li = document.createElement('li');
    var level = String(line.level || 'info').toLowerCase();
    li.className = 'log-line lvl-' + (LEVELS.test(level) ? level : 'info');
    if (line.id != null) { li.dataset.id = String(line.id); }
    var time = document.createElement('time');
    var when = new Date((line.ts || 0) * 1000);
    if (!isNaN(when.getTime())) { time.dateTime = when.toISOString().replace(/\.\d+Z$/, 'Z'); }
    time.textContent = clock(line.ts);
    var codes = [line.job, line.run, line.task].filter(function (c) { return c; }).join('/');
    li.append(time, ' ', span('lvl', level), ' ', span('src', line.source), ' ',
      span('codes', codes), ' ', span('msg', line.message));
    return li;
  }

  function Tail(view) {
    this.view = view;
    this.url = view.dataset.tail;
    this.list = view.querySelector('.log-lines');
    this.state = view.querySelector('.tail-state');
    this.button = view.querySelector('.tail-pause');
    this.max = parseInt(view.dataset.maxLines, 10) || 2000;
    this.paused = false;
    this.buffer = [];
    this.seen = new Set();
    this.order = [];
    this.source = null;
    this.retry = null;
    var self = this;
    this.list.querySelectorAll('li[data-id]').forEach(function (li) { self.remember(li.dataset.id); });
    if (this.button) {
      this.button.addEventListener('click', function () { self.toggle(); });
    }
    this.open();
  }

  Tail.prototype.setState = function (state, text) {
    if (!this.state) { return; }
    this.state.dataset.state = state;
    this.state.textContent = text;
  };

  Tail.prototype.remember = function (id) {
    this.seen.add(id);
    this.order.push(id);
    if (this.order.length > this.max * 2) { this.seen.delete(this.order.shift()); }
  };

  Tail.prototype.open = function () {
    var self = this;
    this.close();
    var source = new EventSource(this.url);
    this.source = source;
    source.onopen = function () { self.setState(self.paused ? 'paused' : 'live', self.paused ? 'paused' : 'live'); };
    source.onmessage = function (evt) { self.receive(evt); };
    source.onerror = function () {
      if (!self.attached()) { self.close(); return; }
      if (source.readyState === EventSource.CLOSED) {
        // refused (e.g. 401 after logout, 404): try again later, not in a tight loop
        self.setState('down', 'disconnected; retrying in 5 s');
        self.retry = setTimeout(function () { self.open(); }, 5000);
      } else {
        self.setState('down', 'reconnecting…');
      }
    };
  };

  Tail.prototype.close = function () {
    clearTimeout(this.retry);
    if (this.source) { this.source.close(); this.source = null; }
  };

  Tail.prototype.attached = function () { return document.body.contains(this.view); };

  Tail.prototype.receive = function (evt) {
    if (!this.attached()) { this.close(); return; }
    var line;
    try { line = JSON.parse(evt.data); } catch (ignored) { return; }
    if (!line || typeof line !== 'object') { return; }
    var id = evt.lastEventId || (line.id != null ? String(line.id) : '');
    if (id) {
      if (this.seen.has(id)) { return; }
      this.remember(id);
    }
    if (this.paused) {
      this.buffer.push(line);
      if (this.buffer.length > this.max) { this.buffer.shift(); }
      this.setState('paused', 'paused, ' + this.buffer.length + ' new');
      return;
    }
    this.append([line]);
  };

  Tail.prototype.append = function (lines) {
    var box = this.view;
    var atBottom = box.scrollHeight - box.scrollTop - box.clientHeight < 24;
    var fragment = document.createDocumentFragment();
    lines.forEach(function (line) { fragment.append(lineElement(line)); });
    this.list.append(fragment);
    while (this.list.children.length > this.max) { this.list.firstElementChild.remove(); }
    if (atBottom) { box.scrollTop = box.scrollHeight; }
  };

  Tail.prototype.toggle = function () {
    this.paused = !this.paused;
    this.button.textContent = this.paused ? 'Continue' : 'Pause';
    this.button.setAttribute('aria-pressed', String(this.paused));
    if (this.paused) {
      this.setState('paused', 'paused');
    } else {
      var lines = this.buffer;
      this.buffer = [];
      this.append(lines);
      this.setState('live', 'live');
    }
  };

  function start(root) {
    var views = [];
    if (root.matches && root.matches('.logview[data-tail]')) { views.push(root); }
    if (root.querySelectorAll) {
      root.querySelectorAll('.logview[data-tail]').forEach(function (v) { views.push(v); });
    }
    views.forEach(function (view) {
      if (!view.crawlhubTail) { view.crawlhubTail = new Tail(view); }
    });
  }

  function stop(root) {
    if (root.crawlhubTail) { root.crawlhubTail.close(); }
    if (root.querySelectorAll) {
      root.querySelectorAll('.logview[data-tail]').forEach(function (v) {
        if (v.crawlhubTail) { v.crawlhubTail.close(); }
      });
    }
  }

  document.addEventListener('DOMContentLoaded', function () { start(document.body); });
  // content htmx swaps in (a log section opened on a run's timeline) starts its tail;
  // content it removes closes its stream
  document.addEventListener('htmx:load', function (evt) { start(evt.detail.elt); });
  document.addEventListener('htmx:beforeCleanupElement', function (evt) { stop(evt.detail.elt); });

  window.crawlhubTail = { lineElement: lineElement, start: start };
})();
