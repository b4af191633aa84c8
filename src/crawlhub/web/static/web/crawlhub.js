/* crawlhub web page glue (loaded after htmx; no eval, no inline script, no build step):
 * - the "crawlhub-json" htmx extension: action buttons POST JSON to the API;
 * - the flash bar: an answer's error "detail" (4xx/5xx), "done" after an action;
 * - data-refresh: after a successful action, the live blocks it names refresh at once;
 * - <details id=...> inside a live block keep their open/closed state across swaps.
 */
(function () {
  'use strict';

  var api = null;

  // hx-ext="crawlhub-json": the request body is a JSON object of the element's values
  // (hx-vals keeps its JSON types; form fields are strings), like the API reads it.
  htmx.defineExtension('crawlhub-json', {
    init: function (internalApi) { api = internalApi; },
    onEvent: function (name, evt) {
      if (name === 'htmx:configRequest') {
        evt.detail.headers['Content-Type'] = 'application/json';
      }
      return true;
    },
    encodeParameters: function (xhr, parameters, elt) {
      xhr.overrideMimeType('text/json');
      var body = {};
      parameters.forEach(function (value, key) {
        if (Object.prototype.hasOwnProperty.call(body, key)) {
          body[key] = [].concat(body[key], value);
        } else {
          body[key] = value;
        }
      });
      var typed = api ? api.getExpressionVars(elt) : {};
      Object.keys(typed).forEach(function (key) { body[key] = typed[key]; });
      return JSON.stringify(body);
    }
  });

  // ---------------------------------------------------------------- the flash bar
  var flashTimer = null;
  var flashFromLive = false;

  function flash(text, kind, fromLive) {
    var bar = document.getElementById('flash');
    if (!bar) { return; }
    bar.textContent = text;  // text, never HTML: a detail may quote user input
    bar.className = 'flash tone-' + kind;
    bar.hidden = false;
    flashFromLive = !!fromLive;
    clearTimeout(flashTimer);
    if (kind === 'good') {
      flashTimer = setTimeout(function () { bar.hidden = true; }, 4000);
    }
  }

  function hideLiveFlash() {
    var bar = document.getElementById('flash');
    if (bar && flashFromLive) { bar.hidden = true; flashFromLive = false; }
  }

  /** The API's error "detail" (a string, or FastAPI's list of validation errors). */
  function detailOf(xhr) {
    try {
      var detail = JSON.parse(xhr.responseText).detail;
      if (typeof detail === 'string') { return detail; }
      if (Array.isArray(detail)) {
        return detail.map(function (e) {
          return ((e.loc || []).join('.') + ': ' + (e.msg || '')).replace(/^: /, '');
        }).join('; ');
      }
      if (detail !== undefined) { return JSON.stringify(detail); }
    } catch (ignored) { /* not JSON: fall through */ }
    return 'HTTP ' + xhr.status + (xhr.statusText ? ' ' + xhr.statusText : '');
  }

  function labelOf(elt) {
    if (elt && elt.dataset && elt.dataset.label) { return elt.dataset.label; }
    return elt && elt.classList && elt.classList.contains('live') ? 'live update' : 'request';
  }

  function isLive(elt) { return !!(elt && elt.classList && elt.classList.contains('live')); }

  // shown in the flash bar (htmx logs it to the console as well, whatever we do)
  document.addEventListener('htmx:responseError', function (evt) {
    var elt = evt.detail.elt;
    flash(labelOf(elt) + ' failed: ' + detailOf(evt.detail.xhr), 'bad', isLive(elt));
  });

  document.addEventListener('htmx:sendError', function (evt) {
    var elt = evt.detail.elt;
    flash(labelOf(elt) + ' failed: the server did not answer', 'bad', isLive(elt));
  });

  document.addEventListener('htmx:afterRequest', function (evt) {
    var elt = evt.detail.elt;
    if (!evt.detail.successful) { return; }
    if (isLive(elt)) { hideLiveFlash(); return; }
    if (elt && elt.dataset && elt.dataset.label) {
      flash(elt.dataset.label + ': done', 'good', false);
    }
    var selector = elt && elt.dataset ? elt.dataset.refresh : null;
    if (selector) {
      document.querySelectorAll(selector).forEach(function (target) {
        htmx.trigger(target, 'refresh');
      });
    }
  });

  // ------------------------------------------- <details> state across live swaps
  document.addEventListener('htmx:beforeSwap', function (evt) {
    var target = evt.detail.target;
    if (!target || !target.querySelectorAll) { return; }
    var state = {};
    target.querySelectorAll('details[id]').forEach(function (d) { state[d.id] = d.open; });
    evt.detail.xhr.crawlhubDetails = state;
  });

  document.addEventListener('htmx:afterSettle', function (evt) {
    var state = evt.detail.xhr && evt.detail.xhr.crawlhubDetails;
    if (!state) { return; }
    Object.keys(state).forEach(function (id) {
      var d = document.getElementById(id);
      if (d && d.tagName === 'DETAILS' && d.open !== state[id]) { d.open = state[id]; }
    });
  });
})();
