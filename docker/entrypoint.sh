#!/bin/bash
# Roles of the loco image (docker-compose.yml):
#   redis   redis-server with an append-only file in /data
#   head    the head, at port $LOCO_PORT (7070), membership in $LOCO_REDIS
#   worker  a node joining $LOCO_HEAD with $LOCO_RESOURCES (default cpu=2)
#   any other command runs as given (e.g. `loco status --address head:7070`)
# Processes advertise this container's IP, which the other containers reach.
# The cluster key ($LOCO_KEY, a shared volume): the head makes it at its first start, workers
# wait for it; LOCO_INSECURE=1 runs without one (plain TCP).
set -e
advertise() {
  [ -n "${LOCO_ADVERTISE:-}" ] && { echo "$LOCO_ADVERTISE"; return; }
  ip="$(hostname -i 2>/dev/null | awk '{print $1}')"
  [ -n "$ip" ] || ip="$(awk -v h="$(hostname)" '$2 == h {print $1; exit}' /etc/hosts)"
  echo "${ip:-$(hostname)}"
}
role="${1:-worker}"
case "$role" in
  redis)
    shift
    # With $LOCO_REDIS_PASSWORD_FILE (a shared volume): a password made at the first start,
    # given to redis-server in a config file (not its command line, which ps shows).
    conf=()
    if [ -n "${LOCO_REDIS_PASSWORD_FILE:-}" ]; then
      if [ ! -s "$LOCO_REDIS_PASSWORD_FILE" ]; then
        (umask 077; head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$LOCO_REDIS_PASSWORD_FILE")
      fi
      (umask 077; echo "requirepass $(cat "$LOCO_REDIS_PASSWORD_FILE")" > /tmp/redis-auth.conf)
      conf=(/tmp/redis-auth.conf)
    fi
    # Bound to the compose network only: docker-compose.yml publishes no port of it.
    exec redis-server "${conf[@]}" --bind 0.0.0.0 --protected-mode no --dir /data --appendonly yes "$@" ;;
  head)
    shift
    if [ "${LOCO_INSECURE:-}" != 1 ] && [ -n "${LOCO_KEY:-}" ] && [ ! -f "$LOCO_KEY" ]; then
      loco keygen --out "$LOCO_KEY"
    fi
    # The Redis URL goes to loco through $LOCO_REDIS, with the password if there is one.
    LOCO_REDIS="${LOCO_REDIS:-redis://redis:6379}"
    if [ -n "${LOCO_REDIS_PASSWORD_FILE:-}" ] && [[ "$LOCO_REDIS" != *@* ]]; then
      LOCO_REDIS="redis://:$(cat "$LOCO_REDIS_PASSWORD_FILE")@${LOCO_REDIS#redis://}"
    fi
    export LOCO_REDIS
    exec loco start --head --block --host 0.0.0.0 --port "${LOCO_PORT:-7070}" \
      --advertise "$(advertise)" "$@" ;;
  worker)
    shift
    head="${LOCO_HEAD:-head:7070}"
    # Wait (bounded) for the head to answer and for its key, then become the node.
    for i in $(seq 1 "${LOCO_JOIN_WAIT_S:-60}"); do
      if (exec 3<>"/dev/tcp/${head%:*}/${head##*:}") 2>/dev/null &&
         { [ "${LOCO_INSECURE:-}" = 1 ] || [ -z "${LOCO_KEY:-}" ] || [ -f "$LOCO_KEY" ]; }; then
        break
      fi
      sleep 1
    done
    # Within compose's stop_grace_period (5 s): the node leaves cleanly before docker's SIGKILL.
    exec loco start --block --address "$head" --advertise "$(advertise)" \
      --resources "${LOCO_RESOURCES:-cpu=2}" --stop-grace "${LOCO_STOP_GRACE_S:-4}" "$@" ;;
  *)
    exec "$@" ;;
esac
