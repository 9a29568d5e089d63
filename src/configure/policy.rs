//! `--kubernetes`: nvhook's own config gets the device-selection policy a Kubernetes node
//! needs. A pod may then use only the GPUs the device plugin allocated to it: its image's
//! (or its spec's) `NVIDIA_VISIBLE_DEVICES` is ignored unless it is privileged, and the
//! plugin's `/var/run/nvidia-container-devices/<id>` mounts select the GPUs.

use super::Invalid;
use super::toml as edit;
use crate::config::{Config, ConfigError};
use std::path::Path;

/// The keys `--kubernetes` sets, and their values.
pub const HARDENED: [(&str, bool); 2] = [
    ("accept-env-when-unprivileged", false),
    ("accept-volume-mount-devices", true),
];

/// What a config created by `--kubernetes` says about itself.
const NEW_FILE_HEADER: &str = "# nvhook configuration; every key and its default: nvhook's config/config.toml.\n\
# Kubernetes node (nvhook configure --kubernetes): a pod gets only the GPUs the device\n\
# plugin allocated to it, as /var/run/nvidia-container-devices/<id> mounts.\n";

/// The nvhook config `current` (`None`: no file yet) with the hardened policy set, every
/// other byte kept. A file nvhook itself would refuse is refused here too, untouched.
pub(super) fn harden(current: Option<&str>, file: &Path) -> Result<String, Invalid> {
    if let Some(text) = current {
        Config::parse(text, file).map_err(|e| match e {
            ConfigError::Parse { message, .. } => Invalid(message),
            other => Invalid(other.to_string()),
        })?;
    }
    let mut doc = edit::parse(current)?;
    for (key, value) in HARDENED {
        edit::set_bool(doc.as_table_mut(), key, value);
    }
    let text = doc.to_string();
    Ok(match current {
        Some(_) => text,
        None => format!("{NEW_FILE_HEADER}{text}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn harden_text(current: Option<&str>) -> Result<String, String> {
        harden(current, Path::new("/etc/nvhook/config.toml")).map_err(|Invalid(m)| m)
    }

    fn parsed(text: &str) -> Config {
        Config::parse(text, Path::new("config.toml")).unwrap()
    }

    #[test]
    fn a_new_file_holds_the_policy_and_says_why() {
        let text = harden_text(None).unwrap();
        assert!(text.starts_with("# nvhook configuration"), "{text}");
        let config = parsed(&text);
        assert!(!config.accept_env_when_unprivileged);
        assert!(config.accept_volume_mount_devices);
        assert_eq!(
            Config {
                accept_env_when_unprivileged: true,
                ..config
            },
            Config::default(),
            "nothing but the policy differs from the defaults"
        );
    }

    #[test]
    fn the_documented_file_keeps_its_comments_and_changes_one_value() {
        let documented = include_str!("../../config/config.toml");
        let text = harden_text(Some(documented)).unwrap();
        let changed: Vec<_> = similar::TextDiff::from_lines(documented, &text)
            .iter_all_changes()
            .filter(|c| c.tag() != similar::ChangeTag::Equal)
            .map(|c| format!("{}{}", c.tag(), c.value()))
            .collect();
        assert_eq!(
            changed,
            [
                "-accept-env-when-unprivileged = true\n",
                "+accept-env-when-unprivileged = false\n"
            ]
        );
    }

    #[test]
    fn a_hardened_file_is_left_byte_for_byte() {
        let once = harden_text(Some("driver-root = \"/run/nvidia/driver\"\n")).unwrap();
        assert_eq!(harden_text(Some(&once)).unwrap(), once);
        assert_eq!(parsed(&once).driver_root, Path::new("/run/nvidia/driver"));
    }

    #[test]
    fn a_volume_mount_switch_turned_off_is_turned_on() {
        let text = harden_text(Some("accept-volume-mount-devices = false # old\n")).unwrap();
        assert_eq!(
            text,
            "accept-volume-mount-devices = true # old\naccept-env-when-unprivileged = false\n"
        );
    }

    #[test]
    fn a_file_nvhook_would_refuse_is_refused_in_one_line() {
        for (text, expected) in [
            ("accept-env-when-unprivileged = \"no\"\n", "line 1"),
            ("bogus = 1\n", "bogus"),
            ("driver-root = \n", "line 1"),
        ] {
            let message = harden_text(Some(text)).unwrap_err();
            assert!(message.contains(expected), "{text:?}: {message}");
            assert!(!message.contains('\n'), "{message}");
        }
    }
}
