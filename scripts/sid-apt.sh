# Sourced by the scripts that fetch packages from Debian sid (sid-engines.sh,
# nvidia-ctk-fixtures.sh) without touching the system's: apt with a private sources list,
# lists, cache and (empty) dpkg status. The caller defines fail (one line, then exit).

SID_KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg

# debian_mirror: the Debian archive the system's own apt sources use (deb822 files in
# /etc/apt/sources.list.d, or one-line entries), so that a proxy or a local mirror serves
# these fetches too; NVHOOK_DEBIAN_MIRROR overrides it. The security archive is not one.
debian_mirror() {
  if [ -n "${NVHOOK_DEBIAN_MIRROR:-}" ]; then
    echo "$NVHOOK_DEBIAN_MIRROR"
    return
  fi
  local found
  found=$(
    {
      for f in /etc/apt/sources.list.d/*.sources; do
        [ -r "$f" ] && awk '/^URIs:/ { for (i = 2; i <= NF; i++) print $i }' "$f"
      done
      for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [ -r "$f" ] && awk '$1 == "deb" { for (i = 2; i <= NF; i++) if ($i !~ /^\[/ && $i !~ /\]$/) { print $i; break } }' "$f"
      done
    } | grep -E '/debian/?$' | grep -v security | head -1
  )
  [ -n "$found" ] ||
    fail "no Debian archive in the system's apt sources (/etc/apt/sources.list, /etc/apt/sources.list.d): set NVHOOK_DEBIAN_MIRROR to one"
  echo "${found%/}"
}

# sid_apt DIR: a fresh private apt state in DIR, sid's lists fetched; the options every later
# apt-get or apt-cache call needs are left in the array sid_apt_options.
sid_apt() {
  local apt=$1 arch
  [ -r "$SID_KEYRING" ] || fail "$SID_KEYRING is missing: apt-get install -y debian-archive-keyring"
  SID_MIRROR=$(debian_mirror)
  rm -rf "$apt"
  mkdir -p "$apt/lists/partial" "$apt/archives/partial" "$apt/cache"
  arch=$(dpkg --print-architecture)
  echo "deb [arch=$arch signed-by=$SID_KEYRING target=Packages] $SID_MIRROR sid main" >"$apt/sources.list"
  : >"$apt/status"
  # The system's apt.conf.d still applies (a proxy, for instance); every path apt writes is
  # ours. As root apt downloads as _apt, which may not reach the project directory: stay root.
  sid_apt_options=(
    -o "Dir::Etc::sourcelist=$apt/sources.list" -o Dir::Etc::sourceparts=-
    -o "Dir::State::lists=$apt/lists" -o "Dir::State::status=$apt/status"
    -o "Dir::Cache=$apt/cache" -o "Dir::Cache::archives=$apt/archives"
    -o APT::Sandbox::User=root -o Debug::NoLocking=true
  )
  apt-get "${sid_apt_options[@]}" -qq update >"$apt/update.log" 2>&1 ||
    fail "apt-get update of $SID_MIRROR sid failed (network? see $apt/update.log): $(grep -m1 -E '^(E|W):' "$apt/update.log" || tail -1 "$apt/update.log")"
  # apt-get update says only a warning, and succeeds, when it fetched nothing.
  compgen -G "$apt/lists/*_Packages*" >/dev/null ||
    fail "apt-get update of $SID_MIRROR sid fetched no package list (network? see $apt/update.log): $(grep -m1 -E '^(E|W):' "$apt/update.log" || tail -1 "$apt/update.log")"
}
