#!/bin/sh
# The image's entry point: `doq serve` with the arguments given to the container.
#
# Started as root (the compose file does so), it first gives the node's user (uid 10001)
# private copies of the files mounted under /run/secrets, in /run/doq-secrets, and then drops
# to that user for good. Compose mounts a file secret as the host file itself, with its host
# owner and mode: `doq keys add` and the documented secret command write 0600 files of the
# host user, which uid 10001 could not read, and making them readable on the host would
# expose the cluster secret to every local user. Started as any other user (the image's
# default, Kubernetes) it starts the node as that user and copies nothing.
set -eu
if [ "$(id -u)" = 0 ]; then
    install -d -o 10001 -g 10001 -m 0700 /run/doq-secrets
    for secret in /run/secrets/*; do
        [ -f "$secret" ] || continue
        install -o 10001 -g 10001 -m 0400 "$secret" "/run/doq-secrets/${secret##*/}"
    done
    exec setpriv --reuid=10001 --regid=10001 --clear-groups --no-new-privs \
        python doq.py serve "$@"
fi
exec python doq.py serve "$@"
