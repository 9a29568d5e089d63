# Sourced by the scripts that fetch packages from Debian sid (sid-engines.sh,
# nvidia-ctk-fixtures.sh) without touching the system's: apt with a private sources list,
# lists, cache and (empty) dpkg status. The caller defines fail (one line, then exit).

SID_KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
SID_MIRROR=http://deb.debian.org/debian

# sid_apt DIR: a fresh private apt state in DIR, sid's lists fetched; the options every later
# apt-get or apt-cache call needs are left in the array sid_apt_options.
sid_apt() {
  local apt=$1 arch
  [ -r "$SID_KEYRING" ] || fail "$SID_KEYRING is missing: apt-get install -y debian-archive-keyring"
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
