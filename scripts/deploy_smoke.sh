#!/usr/bin/env bash
# Deployment smoke test: a real SuperLink and 3 SuperNodes on loopback, `flwr run` of this Flower App
# against them (2 rounds, tiny scenario), then checks from the logs that both rounds completed and that the
# certified epsilon was reported. Everything this script starts is killed by PID on exit.
#
#   scripts/deploy_smoke.sh            # from the repository root, with the venv's flwr on PATH or in .venv
#   scripts/deploy_smoke.sh --secure   # TLS (a CA and server certificate from scripts/make_certs.py) and
#                                      # SuperNode authentication (keys registered with `flwr supernode register`);
#                                      # first checks that an unregistered key and a connection without TLS are refused
#
# FEDSIM_SMOKE_RUN_DIR: where the ServerApp writes its run directory (default: inside the work folder, removed on
# success unless FEDSIM_SMOKE_KEEP=1). FEDSIM_SMOKE_PORT, FEDSIM_SMOKE_NODE_PORTS ("p1 p2 ...": one SuperNode each)
# and FEDSIM_SMOKE_REFUSED_PORT move the ports. The checks also read the server's metrics.jsonl: 2 rows, each with a certified epsilon.
#
# Flower 1.41: the SuperLink serves Fleet, Control and ServerAppIo over one HTTP port (--port); each
# SuperNode has its own runtime port (--port). `flwr run . <connection>` reads <connection> from
# $FLWR_HOME/config.toml ([superlink.<name>]); the legacy [tool.flwr.federations] section in pyproject.toml
# would be migrated there by rewriting pyproject.toml, so the app is staged in a temporary copy first.
set -euo pipefail
SECURE=0
case "${1:-}" in
    --secure) SECURE=1 ;;
    "") ;;
    *) echo "usage: $0 [--secure]" >&2; exit 2 ;;
esac

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LINK_PORT="${FEDSIM_SMOKE_PORT:-19091}"          # SuperLink (Fleet + Control + ServerAppIo, HTTP)
read -r -a NODE_PORTS <<< "${FEDSIM_SMOKE_NODE_PORTS:-19101 19102 19103}"   # SuperNode runtime APIs, one each
REFUSED_PORT="${FEDSIM_SMOKE_REFUSED_PORT:-19110}"   # the SuperNodes that must be refused (--secure)
NUM_NODES=${#NODE_PORTS[@]}
TIMEOUT_S="${FEDSIM_SMOKE_TIMEOUT:-300}"
# one training client per SuperNode and one held out (the server evaluates on it)
OVERRIDES="${FEDSIM_SMOKE_OVERRIDES:-rounds=2 data.num_clients=$((NUM_NODES + 1)) data.heldout_fraction=0.01 client.local_epochs=1 privacy.sampling=all privacy.sampling_rate=none engine.name=local}"

if [[ -x "$REPO/.venv/bin/flwr" ]]; then export PATH="$REPO/.venv/bin:$PATH"; fi
WORK="$(mktemp -d /tmp/fedsim-smoke-XXXX)"
export FLWR_HOME="$WORK/flwr-home"
export RAY_TMPDIR="$WORK/r"
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1
export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1
mkdir -p "$FLWR_HOME" "$RAY_TMPDIR" "$WORK/logs"
RUN_DIR="${FEDSIM_SMOKE_RUN_DIR:-$WORK/server-run}"
CERTS="$WORK/certs"

# Each server process is started with setsid, so it leads its own process group: killing the group by the
# PID we recorded also ends the helpers it spawned (flower-superexec, flwr-serverapp, flwr-clientapp).
PIDS=()
cleanup() {
    local rc=$?
    for pid in "${PIDS[@]}"; do
        kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
    done
    sleep 2
    for pid in "${PIDS[@]}"; do
        kill -KILL -- "-$pid" 2>/dev/null || true
    done
    if [[ $rc -ne 0 ]]; then
        echo "--- deploy smoke FAILED (rc=$rc); logs in $WORK/logs" >&2
        for f in "$WORK"/logs/*.log; do echo "--- tail $f" >&2; tail -n 25 "$f" >&2 || true; done
    elif [[ -z "${FEDSIM_SMOKE_KEEP:-}" ]]; then
        rm -rf "$WORK"
    else
        echo "logs kept in $WORK/logs"
    fi
    exit $rc
}
trap cleanup EXIT INT TERM

for port in "$LINK_PORT" "${NODE_PORTS[@]}" "$REFUSED_PORT"; do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
        echo "port $port on 127.0.0.1 is already in use; set FEDSIM_SMOKE_PORT or free it" >&2; exit 2
    fi
done

# 1. stage the app (tracked + untracked-but-not-ignored files), without the legacy federations section and
#    with the ServerApp's run-config keys declared (see the report / README for the pyproject diff)
APP="$WORK/app"
mkdir -p "$APP"
(cd "$REPO" && git ls-files -co --exclude-standard -z | xargs -0 -I{} cp --parents {} "$APP"/ 2>/dev/null || true)
python - "$APP/pyproject.toml" <<'PY'
import re, sys
p = sys.argv[1]
out, skip = [], False
for line in open(p).read().splitlines(keepends=True):
    m = re.match(r"\s*\[(.*)\]", line)
    if m:
        skip = m.group(1).startswith("tool.flwr.federations")
    if not skip:
        out.append(line)
text = "".join(out)
# run-config keys the ServerApp reads; Flower rejects --run-config keys that the app does not declare
extra = {"min-nodes": "1", "population": "0", "server-eval": "true", "ledger-path": '""'}
head = "[tool.flwr.app.config]\n"
missing = "".join(f"{k} = {v}\n" for k, v in extra.items() if f"\n{k} =" not in text)
text = text.replace(head, head + missing, 1)
open(p, "w").write(text)
PY

# 2. the Flower config: a named connection to our SuperLink (TLS: trust our CA)
if [[ $SECURE -eq 1 ]]; then
    python "$REPO/scripts/make_certs.py" "$CERTS" --host localhost --host 127.0.0.1 --nodes $((NUM_NODES + 1)) >/dev/null
    CONNECTION="root-certificates = \"$CERTS/ca.crt\""
    LINK_FLAGS=(--ssl-ca-certfile "$CERTS/ca.crt" --ssl-certfile "$CERTS/server.pem" --ssl-keyfile "$CERTS/server.key"
                --enable-supernode-auth)
else
    CONNECTION="insecure = true"
    LINK_FLAGS=(--insecure)
fi
cat > "$FLWR_HOME/config.toml" <<TOML
[superlink]
default = "fedsim-smoke"

[superlink.fedsim-smoke]
address = "127.0.0.1:$LINK_PORT"
$CONNECTION
TOML

# node_flags I: how SuperNode I (1-based) connects: TLS with our CA and its own key pair, or insecure
node_flags() {
    if [[ $SECURE -eq 1 ]]; then
        # flwr 1.41 derives the public key from the private one (--auth-supernode-public-key is deprecated)
        echo --root-certificates "$CERTS/ca.crt" --auth-supernode-private-key "$CERTS/node-$1"
    else
        echo --insecure
    fi
}

# 3. SuperLink, the SuperNodes' keys registered (secure), the refusals checked (secure), the SuperNodes
setsid flower-superlink "${LINK_FLAGS[@]}" --host 127.0.0.1 --port "$LINK_PORT" --disable-runtime-dependency-installation \
    >"$WORK/logs/superlink.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 1 60); do
    (exec 3<>"/dev/tcp/127.0.0.1/$LINK_PORT") 2>/dev/null && break
    sleep 0.5
done
if [[ $SECURE -eq 1 ]]; then
    sleep 2
    for i in $(seq 1 "$NUM_NODES"); do
        flwr supernode register "$CERTS/node-$i.pub" fedsim-smoke >"$WORK/logs/register-$i.log" 2>&1 \
            || { cat "$WORK/logs/register-$i.log" >&2; echo "registering SuperNode $i's key failed" >&2; exit 1; }
    done
    echo "registered $NUM_NODES SuperNode public keys"
    # refused: a key that was never registered, and a SuperNode that does not speak TLS
    unregistered=$((NUM_NODES + 1))
    for attempt in unregistered no-tls; do
        if [[ $attempt == unregistered ]]; then
            flags=(--root-certificates "$CERTS/ca.crt" --auth-supernode-private-key "$CERTS/node-$unregistered")
            expect="Failed to activate SuperNode"      # the SuperLink does not know this key
        else
            flags=(--insecure)                         # plaintext to a TLS port: the handshake never happens
            expect="Exit Code: 30[0-9]"
        fi
        set +e
        timeout 60 flower-supernode "${flags[@]}" --superlink "127.0.0.1:$LINK_PORT" --host 127.0.0.1 \
            --port "$REFUSED_PORT" --max-retries 1 --max-wait-time 15 --node-config "partition-id=0 num-partitions=$NUM_NODES" \
            >"$WORK/logs/refused-$attempt.log" 2>&1
        rc=$?
        set -e
        if [[ $rc -eq 0 || $rc -eq 124 ]] || ! grep -Eq "$expect" "$WORK/logs/refused-$attempt.log"; then
            echo "a SuperNode ($attempt) was not refused as expected (exit $rc)" >&2
            tail -n 20 "$WORK/logs/refused-$attempt.log" >&2; exit 1
        fi
        echo "refused as it must be: $attempt SuperNode (exit $rc): $(grep -A2 -E 'Exit Code: [0-9]+' "$WORK/logs/refused-$attempt.log" | tr -s '\n' ' ' | cut -c1-220)"
    done
fi
for i in $(seq 0 $((NUM_NODES - 1))); do
    # shellcheck disable=SC2046  # node_flags prints separate arguments (no spaces inside them)
    setsid flower-supernode $(node_flags $((i + 1))) --superlink "127.0.0.1:$LINK_PORT" --host 127.0.0.1 \
        --port "${NODE_PORTS[$i]}" --node-config "partition-id=$i num-partitions=$NUM_NODES" \
        >"$WORK/logs/supernode-$i.log" 2>&1 &
    PIDS+=($!)
done
echo "started SuperLink (127.0.0.1:$LINK_PORT, $([[ $SECURE -eq 1 ]] && echo 'TLS, SuperNode authentication' || echo insecure)) and $NUM_NODES SuperNodes; pids ${PIDS[*]}"

echo "scenario overrides: $OVERRIDES"

# 4. the run, followed until it ends
cd "$APP"
set +e
timeout "$TIMEOUT_S" flwr run . fedsim-smoke --stream \
    --run-config "scenario='quickstart' overrides='$OVERRIDES' min-nodes=$NUM_NODES diagnostics=true run-dir='$RUN_DIR'" \
    >"$WORK/logs/flwr-run.log" 2>&1
RUN_RC=$?
set -e
cat "$WORK/logs/flwr-run.log"
[[ $RUN_RC -eq 0 ]] || { echo "flwr run exited with $RUN_RC" >&2; exit 1; }

# 5. checks
LOG="$WORK/logs/flwr-run.log"
grep -q "run directory (on the server): " "$LOG" || { echo "the ServerApp never started its run" >&2; exit 1; }
for r in 1 2; do
    grep -Eq "round $r: certified epsilon [0-9.]+" "$LOG" || { echo "round $r never completed" >&2; exit 1; }
done
# diagnostics=true (an operator's smoke test) logs the exact reply counts: every round got every reply
got=$(grep -c "non-private diagnostics\]: .*'received': $NUM_NODES," "$LOG" || true)
[[ "$got" -ge 2 ]] || { echo "expected $NUM_NODES replies in each of 2 rounds (found $got rounds)" >&2; exit 1; }
grep -Eq "certified epsilon after 2 rounds: [0-9.]+" "$LOG" || { echo "no certified epsilon after 2 rounds" >&2; exit 1; }
if grep -q "non-private diagnostics\]: .*'rejected': [1-9]" "$LOG"; then echo "a round rejected replies" >&2; exit 1; fi
python - "$RUN_DIR/metrics.jsonl" <<'PY' || { echo "the server's run directory lacks its rows" >&2; exit 1; }
import json, sys
rows = [json.loads(x) for x in open(sys.argv[1]).read().splitlines() if x.strip()]
assert [r["round"] for r in rows] == [1, 2], rows
assert all(r["epsilon"] > 0 and r["randomness"] == "os-entropy" for r in rows), rows
print(f"server run directory: {len(rows)} rows, certified epsilon {rows[-1]['epsilon']:.4f}")
PY
echo "deploy smoke OK ($([[ $SECURE -eq 1 ]] && echo 'TLS + SuperNode authentication' || echo insecure)): $(grep -Eo "certified epsilon after 2 rounds: [0-9.]+ at delta=[0-9.e-]+" "$LOG" | tail -1)"
