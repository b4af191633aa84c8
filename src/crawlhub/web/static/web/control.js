/* The control plane's pages (projects, jobs, runs, logs, alerts), beside crawlhub.js:
 * - data-answer="<selector>": a button whose JSON answer says {ok, answer, error} (an
 *   alert route's test, POST /alerts/{name}/test, answers 200 either way) writes it into
 *   the <output> it names: "ok - HTTP 200" or "failed - <why>";
 * - data-drop-empty on a form posted as JSON (hx-ext="crawlhub-json"): empty fields are
 *   left out, so the API sees "not given" rather than "" (a build: a tag, or a version).
 * Text only (textContent): an answer may quote what a target sent back.
 */
(function () {
  'use strict';

  function outputFor(elt) {
    var selector = elt && elt.dataset ? elt.dataset.answer : null;
    return selector ? document.querySelector(selector) : null;
  }

  function show(output, ok, text) {
    output.textContent = '';
    var word = document.createElement('span');
    word.className = 'badge tone-' + (ok ? 'good' : 'bad');
    word.textContent = ok ? 'ok' : 'failed';
    output.append(word, ' ', text || '');
    output.dataset.ok = String(ok);
  }

  document.addEventListener('htmx:beforeRequest', function (evt) {
    var output = outputFor(evt.detail.elt);
    if (output) {
      output.textContent = 'sending…';
      delete output.dataset.ok;
    }
  });

  document.addEventListener('htmx:afterRequest', function (evt) {
    var output = outputFor(evt.detail.elt);
    if (!output) { return; }
    var xhr = evt.detail.xhr;
    var body = null;
    try { body = JSON.parse(xhr.responseText); } catch (ignored) { /* not JSON */ }
    if (evt.detail.successful && body && typeof body.ok === 'boolean') {
      show(output, body.ok, body.ok ? body.answer : body.error);
    } else if (body && typeof body.detail === 'string') {
      show(output, false, body.detail);
    } else {
      show(output, false, xhr.status ? 'HTTP ' + xhr.status : 'the server did not answer');
    }
  });

  document.addEventListener('htmx:configRequest', function (evt) {
    var elt = evt.detail.elt;
    if (!elt || !elt.hasAttribute || !elt.hasAttribute('data-drop-empty')) { return; }
    var params = evt.detail.formData || evt.detail.parameters;
    if (!params || typeof params.keys !== 'function') { return; }
    Array.from(params.keys()).forEach(function (key) {
      var values = params.getAll(key).filter(function (v) {
        return typeof v !== 'string' || v.trim() !== '';
      });
      params.delete(key);
      values.forEach(function (v) { params.append(key, typeof v === 'string' ? v.trim() : v); });
    });
  });
})();
