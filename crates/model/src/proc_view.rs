//! Which GPU containers get nvhook's `/proc/driver/nvidia` view (`proc-driver-view`).
//!
//! The view is a tmpfs mounted over a directory of the container's procfs. The kernel lets a
//! process in a new user namespace mount a procfs only while some procfs it can see is whole:
//! no mount covers any of its non-empty directories ("too revealing", `mnt_already_visible`).
//! A container whose runtime masks paths under `/proc` (the default: `/proc/kcore`,
//! `/proc/sys`, ...) has no such procfs anyway, and the view costs nested sandboxes nothing;
//! one whose spec masks nothing there (Kubernetes `procMount: Unmasked`, Docker
//! `systempaths=unconfined`, Podman `unmask=ALL`, privileged containers) asked for the whole
//! procfs, and the view would be the one mount that breaks `unshare --mount-proc`, bubblewrap
//! and Slurm's containers inside it.

use crate::config::ProcDriverView;
use crate::oci::Spec;

/// Whether the container gets the view, and why not when it does not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Choice {
    View,
    HostsOwn(&'static str),
}

/// The choice for a container whose spec is `spec`; `None` where no spec is at hand
/// (nvidia-container-cli's `configure`), which gets the view unless the config says `never`.
pub fn choose(mode: ProcDriverView, spec: Option<&Spec>) -> Choice {
    match mode {
        ProcDriverView::Always => Choice::View,
        ProcDriverView::Never => Choice::HostsOwn("proc-driver-view = \"never\""),
        ProcDriverView::Auto if spec.is_some_and(Spec::proc_unmasked) => Choice::HostsOwn(
            "the container's /proc is unmasked (nested procfs mounts need it whole; proc-driver-view = \"auto\")",
        ),
        ProcDriverView::Auto => Choice::View,
    }
}

impl Choice {
    /// Whether the view is made; logs why not.
    pub fn view(self) -> bool {
        match self {
            Choice::View => true,
            Choice::HostsOwn(why) => {
                tracing::info!("/proc/driver/nvidia left as the host's: {why}");
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn spec(linux: &str) -> Spec {
        let text = format!(r#"{{"process": {{"env": []}}{linux}}}"#);
        Spec::parse(&text, Path::new("config.json")).unwrap()
    }

    const RUNC_DEFAULT: &str = r#", "linux": {"maskedPaths": ["/proc/acpi", "/proc/kcore", "/sys/firmware"],
        "readonlyPaths": ["/proc/bus", "/proc/sys"]}"#;

    #[test]
    fn a_masked_proc_keeps_the_view() {
        assert_eq!(
            choose(ProcDriverView::Auto, Some(&spec(RUNC_DEFAULT))),
            Choice::View
        );
        // Read-only paths alone lock procfs too.
        let ro = r#", "linux": {"maskedPaths": [], "readonlyPaths": ["/proc/sys"]}"#;
        assert_eq!(choose(ProcDriverView::Auto, Some(&spec(ro))), Choice::View);
    }

    #[test]
    fn an_unmasked_proc_keeps_the_hosts_directory() {
        for linux in [
            r#", "linux": {"maskedPaths": [], "readonlyPaths": []}"#,
            // Masking outside /proc leaves procfs whole.
            r#", "linux": {"maskedPaths": ["/sys/firmware", "/procfoo"]}"#,
            r#", "linux": {}"#,
            "",
        ] {
            assert!(
                matches!(
                    choose(ProcDriverView::Auto, Some(&spec(linux))),
                    Choice::HostsOwn(_)
                ),
                "{linux}"
            );
        }
    }

    #[test]
    fn the_config_overrides_the_spec() {
        let unmasked = spec(r#", "linux": {"maskedPaths": []}"#);
        let masked = spec(RUNC_DEFAULT);
        for s in [&unmasked, &masked] {
            assert_eq!(choose(ProcDriverView::Always, Some(s)), Choice::View);
            assert!(!choose(ProcDriverView::Never, Some(s)).view());
        }
        assert_eq!(choose(ProcDriverView::Auto, None), Choice::View);
        assert!(!choose(ProcDriverView::Never, None).view());
    }
}
