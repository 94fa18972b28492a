#!/bin/sh
# runner-init.sh is a runner container's entrypoint (docker-compose.yml): it undoes the two parts of
# Docker's confinement that stop a runner, then runs sbx with the container's arguments. It needs
# CAP_SYS_ADMIN, which the compose file grants the runners alone; docs/fleet.md says why each step.
set -eu
# Docker mounts the container's own cgroup read-only; the runner creates its jobs' cgroups inside it.
if [ "$(stat -fc %T /sys/fs/cgroup)" = cgroup2fs ]; then
	mount -o remount,rw /sys/fs/cgroup
else
	for m in /sys/fs/cgroup/*/; do mount -o remount,bind,rw "$m"; done
fi
# Docker covers parts of /proc (kcore, keys, sys, ...) with mounts; the kernel refuses a fresh /proc
# (bwrap --proc, for readonly jobs) in a new user namespace while any of /proc is covered.
awk '$5 ~ "^/proc/" { print $5 }' /proc/self/mountinfo | sort -r | while read -r m; do umount "$m"; done
exec /usr/local/bin/sbx "$@"
