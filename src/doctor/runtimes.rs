//! The low-level runtimes' container-escape fixes, and what a runtime's `--version` says.
//!
//! nvhook's promise that an image cannot change the host holds only while the runtime that
//! starts the container keeps it too: a runc without the fix for CVE-2026-41579 (Debian 12's
//! 1.1.5, say) follows an image's absolute `/dev` link and writes its `/dev/fd`, `/dev/stdin`,
//! ... links into that host directory, with or without nvhook. So doctor names each
//! runtime's version and the fixes it lacks.

pub use crate::version::Version;

/// What the first line of a runtime's `--version` says, and its `commit:` line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reported<'a> {
    /// The program's own name for itself (`runc`, `crun`, `youki`, `runsc`, ...).
    pub name: &'a str,
    /// The version word as printed (`1.1.5+ds1`).
    pub printed: &'a str,
    /// A distribution's package version for Debian's runc, a git hash for most others.
    pub commit: Option<&'a str>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum VersionError {
    #[error("it printed nothing")]
    Empty,
    #[error("its first line {0:?} is not \"NAME version VERSION\"")]
    Unrecognised(String),
}

/// Reads `runc --version` (`runc version 1.1.5+ds1`), `crun --version` (`crun version
/// 1.8.1`) and `youki --version` (`youki version 0.5.5`, or from 0.5.6 `youki version:
/// 0.5.7`).
pub fn parse_output(text: &str) -> Result<Reported<'_>, VersionError> {
    let first = text
        .lines()
        .find(|l| !l.trim().is_empty())
        .ok_or(VersionError::Empty)?;
    let mut words = first.split_whitespace();
    let (Some(name), Some("version" | "version:"), Some(printed)) =
        (words.next(), words.next(), words.next())
    else {
        return Err(VersionError::Unrecognised(first.trim().to_string()));
    };
    let commit = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("commit:"))
        .map(str::trim)
        .filter(|c| !c.is_empty());
    Ok(Reported {
        name,
        printed,
        commit,
    })
}

/// An upstream fix of a container escape, or of a write to the host's files that a container
/// or its image can cause.
#[derive(Debug)]
pub struct Fix {
    pub runtime: &'static str,
    /// The CVEs; the same flaw in another runtime keeps the CVE of the one it was found in.
    pub ids: &'static [&'static str],
    /// The first release of each branch that has the fix, oldest first. A branch older than
    /// the newest one named here that is not named never got the fix.
    pub fixed_in: &'static [&'static str],
}

/// The runtimes [`FIXES`] knows.
pub const RUNTIMES: [&str; 3] = ["runc", "crun", "youki"];

/// Each row's source is the runtime's own changelog, release tag or advisory (SECURITY.md,
/// "The runtime underneath", lists them).
pub const FIXES: &[Fix] = &[
    // runc commit 0a8e4117 ("Fixes: CVE-2019-5736"), first tagged in v1.0.0-rc7.
    Fix {
        runtime: "runc",
        ids: &["CVE-2019-5736"],
        fixed_in: &["1.0.0-rc7"],
    },
    // runc 1.0.0-rc95's release notes; GHSA-c3xm-pvg7-gh7r.
    Fix {
        runtime: "runc",
        ids: &["CVE-2021-30465"],
        fixed_in: &["1.0.0-rc95"],
    },
    // runc CHANGELOG.md, 1.1.12.
    Fix {
        runtime: "runc",
        ids: &["CVE-2024-21626"],
        fixed_in: &["1.1.12"],
    },
    // runc CHANGELOG.md, 1.1.14 and 1.2.0-rc.3: empty files and directories on the host.
    Fix {
        runtime: "runc",
        ids: &["CVE-2024-45310"],
        fixed_in: &["1.1.14", "1.2.0-rc.3"],
    },
    // runc CHANGELOG.md, 1.2.8, 1.3.3 and 1.4.0-rc.3; 1.1 got no release with them.
    Fix {
        runtime: "runc",
        ids: &["CVE-2025-31133", "CVE-2025-52565", "CVE-2025-52881"],
        fixed_in: &["1.2.8", "1.3.3", "1.4.0-rc.3"],
    },
    // runc CHANGELOG.md, 1.3.6, 1.4.3 and 1.5.0-rc.3: an image's `/dev` link made runc write
    // its /dev links into a host directory (issue 27 §4); 1.2 got no release with it.
    Fix {
        runtime: "runc",
        ids: &["CVE-2026-41579"],
        fixed_in: &["1.3.6", "1.4.3", "1.5.0-rc.3"],
    },
    // crun commit ce4dfbb9 ("linux: fix CVE-2019-5736"), first tagged in v0.3.
    Fix {
        runtime: "crun",
        ids: &["CVE-2019-5736"],
        fixed_in: &["0.3"],
    },
    // crun NEWS, 0.10.5.
    Fix {
        runtime: "crun",
        ids: &["CVE-2019-18837"],
        fixed_in: &["0.10.5"],
    },
    // crun NEWS, 1.20: the krun handler could write .krun_config.json outside the rootfs.
    Fix {
        runtime: "crun",
        ids: &["CVE-2025-24965"],
        fixed_in: &["1.20"],
    },
    // crun NEWS, 1.28: rootfs `/dev` links redirected device setup out of the rootfs.
    Fix {
        runtime: "crun",
        ids: &["CVE-2026-47766"],
        fixed_in: &["1.28"],
    },
    // youki CHANGELOG.md, v0.3.2: "Address GHSA-xr7r-f8xq-vfvv" (#2663), runc's advisory
    // for CVE-2024-21626, whose leaked descriptors and working directory youki had too.
    Fix {
        runtime: "youki",
        ids: &["CVE-2024-21626"],
        fixed_in: &["0.3.2"],
    },
    // Published with youki v0.5.7 (merge 5886c910): masked paths, procfs write redirects.
    Fix {
        runtime: "youki",
        ids: &["CVE-2025-62161", "CVE-2025-62596"],
        fixed_in: &["0.5.7"],
    },
    // youki #3333, "use mount_from_fd for /dev/console to fix CVE-2025-52565", first in
    // v0.6.0: youki's /dev/console had runc's flaw and took runc's CVE.
    Fix {
        runtime: "youki",
        ids: &["CVE-2025-52565"],
        fixed_in: &["0.6.0"],
    },
];

impl Fix {
    fn fixed_versions(&self) -> impl Iterator<Item = Version> + '_ {
        self.fixed_in.iter().map(|s| parse_fixed(s))
    }

    /// Whether `version` is a release without this fix.
    pub fn lacked_by(&self, version: &Version) -> bool {
        match self
            .fixed_versions()
            .find(|f| f.branch() == version.branch())
        {
            Some(first) => *version < first,
            None => self
                .fixed_versions()
                .max()
                .is_some_and(|newest| *version < newest),
        }
    }
}

fn parse_fixed(s: &str) -> Version {
    Version::parse(s)
        .expect("every version in FIXES parses (unit-tested)")
        .0
}

/// The fixes `runtime` at `version` lacks, in the table's order.
pub fn lacking(runtime: &str, version: &Version) -> Vec<&'static Fix> {
    FIXES
        .iter()
        .filter(|f| f.runtime == runtime && f.lacked_by(version))
        .collect()
}

/// What a runtime release lacks, and the first later release that lacks none of it.
#[derive(Debug)]
pub struct Upgrade {
    pub lacking: Vec<&'static Fix>,
    /// As the table writes it.
    pub to: &'static str,
}

/// None when `runtime` at `version` lacks no fix in the table.
pub fn upgrade(runtime: &str, version: &Version) -> Option<Upgrade> {
    let missing = lacking(runtime, version);
    if missing.is_empty() {
        return None;
    }
    let mut later: Vec<(Version, &'static str)> = FIXES
        .iter()
        .filter(|f| f.runtime == runtime)
        .flat_map(|f| f.fixed_in.iter().map(|s| (parse_fixed(s), *s)))
        .filter(|(v, _)| v > version)
        .collect();
    later.sort();
    // The newest release the table names lacks nothing, and a release that lacks a fix is
    // older than it: one is always found.
    let (_, to) = later
        .into_iter()
        .find(|(v, _)| lacking(runtime, v).is_empty())?;
    Some(Upgrade {
        lacking: missing,
        to,
    })
}

/// Runtimes' `--version` outputs (tests/golden/runtimes), for the tests here and in `checks`.
#[cfg(test)]
pub mod recorded {
    /// Recorded on Debian 12 (packages runc 1.1.5+ds1-1+deb12u1, crun 1.8.1-1+deb12u1).
    pub const RUNC_DEBIAN_12: &str =
        include_str!("../../tests/golden/runtimes/runc-1.1.5-debian-12.txt");
    pub const CRUN_DEBIAN_12: &str =
        include_str!("../../tests/golden/runtimes/crun-1.8.1-debian-12.txt");
    /// As youki's documentation records them (docs/src/youki.md), beside a crun built from git.
    pub const YOUKI_0_0_1: &str = include_str!("../../tests/golden/runtimes/youki-0.0.1.txt");
    pub const RUNC_RC93: &str = include_str!("../../tests/golden/runtimes/runc-1.0.0-rc93.txt");
    pub const CRUN_FROM_GIT: &str =
        include_str!("../../tests/golden/runtimes/crun-0.19.1.45-git.txt");
    /// youki 0.5.6 and later print `youki version: X` first, then `commit: X-SHA` and more
    /// (print_youki in crates/youki/src/commands/info.rs; v0.7.0 is commit 94ba653e).
    pub const YOUKI_0_7_0: &str = include_str!("../../tests/golden/runtimes/youki-0.7.0.txt");
    /// runc's first two lines as its release build writes them (`git describe` of tag
    /// v1.3.6, commit 491b69ba), and its vendored runtime-spec's version.
    pub const RUNC_1_3_6: &str = include_str!("../../tests/golden/runtimes/runc-1.3.6.txt");
}

#[cfg(test)]
mod tests {
    use super::recorded::*;
    use super::*;
    use crate::version::Release;

    fn v(s: &str) -> Version {
        Version::parse(s).unwrap().0
    }

    #[test]
    fn the_runtimes_own_outputs_parse() {
        let cases = [
            (
                RUNC_DEBIAN_12,
                "runc",
                "1.1.5+ds1",
                Some("1.1.5+ds1-1+deb12u1"),
            ),
            (
                CRUN_DEBIAN_12,
                "crun",
                "1.8.1",
                Some("f8a096be060b22ccd3d5f3ebe44108517fbf6c30"),
            ),
            (YOUKI_0_0_1, "youki", "0.0.1", Some("0.0.1-0-0be33bf")),
            (
                YOUKI_0_7_0,
                "youki",
                "0.7.0",
                Some("0.7.0-94ba653efbb180ce04650f6ae01a8e6bc8f96d92"),
            ),
            (
                RUNC_RC93,
                "runc",
                "1.0.0-rc93",
                Some("12644e614e25b05da6fd08a38ffa0cfe1903fdec"),
            ),
            (
                CRUN_FROM_GIT,
                "crun",
                "0.19.1.45-4cc7",
                Some("4cc7fa1124cce75dc26e12186d9cbeabded2b710"),
            ),
        ];
        for (text, name, printed, commit) in cases {
            let got = parse_output(text).unwrap();
            assert_eq!(
                got,
                Reported {
                    name,
                    printed,
                    commit
                },
                "{text}"
            );
        }
        assert_eq!(parse_output("\n \n"), Err(VersionError::Empty));
        assert_eq!(
            parse_output("Usage: thing [OPTIONS]\n"),
            Err(VersionError::Unrecognised("Usage: thing [OPTIONS]".into()))
        );
    }

    #[test]
    fn versions_keep_only_the_upstream_part() {
        for (token, upstream) in [
            ("1.1.5+ds1", "1.1.5"),
            ("1.1.12-0ubuntu2~22.04.1", "1.1.12"),
            ("1.0.0-rc6+dev", "1.0.0-rc6"),
            ("1.4.0-rc.3", "1.4.0-rc.3"),
            ("v1.3.3", "v1.3.3"),
            ("1.28", "1.28"),
            ("0.19.1.45-4cc7", "0.19.1.45"),
        ] {
            let (_, len) = Version::parse(token).unwrap();
            assert_eq!(&token[..len], upstream, "{token}");
        }
        for not_one in ["release-20240513.0", "12", "", "1..2", "dev"] {
            assert_eq!(Version::parse(not_one), None, "{not_one}");
        }
    }

    #[test]
    fn candidates_come_before_their_release_and_numbers_compare_as_numbers() {
        let ordered = [
            "0.10.4",
            "0.10.5",
            "1.0.0-rc6",
            "1.0.0-rc7",
            "1.0.0-rc95",
            "1.0.0",
            "1.1.5",
            "1.1.12",
            "1.2.0-rc.1",
            "1.2.0-rc.3",
            "1.2.0",
            "1.9",
            "1.20",
        ];
        for pair in ordered.windows(2) {
            assert!(v(pair[0]) < v(pair[1]), "{} < {}", pair[0], pair[1]);
        }
        assert_eq!(v("1.20"), v("1.20.0"));
        assert_eq!(v("1.1.5+ds1"), v("1.1.5"));
    }

    #[test]
    fn every_row_parses_and_lists_its_branches_in_order() {
        for fix in FIXES {
            assert!(RUNTIMES.contains(&fix.runtime), "{fix:?}");
            assert!(!fix.ids.is_empty() && !fix.fixed_in.is_empty(), "{fix:?}");
            let versions: Vec<Version> = fix
                .fixed_in
                .iter()
                .map(|s| Version::parse(s).unwrap_or_else(|| panic!("{s}")).0)
                .collect();
            assert!(versions.windows(2).all(|w| w[0] < w[1]), "{fix:?}");
            let branches: Vec<[u64; 2]> = versions.iter().map(Version::branch).collect();
            assert!(branches.windows(2).all(|w| w[0] != w[1]), "{fix:?}");
        }
    }

    fn ids(runtime: &str, version: &str) -> Vec<&'static str> {
        lacking(runtime, &v(version))
            .iter()
            .flat_map(|f| f.ids.iter().copied())
            .collect()
    }

    #[test]
    fn a_release_lacks_a_fix_its_branch_got_later_or_never() {
        // Debian 12's, as upstream numbers it.
        assert_eq!(
            ids("runc", "1.1.5"),
            [
                "CVE-2024-21626",
                "CVE-2024-45310",
                "CVE-2025-31133",
                "CVE-2025-52565",
                "CVE-2025-52881",
                "CVE-2026-41579"
            ]
        );
        assert_eq!(
            ids("runc", "1.1.14"),
            [
                "CVE-2025-31133",
                "CVE-2025-52565",
                "CVE-2025-52881",
                "CVE-2026-41579"
            ]
        );
        // 1.2 never got the /dev link fix; 1.3 got both in its own releases.
        assert_eq!(ids("runc", "1.2.9"), ["CVE-2026-41579"]);
        assert_eq!(
            ids("runc", "1.3.2"),
            [
                "CVE-2025-31133",
                "CVE-2025-52565",
                "CVE-2025-52881",
                "CVE-2026-41579"
            ]
        );
        assert_eq!(ids("runc", "1.3.5"), ["CVE-2026-41579"]);
        assert!(ids("runc", "1.3.6").is_empty());
        assert_eq!(ids("runc", "1.4.0-rc.2").len(), 4);
        assert_eq!(ids("runc", "1.4.2"), ["CVE-2026-41579"]);
        assert!(ids("runc", "1.4.3").is_empty());
        assert!(ids("runc", "1.5.0-rc.3").is_empty());
        assert!(ids("runc", "1.6.0").is_empty());
        // The oldest: before the fixes of 2019 and 2021.
        assert_eq!(
            ids("runc", "1.0.0-rc6")[..2],
            ["CVE-2019-5736", "CVE-2021-30465"]
        );
        assert_eq!(ids("runc", "1.0.0-rc93")[0], "CVE-2021-30465");

        assert_eq!(ids("crun", "1.8.1"), ["CVE-2025-24965", "CVE-2026-47766"]);
        assert_eq!(
            ids("crun", "0.10.4")[..2],
            ["CVE-2019-18837", "CVE-2025-24965"]
        );
        assert!(ids("crun", "1.28").is_empty());
        assert!(ids("crun", "1.29.1").is_empty());

        assert_eq!(
            ids("youki", "0.5.6"),
            ["CVE-2025-62161", "CVE-2025-62596", "CVE-2025-52565"]
        );
        assert_eq!(ids("youki", "0.5.7"), ["CVE-2025-52565"]);
        assert!(ids("youki", "0.7.0").is_empty());
        assert!(ids("runsc", "1.0.0").is_empty());
    }

    #[test]
    fn the_upgrade_is_the_first_release_with_every_fix() {
        let to = |runtime, version| upgrade(runtime, &v(version)).map(|u| u.to);
        assert_eq!(to("runc", "1.1.5"), Some("1.3.6"));
        assert_eq!(to("runc", "1.2.8"), Some("1.3.6"));
        assert_eq!(to("runc", "1.4.0"), Some("1.4.3"));
        assert_eq!(to("runc", "1.5.0-rc.1"), Some("1.5.0-rc.3"));
        assert_eq!(to("runc", "1.3.6"), None);
        assert_eq!(to("crun", "1.8.1"), Some("1.28"));
        assert_eq!(to("youki", "0.5.5"), Some("0.6.0"));
        // Every release before the newest fix of each runtime gets an upgrade.
        for fix in FIXES {
            for fixed in fix.fixed_in {
                let (version, _) = Version::parse(fixed).unwrap();
                let before = Version {
                    release: Release::Candidate(0),
                    ..version
                };
                let lacks = !lacking(fix.runtime, &before).is_empty();
                assert_eq!(upgrade(fix.runtime, &before).is_some(), lacks, "{fixed}");
            }
        }
    }
}
