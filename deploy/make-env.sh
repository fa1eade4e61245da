#!/bin/sh
# Write the secrets compose.yaml needs into an env file (default: .env beside compose.yaml), each a random
# 256-bit hex string: hex needs no escaping in a Redis URL or on Redis's command line.
#
#   deploy/make-env.sh            # creates .env, readable by you only; refuses to touch an existing one
#   deploy/make-env.sh other.env  # another file (then: docker compose --env-file other.env up)
#
# To rotate a secret, delete its line and run the script again with --add: it keeps the other lines and
# appends a fresh value for each missing variable (then restart what uses it; see the README).
set -eu

ADD=0
if [ "${1:-}" = "--add" ]; then ADD=1; shift; fi
OUT="${1:-$(dirname "$0")/../.env}"
VARS="REDIS_DISPATCHER_PASSWORD REDIS_WORKER_PASSWORD REDIS_JOBS_PASSWORD REDIS_ADMIN_PASSWORD GRAFANA_ADMIN_PASSWORD"

if [ -e "$OUT" ] && [ "$ADD" -eq 0 ]; then
    echo "$OUT exists; not overwriting it (use --add to fill in missing variables)" >&2
    exit 1
fi

secret() {
    # The kernel's CSPRNG through od, which every base image has; openssl may be missing.
    od -An -N32 -tx1 /dev/urandom | tr -d ' \n'
}

umask 077  # the file is created readable and writable by its owner only
touch "$OUT"
for var in $VARS; do
    if ! grep -q "^$var=" "$OUT"; then
        printf '%s=%s\n' "$var" "$(secret)" >> "$OUT"
    fi
done
echo "wrote $OUT"
