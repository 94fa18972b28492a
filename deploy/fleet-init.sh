#!/bin/sh
# fleet-init.sh is docker-compose.yml's init service. It makes the fleet's secrets once (a later run
# keeps them) and hands each service only what it needs, each in a volume of its own:
#   /authority (init only)   sbx auth init: the operator key (re-signs nats-auth.conf) and the rest
#   /secrets   (coordinator) token (the API's), enroll.key, account.nk (signs enrolled runners' creds),
#                            coordinator.creds
#   /enroll    (runners)     enroll.key alone: a runner gets its NATS creds from the coordinator with it
#   /nats      (nats)        nats.conf and the nats-auth.conf it includes: public JWTs, no key
set -eu
umask 077
secret() { [ -s "$1" ] || head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$1"; }
secret /secrets/token
secret /secrets/enroll.key
sbx auth init --dir /authority/nats >/dev/null
cp /authority/nats/account.nk /authority/nats/coordinator.creds /secrets/
cp /secrets/enroll.key /enroll/
cp /etc/sbx/nats.conf /authority/nats/nats-auth.conf /nats/
echo "fleet secrets ready; API token: docker compose exec -T coordinator cat /run/sbx/token"
