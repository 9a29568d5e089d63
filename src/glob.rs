//! Glob patterns within one path component, as Go's `filepath.Match` and glob(3) read the
//! `*` and `?` of a containerd drop-in pattern or an ld.so.conf `include`.

/// Whether the name `name` matches `pattern` (`*.toml`, `00-*.conf`); a pattern with a
/// character class matches nothing here.
pub fn glob_matches(pattern: &str, name: &str) -> bool {
    if pattern.contains(['[', '\\']) {
        return false;
    }
    fn matches(p: &[u8], n: &[u8]) -> bool {
        match (p.first(), n.first()) {
            (None, None) => true,
            (Some(b'*'), _) => matches(&p[1..], n) || (!n.is_empty() && matches(p, &n[1..])),
            (Some(b'?'), Some(_)) => matches(&p[1..], &n[1..]),
            (Some(a), Some(b)) if a == b => matches(&p[1..], &n[1..]),
            _ => false,
        }
    }
    matches(pattern.as_bytes(), name.as_bytes())
}
