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
# For tests that deploy another app (tests/apps/test_secagg_deployment.py), and then check the outcome themselves:
#   FEDSIM_SMOKE_OVERRIDES      the scenario overrides (default: 2 rounds of the quickstart, one client per SuperNode)
#   FEDSIM_SMOKE_SERVERAPP, FEDSIM_SMOKE_CLIENTAPP   the staged pyproject's [tool.flwr.app.components] entries
#   FEDSIM_SMOKE_RUN_CONFIG     more run-config entries, "key=value key='text'" (TOML values, no spaces inside):
#                               declared in the staged pyproject (Flower refuses undeclared keys) and passed to the run
#   FEDSIM_SMOKE_MIN_NODES      the run config's min-nodes (default: every SuperNode)
#   FEDSIM_SMOKE_REFUSALS=0     --secure without the refusal checks (tests/apps/test_secure_deployment.py makes them)
#   FEDSIM_SMOKE_KILL           a kill plan, "ROUND:ID[,ID...] ...": SIGKILL the process groups of the SuperNodes with
#                               those partition ids after ROUND's SecAgg+ share-keys stage. The run config then has
#                               signal-dir: the ServerApp (a test harness, tests/apps/secagg_harness.py) writes
#                               signal-dir/keys-shared-r<N> once round N's share-keys replies are in and waits for
#                               signal-dir/resume-r<N>, which this script writes after that round's kills (so no node
#                               dies early or late by a race). With a kill plan, the run must end (exit 0) and every
#                               planned kill happen; the 2-round checks are the caller's to replace.
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
MIN_NODES="${FEDSIM_SMOKE_MIN_NODES:-$NUM_NODES}"
RUN_CONFIG_EXTRA="${FEDSIM_SMOKE_RUN_CONFIG:-}"
KILL_PLAN="${FEDSIM_SMOKE_KILL:-}"
declare -A KILLS=()   # round -> "id id ..." (partition ids)
for entry in $KILL_PLAN; do
    if [[ ! $entry =~ ^([1-9][0-9]*):([0-9]+(,[0-9]+)*)$ ]]; then
        echo "FEDSIM_SMOKE_KILL: '$entry' is not ROUND:ID[,ID...]" >&2; exit 2
    fi
    for id in ${BASH_REMATCH[2]//,/ }; do
        if (( 10#$id >= NUM_NODES )); then
            echo "FEDSIM_SMOKE_KILL: partition id $id, but there are $NUM_NODES SuperNodes" >&2; exit 2
        fi
        KILLS[${BASH_REMATCH[1]}]+="$((10#$id)) "
    done
done
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
NODE_PIDS=()   # by partition id: each SuperNode's PID, which is also its process group's id
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
#    with the ServerApp's run-config keys declared (docs/tutorials/deploy.md)
APP="$WORK/app"
mkdir -p "$APP"
(cd "$REPO" && git ls-files -co --exclude-standard -z | xargs -0 -I{} cp --parents {} "$APP"/ 2>/dev/null || true)
if [[ -n "$KILL_PLAN" ]]; then
    SIGNALS="$WORK/signals"
    mkdir -p "$SIGNALS"
    RUN_CONFIG_EXTRA+=" signal-dir='$SIGNALS'"
fi
python - "$APP/pyproject.toml" "${FEDSIM_SMOKE_SERVERAPP:-}" "${FEDSIM_SMOKE_CLIENTAPP:-}" "$RUN_CONFIG_EXTRA" <<'PY'
import re, sys
p, serverapp, clientapp, run_config = sys.argv[1:5]
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
# the caller's keys, declared with the values the run gets (FEDSIM_SMOKE_RUN_CONFIG)
extra.update(kv.split("=", 1) for kv in run_config.split())
head = "[tool.flwr.app.config]\n"
missing = "".join(f"{k} = {v}\n" for k, v in extra.items() if f"\n{k} =" not in text)
text = text.replace(head, head + missing, 1)
for component, ref in (("serverapp", serverapp), ("clientapp", clientapp)):
    if ref:
        text, n = re.subn(rf'(?m)^{component} = ".*"$', f'{component} = "{ref}"', text, count=1)
        assert n == 1, f"no {component} entry in [tool.flwr.app.components]"
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
    REGISTERING=()   # the registrations run side by side: each is mostly a Python CLI starting up
    for i in $(seq 1 "$NUM_NODES"); do
        flwr supernode register "$CERTS/node-$i.pub" fedsim-smoke >"$WORK/logs/register-$i.log" 2>&1 &
        REGISTERING+=($!)
    done
    for i in $(seq 1 "$NUM_NODES"); do
        wait "${REGISTERING[$((i - 1))]}" \
            || { cat "$WORK/logs/register-$i.log" >&2; echo "registering SuperNode $i's key failed" >&2; exit 1; }
    done
    echo "registered $NUM_NODES SuperNode public keys"
    # refused: a key that was never registered, and a SuperNode that does not speak TLS
    unregistered=$((NUM_NODES + 1))
    ATTEMPTS=(unregistered no-tls)
    if [[ "${FEDSIM_SMOKE_REFUSALS:-1}" == 0 ]]; then
        ATTEMPTS=()
        echo "refusals not checked (FEDSIM_SMOKE_REFUSALS=0)"
    fi
    for attempt in "${ATTEMPTS[@]}"; do
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
    NODE_PIDS+=($!)
done
echo "started SuperLink (127.0.0.1:$LINK_PORT, $([[ $SECURE -eq 1 ]] && echo 'TLS, SuperNode authentication' || echo insecure)) and $NUM_NODES SuperNodes; pids ${PIDS[*]}"

echo "scenario overrides: $OVERRIDES"

# the kill plan: answer each keys-shared-r<N> marker of the ServerApp, killing round N's SuperNodes first
kill_group() {   # kill_group ROUND ID: SIGKILL SuperNode ID's process group and wait until it is gone
    local pgid=${NODE_PIDS[$2]} members
    members=$(ps -e -o pid=,pgid= | awk -v g="$pgid" '$2 == g {print $1}' | tr '\n' ' ')
    if ! kill -KILL -- "-$pgid" 2>/dev/null; then
        echo "SuperNode partition-id=$2 (process group $pgid) was gone before round $1's kill" >&2; return
    fi
    for _ in $(seq 1 100); do   # gone: no member of the group left but zombies
        [[ -z $(ps -e -o pgid=,stat= | awk -v g="$pgid" '$1 == g && $2 !~ /^Z/') ]] && break
        sleep 0.1
    done
    echo "killed SuperNode partition-id=$2 after round $1's share-keys: SIGKILL to process group $pgid (pids ${members% })"
}
watch_kills() {
    local n=1
    while :; do
        while [[ ! -e "$SIGNALS/keys-shared-r$n" ]]; do sleep 0.2; done
        for id in ${KILLS[$n]:-}; do kill_group "$n" "$id"; done
        touch "$SIGNALS/resume-r$n"
        n=$((n + 1))
    done
}
if [[ -n "$KILL_PLAN" ]]; then
    watch_kills &
    PIDS+=($!)
    WATCH_PID=$!
    echo "kill plan (round: partition ids): $KILL_PLAN"
fi

# 4. the run, followed until it ends
cd "$APP"
set +e
timeout "$TIMEOUT_S" flwr run . fedsim-smoke --stream \
    --run-config "scenario='quickstart' overrides='$OVERRIDES' min-nodes=$MIN_NODES diagnostics=true run-dir='$RUN_DIR'${RUN_CONFIG_EXTRA:+ $RUN_CONFIG_EXTRA}" \
    >"$WORK/logs/flwr-run.log" 2>&1
RUN_RC=$?
set -e
cat "$WORK/logs/flwr-run.log"
[[ $RUN_RC -eq 0 ]] || { echo "flwr run exited with $RUN_RC" >&2; exit 1; }

# 5. checks
LOG="$WORK/logs/flwr-run.log"
grep -q "run directory (on the server): " "$LOG" || { echo "the ServerApp never started its run" >&2; exit 1; }
if [[ -n "$KILL_PLAN" ]]; then
    kill "$WATCH_PID" 2>/dev/null || true
    for r in "${!KILLS[@]}"; do
        [[ -e "$SIGNALS/resume-r$r" ]] || { echo "kill plan: round $r's share-keys stage never came" >&2; exit 1; }
    done
    echo "deploy smoke run finished with its kill plan carried out ($KILL_PLAN); the caller checks the outcome"
    exit 0
fi
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
