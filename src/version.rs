//! Versions as NVIDIA's toolkit reads them (Masterminds semver, coercing): an optional `v`,
//! one to three numbers (leading zeros allowed, missing ones 0), and an optional `-pre` or
//! `+build` suffix, which orders nothing here. The one reading of `CUDA_VERSION`, of a compat
//! library's version and of the versions in NVIDIA's hook flags.

/// `[major, minor, patch]` of `text`, or None when it is not such a version.
pub fn loose(text: &str) -> Option<[u64; 3]> {
    let text = text.strip_prefix('v').unwrap_or(text);
    let core = text.split(['-', '+']).next().unwrap_or_default();
    let mut out = [0; 3];
    let mut parts = core.split('.');
    for (i, part) in parts.by_ref().take(3).enumerate() {
        if part.is_empty() || part.len() > 19 || !part.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        out[i] = part.parse().ok()?;
    }
    parts.next().is_none().then_some(out)
}

/// `MAJOR.MINOR` of a `CUDA_VERSION` (`12.4.1` -> `12.4`, `12` -> `12.0`, `v12.4` -> `12.4`).
pub fn cuda_major_minor(text: &str) -> Option<String> {
    loose(text).map(|[major, minor, _]| format!("{major}.{minor}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_toolkits_reading() {
        for (text, want) in [
            ("580.95.05", Some([580, 95, 5])),
            ("v12", Some([12, 0, 0])),
            ("12.4", Some([12, 4, 0])),
            ("12.4.1-rc1", Some([12, 4, 1])),
            ("12.4+build.7", Some([12, 4, 0])),
            ("", None),
            ("1.2.3.4", None),
            ("12.x", None),
            ("12.", None),
            ("../12.4", None),
        ] {
            assert_eq!(loose(text), want, "{text}");
        }
    }

    /// One rule for CUDA_VERSION wherever it is read (the legacy requirement, the compat
    /// directory): "12" is 12.0 in both, and so is "v12.0".
    #[test]
    fn cuda_version_has_one_reading() {
        for (text, want) in [
            ("12.4.1", Some("12.4")),
            ("12", Some("12.0")),
            ("v12.4", Some("12.4")),
            ("13.0.1", Some("13.0")),
            ("12.x", None),
            ("", None),
            ("../12.4", None),
            ("12./4", None),
        ] {
            assert_eq!(cuda_major_minor(text).as_deref(), want, "{text}");
        }
    }
}
