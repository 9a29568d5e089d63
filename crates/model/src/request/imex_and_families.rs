//! IMEX channels (`NVIDIA_IMEX_CHANNELS`, mounts under
//! `/var/run/nvidia-container-devices/imex/`) and the opt-in device families
//! (`NVIDIA_NVSWITCH`, `NVIDIA_GDS`, `NVIDIA_MOFED`, `NVIDIA_GDRCOPY`).
//!
//! Both come with a GPU request only, as in nvidia-container-toolkit. Where the toolkit
//! ignores a value it cannot read, nvhook refuses it: an image that misspells a channel list
//! or writes `NVIDIA_GDS=true` learns so at once instead of running without its devices.

use crate::config::Config;
use crate::imex_and_families::Family;
use crate::oci::Spec;
use crate::shown::Shown;
use std::collections::BTreeSet;
use std::fmt;

pub const IMEX_CHANNELS: &str = "NVIDIA_IMEX_CHANNELS";
/// The device plugin's IMEX mounts: `/var/run/nvidia-container-devices/imex/<channel>`.
pub const IMEX_MOUNT_PREFIX: &str = "imex/";

/// The IMEX channels a container asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImexChannels {
    /// Every channel the host has.
    All,
    /// These channel numbers, ascending, without duplicates.
    List(Vec<u32>),
}

impl fmt::Display for ImexChannels {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ImexChannels::All => f.write_str("all"),
            ImexChannels::List(list) => f.write_str(&channel_ranges(list)),
        }
    }
}

/// Ascending channel numbers as runs, `0-3,7,9,10` (a run of two reads better as a pair): a
/// node's thousand channels make one short item, not four thousand characters.
pub fn channel_ranges(ascending: &[u32]) -> String {
    let mut runs: Vec<(u32, u32)> = Vec::new();
    for &n in ascending {
        match runs.last_mut() {
            Some((_, last)) if last.checked_add(1) == Some(n) => *last = n,
            _ => runs.push((n, n)),
        }
    }
    let shown: Vec<String> = runs
        .into_iter()
        .map(|(first, last)| match last - first {
            0 => first.to_string(),
            1 => format!("{first},{last}"),
            _ => format!("{first}-{last}"),
        })
        .collect();
    shown.join(",")
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ImexFamilyError {
    #[error(
        "{origin}: \"{item}\" is not an IMEX channel number (use channel numbers separated by commas, such as 0,1, or all)"
    )]
    BadChannel { origin: String, item: Shown },
    #[error(
        "{origin}: all cannot be combined with channel numbers (ask for all alone, or for channel numbers only, such as 0,1)"
    )]
    AllAmongNumbers { origin: String },
    #[error(
        "{variable}={value}: use enabled or disabled (or leave it unset for the node's default)"
    )]
    BadFamilyValue {
        variable: &'static str,
        value: Shown,
    },
}

/// The channels `value` names, a list read as every NVIDIA_* list is
/// ([`super::list_items`]): `None` for no channel (no item, or `none` or `void` among them),
/// `all`, or decimal channel numbers. A sign, or `all` among numbers, is a mistake, refused.
pub(super) fn parse_channels(
    value: &str,
    origin: &str,
) -> Result<Option<ImexChannels>, ImexFamilyError> {
    let items = super::list_items(value.split(','));
    if items.is_empty() || items.iter().any(|i| matches!(*i, "none" | "void")) {
        return Ok(None);
    }
    if items == ["all"] {
        return Ok(Some(ImexChannels::All));
    }
    if items.contains(&"all") {
        return Err(ImexFamilyError::AllAmongNumbers {
            origin: origin.to_string(),
        });
    }
    let mut channels = BTreeSet::new();
    for item in items {
        channels.insert(
            channel_number(item).ok_or_else(|| ImexFamilyError::BadChannel {
                origin: origin.to_string(),
                item: item.into(),
            })?,
        );
    }
    Ok(Some(ImexChannels::List(channels.into_iter().collect())))
}

fn channel_number(item: &str) -> Option<u32> {
    if item.is_empty() || !item.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    item.parse().ok()
}

/// The channels a container asked for, under the same rule as its GPUs: the device plugin's
/// mounts when accepted and present, else the variable where the environment is trusted.
pub fn imex_channels(
    spec: &Spec,
    config: &Config,
    env_trusted: bool,
    mount_ids: &[String],
) -> Result<Option<ImexChannels>, ImexFamilyError> {
    if config.accept_volume_mount_devices {
        let channels: Vec<&str> = mount_ids
            .iter()
            .filter_map(|id| id.strip_prefix(IMEX_MOUNT_PREFIX))
            .collect();
        if !channels.is_empty() {
            let origin = format!(
                "volume mount {}/{IMEX_MOUNT_PREFIX}",
                super::DEVICE_MOUNT_ROOT
            );
            return parse_channels(&channels.join(","), &origin);
        }
    }
    let Some(value) = spec.env(IMEX_CHANNELS).filter(|v| !v.trim().is_empty()) else {
        return Ok(None);
    };
    if !env_trusted {
        tracing::warn!(
            value = %Shown(value),
            "NVIDIA_IMEX_CHANNELS ignored: the container is unprivileged and accept-env-when-unprivileged = false"
        );
        return Ok(None);
    }
    parse_channels(value, &super::env_origin(IMEX_CHANNELS, value))
}

/// Whether a family variable's value asks for the family: `enabled` or `disabled` (any
/// case); unset or empty leaves it to the config.
pub fn family_value(family: Family, value: Option<&str>) -> Result<Option<bool>, ImexFamilyError> {
    let Some(value) = value.map(str::trim).filter(|v| !v.is_empty()) else {
        return Ok(None);
    };
    if value.eq_ignore_ascii_case("enabled") {
        Ok(Some(true))
    } else if value.eq_ignore_ascii_case("disabled") {
        Ok(Some(false))
    } else {
        Err(ImexFamilyError::BadFamilyValue {
            variable: family.variable(),
            value: value.into(),
        })
    }
}

/// The families a GPU container gets: each by its variable where the environment is
/// trusted, else by the config's default.
pub fn families(
    spec: &Spec,
    config: &Config,
    env_trusted: bool,
) -> Result<BTreeSet<Family>, ImexFamilyError> {
    let mut out = BTreeSet::new();
    for family in Family::ALL {
        let value = spec.env(family.variable());
        let asked = if env_trusted {
            family_value(family, value)?
        } else {
            if value.is_some_and(|v| !v.trim().is_empty()) {
                tracing::warn!(
                    variable = family.variable(),
                    "ignored: the container is unprivileged and accept-env-when-unprivileged = false (the node's default applies)"
                );
            }
            None
        };
        if asked.unwrap_or_else(|| config.family_default(family)) {
            out.insert(family);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channel_lists() {
        let parse = |v: &str| parse_channels(v, "X");
        assert_eq!(parse(""), Ok(None));
        assert_eq!(parse(" none "), Ok(None));
        assert_eq!(parse("void"), Ok(None));
        assert_eq!(parse("all"), Ok(Some(ImexChannels::All)));
        assert_eq!(parse("1"), Ok(Some(ImexChannels::List(vec![1]))));
        assert_eq!(parse("3, 1,3"), Ok(Some(ImexChannels::List(vec![1, 3]))));
        assert_eq!(parse("1,,2"), Ok(Some(ImexChannels::List(vec![1, 2]))));
        assert_eq!(parse("1,"), Ok(Some(ImexChannels::List(vec![1]))));
        assert_eq!(parse(" , "), Ok(None));
        assert_eq!(parse("1,void"), Ok(None));
        assert_eq!(parse("all,all"), Ok(Some(ImexChannels::All)));
        for (bad, item) in [
            ("abc", "abc"),
            ("-1", "-1"),
            ("+1", "+1"),
            ("0x1", "0x1"),
            ("4294967296", "4294967296"),
        ] {
            assert_eq!(
                parse(bad),
                Err(ImexFamilyError::BadChannel {
                    origin: "X".into(),
                    item: item.into()
                }),
                "{bad}"
            );
        }
        let msg = parse("1,x").unwrap_err().to_string();
        assert!(
            msg.starts_with("X: \"x\" is not an IMEX channel number"),
            "{msg}"
        );
        assert!(!msg.contains('\n'));
    }

    #[test]
    fn all_among_other_items_is_named_as_the_mistake() {
        for value in ["all,../x", "1,all", " all , 2"] {
            let e = parse_channels(value, "NVIDIA_IMEX_CHANNELS=v").unwrap_err();
            assert_eq!(
                e.to_string(),
                "NVIDIA_IMEX_CHANNELS=v: all cannot be combined with channel numbers (ask for all alone, or for channel numbers only, such as 0,1)",
                "{value}"
            );
        }
    }

    #[test]
    fn channel_ranges_are_runs_in_order() {
        for (numbers, want) in [
            (&[][..], ""),
            (&[5], "5"),
            (&[0, 2], "0,2"),
            (&[0, 1], "0,1"),
            (&[0, 1, 2], "0-2"),
            (&[0, 1, 2, 3, 7, 9, 10, 11, 12], "0-3,7,9-12"),
            (
                &[u32::MAX - 2, u32::MAX - 1, u32::MAX],
                "4294967293-4294967295",
            ),
        ] {
            assert_eq!(channel_ranges(numbers), want, "{numbers:?}");
        }
        let thousand: Vec<u32> = (0..1000).collect();
        assert_eq!(channel_ranges(&thousand), "0-999");
    }

    #[test]
    fn family_values() {
        for (v, want) in [
            (None, None),
            (Some(""), None),
            (Some("enabled"), Some(true)),
            (Some("Enabled"), Some(true)),
            (Some(" DISABLED"), Some(false)),
        ] {
            assert_eq!(family_value(Family::Gds, v), Ok(want), "{v:?}");
        }
        for v in ["true", "1", "yes", "enable", "enabled,disabled"] {
            let e = family_value(Family::Gds, Some(v)).unwrap_err().to_string();
            assert_eq!(
                e,
                format!(
                    "NVIDIA_GDS={v}: use enabled or disabled (or leave it unset for the node's default)"
                )
            );
        }
    }

    #[test]
    fn display_gives_the_list_as_ranges() {
        assert_eq!(ImexChannels::List(vec![0, 2]).to_string(), "0,2");
        assert_eq!(ImexChannels::List(vec![0, 1, 2, 5]).to_string(), "0-2,5");
        assert_eq!(ImexChannels::All.to_string(), "all");
    }
}
