//! Versions as NVIDIA's toolkit reads them (Masterminds semver, coercing): an optional `v`,
//! one to three numbers (leading zeros allowed, missing ones 0), and an optional `-pre` or
//! `+build` suffix, which orders nothing here. The one reading of `CUDA_VERSION`, of a compat
//! library's version and of the versions in NVIDIA's hook flags. And [`Version`], a release
//! number as programs print theirs (runc, crun, youki, containerd: `1.6.20~ds1`, `v1.7.24`).

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

/// A release number as runc, crun and youki write theirs: two to four numbers, then an
/// optional release candidate (`1.0.0-rc95`, `1.4.0-rc.3`). Numbers past the fourth (none of
/// the three has them) are not compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version {
    pub numbers: [u64; 4],
    pub release: Release,
}

/// A release candidate comes before its release: the variants' order is the versions'.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Release {
    Candidate(u64),
    Final,
}

impl Version {
    /// The version at the start of `token` (a leading `v` allowed), and how many bytes of
    /// `token` it took: what follows (`+ds1`, `-0ubuntu2~22.04.1`) is a distribution's build.
    pub fn parse(token: &str) -> Option<(Version, usize)> {
        let skip = usize::from(token.starts_with('v'));
        let token = &token[skip..];
        let numeric = token
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .map_or(token, |end| &token[..end])
            .trim_end_matches('.');
        let mut numbers = [0; 4];
        let mut count = 0;
        for part in numeric.split('.') {
            let n = part.parse().ok()?;
            if let Some(slot) = numbers.get_mut(count) {
                *slot = n;
            }
            count += 1;
        }
        if count < 2 {
            return None;
        }
        let (release, candidate_len) = match candidate(&token[numeric.len()..]) {
            Some((n, len)) => (Release::Candidate(n), len),
            None => (Release::Final, 0),
        };
        let version = Version { numbers, release };
        Some((version, skip + numeric.len() + candidate_len))
    }

    /// `[major, minor]`.
    pub fn branch(&self) -> [u64; 2] {
        [self.numbers[0], self.numbers[1]]
    }
}

/// `-rc95` or `-rc.3` at the start of `rest`: the candidate's number and the bytes it takes.
fn candidate(rest: &str) -> Option<(u64, usize)> {
    let after = rest.strip_prefix("-rc")?;
    let dot = usize::from(after.starts_with('.'));
    let digits = &after[dot..];
    let len = digits
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(digits.len());
    Some((digits[..len].parse().ok()?, "-rc".len() + dot + len))
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
