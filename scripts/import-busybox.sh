#!/usr/bin/env bash
# Makes a local `busybox:latest` image from Debian's busybox-static, so the
# quick start works on a machine with no access to a registry. An existing
# busybox:latest is left alone.
set -euo pipefail
image=${1:-busybox:latest}
if docker image inspect "$image" >/dev/null 2>&1; then
	echo "import-busybox: $image already present"
	exit 0
fi
bb=/bin/busybox
[ -x "$bb" ] || { echo "import-busybox: $bb missing: apt-get install busybox-static" >&2; exit 1; }
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
mkdir -p "$root/bin" "$root/etc" "$root/tmp"
cp "$bb" "$root/bin/busybox"
for applet in $("$bb" --list); do
	[ "$applet" = busybox ] || ln -sf busybox "$root/bin/$applet"
done
echo 'root:x:0:0:root:/root:/bin/sh' >"$root/etc/passwd"
tar -C "$root" -c . | docker import -c 'CMD ["sh"]' -c 'ENV PATH=/bin' - "$image" >/dev/null
echo "import-busybox: $image imported"
