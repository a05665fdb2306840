#!/usr/bin/env bash
# Prints the Debian packages owning the shared libraries that BINARY... load, one per line: the
# container files install exactly these in their runtime stage, so the list cannot drift from
# what the build (scripts/install-deps.sh + CMake) linked. A library no package owns is an error,
# unless it lies under one of the colon-separated folders in $HYSCALE_UNOWNED_OK (the worker's
# pip-installed PyTorch and HyScale's own libraries, copied as they are).
# Usage: runtime-packages.sh BINARY...
set -euo pipefail
IFS=: read -r -a unowned_ok <<<"${HYSCALE_UNOWNED_OK:-}"
mapfile -t libs < <(ldd "$@" | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u)

# Owners of `paths`, "package path" per line; one dpkg-query for all (each call reads every
# package's file list).
owners() { (($# == 0)) || dpkg-query -S "$@" 2>/dev/null | sed -n 's/^\([^:,]*\)[^ ]* \(\/.*\)$/\1 \2/p' || true; }

declare -A owner
while read -r package path; do owner[$path]=$package; done < <(owners "${libs[@]}")
# Under merged /usr, dpkg may know a library by its other path.
resolved=()
for lib in "${libs[@]}"; do [[ -n ${owner[$lib]:-} ]] || resolved+=("$(readlink -f "$lib")"); done
while read -r package path; do owner[$path]=$package; done < <(owners "${resolved[@]}")

status=0
packages=()
for lib in "${libs[@]}"; do
  package=${owner[$lib]:-${owner[$(readlink -f "$lib")]:-}}
  if [[ -n $package ]]; then
    packages+=("$package")
    continue
  fi
  allowed=0
  for dir in "${unowned_ok[@]}"; do [[ -n $dir && $lib == "$dir"/* ]] && allowed=1; done
  ((allowed)) && continue
  echo "runtime-packages: no Debian package owns $lib" >&2
  status=1
done
((${#packages[@]} == 0)) || printf '%s\n' "${packages[@]}" | sort -u
exit $status
