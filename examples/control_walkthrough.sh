#!/usr/bin/env bash
# The control plane end to end, as the README shows it: a project in a local git
# repository, a release tag built by a signed webhook, a job on the build with cron, run,
# paused, continued and cancelled, its logs searched. Every step is checked; the first
# that fails stops the script with a message naming it (exit 1).
#
#   bash examples/control_walkthrough.sh
#
# It runs its own `crawlhub serve` on a free port of 127.0.0.1 (PORT=... to choose one)
# with a data directory in a temporary directory, so the quickstart's server on 8526 may
# go on running; it stops its server and removes the directory when it ends (KEEP=1 keeps
# it, to look around). Needs crawlhub (CRAWLHUB=...), python3 (PYTHON=...), git and curl.
set -euo pipefail

CRAWLHUB=${CRAWLHUB:-crawlhub}
PYTHON=${PYTHON:-python3}
SECRET=s3cret-s3cret-s3cret
PORT=${PORT:-$("$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}
HUB=http://127.0.0.1:$PORT
DIR=$(mktemp -d "${TMPDIR:-/tmp}/crawlhub-walkthrough.XXXXXX")
SERVER=

step() { printf '\n== %s\n' "$*"; }
fail() { printf 'walkthrough FAILED: %s\n' "$*" >&2; exit 1; }
stop() {
    if [ -n "$SERVER" ] && kill -0 "$SERVER" 2>/dev/null; then
        kill "$SERVER" && wait "$SERVER" 2>/dev/null || true
    fi
    if [ "${KEEP:-}" = 1 ]; then echo "kept $DIR"; else rm -rf "$DIR"; fi
}
trap stop EXIT
# field KEY...: the value at KEY... of the JSON on stdin (None for null)
field() {
    "$PYTHON" -c 'import json, sys
d = json.load(sys.stdin)
for key in sys.argv[1:]:
    d = d[key]
print(json.dumps(d) if isinstance(d, (dict, list)) else d)' "$@"
}
# until_ok SECONDS WHAT COMMAND...: run COMMAND every 0.2 s until it succeeds
until_ok() {
    local limit=$1 what=$2; shift 2
    local deadline=$((SECONDS + limit))
    until "$@" >/dev/null 2>&1; do
        [ "$SECONDS" -lt "$deadline" ] || fail "waited $limit s for $what"
        sleep 0.2
    done
}
git_() { git -c user.name=walkthrough -c user.email=walkthrough@example.com "$@"; }

cd "$DIR"
step "the server: $HUB, data under $DIR/data"
$CRAWLHUB serve --data-dir data --bind 127.0.0.1 --port "$PORT" >serve.log 2>&1 &
SERVER=$!
until_ok 60 "the server to answer (see $DIR/serve.log)" curl -sf "$HUB/healthz"

step "the project's code: count.py counts 1000 pages with crawlhub.sdk"
mkdir work
cat >work/count.py <<'EOF'
"""Count 1000 pages, one every 50 ms, holding still while paused, ending when asked."""
import time

from crawlhub import sdk

control = sdk.control()
for n in range(1, 1001):
    if not control.wait_while_paused():  # False: cancel asked; stop cleanly
        break
    with sdk.task(f"pages-{n // 50}"):
        sdk.log(f"page {n} counted")
        sdk.set_counters({"success": n, "total": 1000})
        time.sleep(0.05)
sdk.flush()
EOF
git init -q --bare shop.git                 # the project's remote (a forge's, in real life)
git_ -C work init -q -b main
git_ -C work add count.py && git_ -C work commit -q -m "count pages"
git_ -C work remote add origin "$DIR/shop.git" && git_ -C work push -q origin main

step "1. a project: its webhook secret is stored encrypted and never answered"
curl -sf -X POST "$HUB/projects/" -H 'content-type: application/json' -d '{
  "name": "shop", "git_url": "file://'"$DIR"'/shop.git", "webhook_secret": "'"$SECRET"'"}' \
  | tee project.json
echo
grep -q "$SECRET" project.json && fail "the project's answer shows its webhook secret"

step "2. a release tag and the forge's signed webhook: the build starts"
git -C work tag release/shop/1.0 && git -C work push -q origin release/shop/1.0
BODY='{"ref": "refs/tags/release/shop/1.0", "after": "'$(git -C work rev-parse HEAD)'", "repository": {"full_name": "me/shop"}}'
SIG=$(printf '%s' "$BODY" | "$PYTHON" -c 'import hashlib, hmac, sys
print(hmac.new(sys.argv[1].encode(), sys.stdin.buffer.read(), hashlib.sha256).hexdigest())' "$SECRET")
UNSIGNED=$(curl -s -o /dev/null -w '%{http_code}' -X POST "$HUB/hooks/shop" \
     -H 'X-GitHub-Event: push' -H 'content-type: application/json' -d "$BODY")
[ "$UNSIGNED" = 401 ] || fail "an unsigned webhook was answered $UNSIGNED, not 401"
curl -sf -X POST "$HUB/hooks/shop" -H 'X-GitHub-Event: push' \
     -H "X-GitHub-Delivery: $("$PYTHON" -c 'import uuid; print(uuid.uuid4())')" \
     -H "X-Hub-Signature-256: sha256=$SIG" -H 'content-type: application/json' -d "$BODY" \
  | tee hook.json
echo
BUILD=$(field build <hook.json)
build_done() { curl -sf "$HUB/builds/$BUILD" | field status | grep -qE 'succeeded|failed'; }
until_ok 300 "build $BUILD to end" build_done
curl -sf "$HUB/builds/$BUILD" >build.json
[ "$(field status <build.json)" = succeeded ] \
  || fail "build $BUILD failed: $(field error <build.json)"
echo "build $BUILD succeeded: a $(field artifact_kind <build.json), $(field artifact_path <build.json)"
$CRAWLHUB builds list --project shop --json --data-dir data   # from the command line

step "3. a job on that artifact, with cron; run it now"
curl -sf -X POST "$HUB/jobs/" -H 'content-type: application/json' -d '{
  "name": "shop-pages", "project": "shop", "version": "1.0",
  "command": ["python", "count.py"], "cron": "0 * * * *"}' >/dev/null
RUN=$(curl -sf -X POST "$HUB/jobs/shop-pages/run" | field run_id)
echo "run $RUN"
success() { curl -sf "$HUB/jobs/shop-pages/queue" | field success; }
counted() { local n; n=$(success); [ "$n" != None ] && [ "$n" -ge "$1" ]; }
until_ok 60 "the run to count 60 pages" counted 60

step "4. pause and continue: the counters stop, and go on after"
curl -sf -X POST "$HUB/jobs/shop-pages/pause" >/dev/null
# the run's row has its counters within a second or so: still for 2 s is stopped
settled() { local a b; a=$(success); sleep 2; b=$(success); [ "$a" = "$b" ]; }
until_ok 30 "the paused run to stop counting" settled
PAUSED=$(success)
sleep 2
curl -sf "$HUB/jobs/shop-pages/queue"; echo
[ "$(success)" = "$PAUSED" ] || fail "the run counted on while paused ($PAUSED, then $(success))"
curl -sf -X POST "$HUB/jobs/shop-pages/continue" >/dev/null
until_ok 30 "the run to count on after continue" counted $((PAUSED + 5))
curl -sf "$HUB/jobs/shop-pages/queue"; echo

step "5. search the logs (every line carries job, run and task); the run's record"
curl -sf "$HUB/logs?q=page+42&job=shop-pages" >logs.json
head -c 300 logs.json; echo
grep -q '"page 42 counted"' logs.json || fail "no log line 'page 42 counted'"
curl -sf "$HUB/runs/$RUN" | field run counters

step "6. cancel: the job ends cleanly"
curl -sf -X POST "$HUB/jobs/shop-pages/cancel" >/dev/null
ended() { curl -sf "$HUB/runs/$RUN" | field run status | grep -qvE 'queued|running|paused'; }
until_ok 60 "run $RUN to end" ended
STATUS=$(curl -sf "$HUB/runs/$RUN" | field run status)
echo "run $RUN: $STATUS"
[ "$STATUS" = cancelled ] || fail "run $RUN ended $STATUS, not cancelled"

step "the walkthrough passed"
