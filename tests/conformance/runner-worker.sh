#!/bin/sh
# chime-runner under the conformance suite (docs/conformance.md): writes a runner config for
# the suite's group and worker id with the five conformance jobs as shell handlers, then execs
# the runner ($CHIME_RUNNER, default chime-runner on PATH).
set -e
cfg=$(mktemp)
cat > "$cfg" <<TOML
[worker]
group = "$CHIME_GROUP"
worker_id = "$CHIME_WORKER_ID"

[[handlers]]
name = "conf-ok"
kind = "shell"
argv = ["sh", "-c", 'echo "ok \$1"', "conf-ok", "{tag}"]

[[handlers]]
name = "conf-sleep"
kind = "shell"
argv = ["sh", "-c", 'echo sleeping; exec sleep "\$1"', "conf-sleep", "{seconds}"]
kill_grace = "2s"

[[handlers]]
name = "conf-fail"
kind = "shell"
argv = ["sh", "-c", 'if [ "\$CHIME_ATTEMPT" -le "\$1" ]; then echo "failing \$CHIME_ATTEMPT"; exit 1; fi', "conf-fail", "{fails}"]
retry_codes = [1]

[[handlers]]
name = "conf-fatal"
kind = "shell"
argv = ["sh", "-c", "echo fatal; exit 2"]
fail_codes = [2]

[[handlers]]
name = "conf-log"
kind = "shell"
argv = ["sh", "-c", 'i=1; while [ \$i -le "\$1" ]; do if [ \$i -gt 1 ]; then sleep "\$2"; fi; echo "line \$i"; i=\$((i+1)); done', "conf-log", "{lines}", "{every}"]
TOML
exec "${CHIME_RUNNER:-chime-runner}" --config "$cfg"
