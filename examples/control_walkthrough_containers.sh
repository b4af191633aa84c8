#!/usr/bin/env bash
# The control-plane walkthrough with jobs in containers, as the README shows it: a project
# whose release tag the `image` builder makes into crawlhub/shop:1.0 (the default recipe:
# the base image + the project + crawlhub's SDK), a job on it with `runtime: container`,
# run, paused by the engine (a cgroup freeze), continued, restarted (a fresh container),
# its logs searched, cancelled. Every step is checked; the first that fails stops the
# script with a message naming it (exit 1).
#
#   bash examples/control_walkthrough_containers.sh
#
# Needs podman (apt-get install -y podman runc; ENGINE=docker works too) and the base image
# localhost/crawlhub-base:1 (crawlhub builds base-image builds it, offline), plus
# crawlhub (CRAWLHUB=...), python3 (PYTHON=...), git and curl. Like the process walkthrough
# it runs its own `crawlhub serve` on a free port (PORT=...) with a temporary data
# directory, and removes both, the run's containers and the image when it ends (KEEP=1
# keeps the directory).
set -euo pipefail

CRAWLHUB=${CRAWLHUB:-crawlhub}
PYTHON=${PYTHON:-python3}
ENGINE=${ENGINE:-podman}
BASE=localhost/crawlhub-base:1
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
    "$ENGINE" rmi crawlhub/shop:1.0 >/dev/null 2>&1 || true
    if [ "${KEEP:-}" = 1 ]; then echo "kept $DIR"; else rm -rf "$DIR"; fi
}
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
# container_of RUN: the engine's state of the run's container (labelled crawlhub.run=RUN)
container_of() { "$ENGINE" ps -a --filter "label=crawlhub.run=$1" --format '{{.State}}'; }

"$ENGINE" info >/dev/null 2>&1 || fail "$ENGINE does not answer: apt-get install -y podman runc"
"$ENGINE" image exists "$BASE" || fail "no base image $BASE: crawlhub builds base-image"
trap stop EXIT

cd "$DIR"
step "the server: $HUB, data under $DIR/data"
$CRAWLHUB serve --data-dir data --bind 127.0.0.1 --port "$PORT" >serve.log 2>&1 &
SERVER=$!
until_ok 60 "the server to answer (see $DIR/serve.log)" curl -sf "$HUB/healthz"

step "the project's code: count.py counts 1000 pages with crawlhub.sdk"
mkdir work
cat >work/count.py <<'EOF'
"""Count 1000 pages, one every 50 ms, ending when asked."""
import time

from crawlhub import sdk

control = sdk.control()
for n in range(1, 1001):
    if not control.wait_while_paused():  # False: cancel asked; stop cleanly
        break
    sdk.log(f"page {n} counted")
    sdk.set_counters({"success": n, "total": 1000})
    time.sleep(0.05)
sdk.flush()
EOF
git init -q --bare shop.git
git_ -C work init -q -b main
git_ -C work add count.py && git_ -C work commit -q -m "count pages"
git_ -C work remote add origin "$DIR/shop.git" && git_ -C work push -q origin main

step "1. a project built by the image builder"
curl -sf -X POST "$HUB/projects/" -H 'content-type: application/json' -d '{
  "name": "shop", "git_url": "file://'"$DIR"'/shop.git", "builder": "image"}'
echo

step "2. a release tag: the build makes the image crawlhub/shop:1.0"
git -C work tag release/shop/1.0 && git -C work push -q origin release/shop/1.0
BUILD=$(curl -sf -X POST "$HUB/projects/shop/builds" -H 'content-type: application/json' \
     -d '{"tag": "release/shop/1.0"}' | field id)
build_done() { curl -sf "$HUB/builds/$BUILD" | field status | grep -qE 'succeeded|failed'; }
until_ok 300 "build $BUILD to end" build_done
curl -sf "$HUB/builds/$BUILD" >build.json
[ "$(field status <build.json)" = succeeded ] \
  || fail "build $BUILD failed: $(field error <build.json)"
echo "build $BUILD: an $(field artifact_kind <build.json), $(field artifact_path <build.json)"
"$ENGINE" image exists crawlhub/shop:1.0 || fail "the engine has no image crawlhub/shop:1.0"

step "3. a job in a container of that image; run it"
curl -sf -X POST "$HUB/jobs/" -H 'content-type: application/json' -d '{
  "name": "shop-pages", "project": "shop", "version": "1.0", "runtime": "container",
  "memory": "256m", "pause_signal": true, "command": ["python3", "count.py"]}' >/dev/null
RUN=$(curl -sf -X POST "$HUB/jobs/shop-pages/run" | field run_id)
echo "run $RUN"
success() { curl -sf "$HUB/jobs/shop-pages/queue" | field success; }
counted() { local n; n=$(success); [ "$n" != None ] && [ "$n" -ge "$1" ]; }
until_ok 60 "the run to count 20 pages" counted 20
"$ENGINE" ps --filter "label=crawlhub.run=$RUN" --format '{{.Names}} {{.Image}} {{.State}}'

step "4. pause: the engine freezes the container; continue thaws it"
curl -sf -X POST "$HUB/jobs/shop-pages/pause" >/dev/null
frozen() { curl -sf "$HUB/runs/$RUN" | field run paused | grep -qx frozen; }
until_ok 30 "the run to be frozen" frozen
container_of "$RUN" | grep -qix paused || fail "run $RUN's container is $(container_of "$RUN"), not paused"
sleep 2  # what the job counted before the freeze reaches the run at the next heartbeat
PAUSED=$(success)
sleep 2
[ "$(success)" = "$PAUSED" ] || fail "the run counted on while frozen ($PAUSED, then $(success))"
curl -sf -X POST "$HUB/jobs/shop-pages/continue" >/dev/null
until_ok 30 "the run to count on after continue" counted $((PAUSED + 5))
curl -sf "$HUB/jobs/shop-pages/queue"; echo

step "5. restart: a fresh container, the old run cancelled"
AGAIN=$(curl -sf -X POST "$HUB/jobs/shop-pages/restart" | field run_id)
echo "run $AGAIN"
[ "$(curl -sf "$HUB/runs/$RUN" | field run status)" = cancelled ] || fail "run $RUN is not cancelled"
on_new_run() { curl -sf "$HUB/jobs/shop-pages/queue" | field run | grep -qx "$AGAIN"; }
until_ok 30 "the queue figures of run $AGAIN" on_new_run
until_ok 60 "run $AGAIN to count 15 pages" counted 15
[ -z "$(container_of "$RUN")" ] || fail "run $RUN's container is still there"

step "6. search the logs of both runs"
curl -sf "$HUB/logs?q=page+12&job=shop-pages" >logs.json
head -c 300 logs.json; echo
for run in "$RUN" "$AGAIN"; do
    grep -q "\"$run\"" logs.json || fail "no log line 'page 12 counted' of run $run"
done

step "7. cancel: SIGTERM to the container, the run ends cancelled, its container removed"
curl -sf -X POST "$HUB/jobs/shop-pages/cancel" >/dev/null
ended() { curl -sf "$HUB/runs/$AGAIN" | field run status | grep -qvE 'queued|running|paused'; }
until_ok 60 "run $AGAIN to end" ended
STATUS=$(curl -sf "$HUB/runs/$AGAIN" | field run status)
echo "run $AGAIN: $STATUS"
[ "$STATUS" = cancelled ] || fail "run $AGAIN ended $STATUS, not cancelled"
[ -z "$(container_of "$AGAIN")" ] || fail "run $AGAIN's container is still there"

step "the walkthrough passed"
