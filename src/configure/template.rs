//! k3s and RKE2: their embedded containerd is configured from a Go template
//! (`config.toml.tmpl`, `config-v3.toml.tmpl` for containerd 2) that starts from k3s's own
//! base (`{{ template "base" . }}`) and may hold any other directive. It is not TOML and is
//! never parsed: nvhook's runtime is one block between two marker lines, appended, replaced
//! or taken out as text, and every other byte stays as it was (NVIDIA's TOML parser choking
//! on these templates left RKE2 nodes unable to start).

use super::{Change, Invalid};
use std::path::Path;

/// The template k3s and RKE2 document for additions to their base config.
pub(super) const BASE: &str = "{{ template \"base\" . }}\n";

const BEGIN: &str = "# BEGIN nvhook runtime";
const END: &str = "# END nvhook runtime";
/// On the BEGIN line when the template did not end with a line break and nvhook added one
/// before its block: `--remove` takes that out too.
const ADDED_BREAK: &str = "(after a line break nvhook added)";

/// The templates' names: for containerd 2 (config version 3), and for containerd 1.
pub(super) const V3_NAME: &str = "config-v3.toml.tmpl";
pub(super) const V2_NAME: &str = "config.toml.tmpl";

/// The template for the containerd whose rendered `config.toml` is `rendered`.
pub(super) fn name_for(rendered: &str) -> &'static str {
    let version = rendered
        .parse::<toml_edit::DocumentMut>()
        .ok()
        .and_then(|doc| doc.get("version")?.as_integer());
    match version {
        Some(v) if v >= 3 => V3_NAME,
        _ => V2_NAME,
    }
}

/// Which containerd config format a template renders, by the name k3s gives it.
fn is_containerd_2(template: &Path) -> bool {
    template
        .file_name()
        .is_some_and(|name| name.to_string_lossy().starts_with("config-v3"))
}

/// The change for the template at `file` holding `current` (`None`: not there yet, and
/// the base is where the new template starts). `None`: what is left is k3s's default.
pub(super) fn apply(
    file: &Path,
    current: Option<&str>,
    change: &Change,
) -> Result<Option<String>, Invalid> {
    let text = current.unwrap_or(BASE);
    let (before, after) = match block_span(text)? {
        Some((start, end)) => (&text[..start], &text[end..]),
        None => (text, ""),
    };
    let new = match *change {
        Change::Add {
            set_as_default: true,
            ..
        } => {
            return Err(Invalid(
                "k3s and RKE2 take the default runtime from their own flag \
                 (--default-runtime nvidia), not from the template: run without --set-as-default"
                    .into(),
            ));
        }
        Change::Add { name, path, .. } => {
            let added_break = !before.is_empty() && !before.ends_with('\n');
            format!(
                "{before}{}{}{after}",
                if added_break { "\n" } else { "" },
                block(name, path, is_containerd_2(file), added_break)
            )
        }
        Change::Remove { .. } => format!("{before}{after}"),
        Change::Nri { .. } => unreachable!("Engine::apply takes NRI changes"),
    };
    Ok((new != BASE).then_some(new))
}

/// Byte offsets of nvhook's block: from its first marker (or the line break nvhook added
/// before it) to the end of the last marker's line.
fn block_span(text: &str) -> Result<Option<(usize, usize)>, Invalid> {
    let line_at = |marker: &str| {
        text.match_indices(marker)
            .map(|(at, _)| at)
            .filter(|&at| at == 0 || text.as_bytes()[at - 1] == b'\n')
            .collect::<Vec<_>>()
    };
    match (line_at(BEGIN).as_slice(), line_at(END).as_slice()) {
        ([], []) => Ok(None),
        ([start], [end]) if start < end => {
            let end = text[*end..].find('\n').map_or(text.len(), |n| end + n + 1);
            let begin_line = text[*start..].lines().next().unwrap_or_default();
            let start = match begin_line.ends_with(ADDED_BREAK) && *start > 0 {
                true => start - 1,
                false => *start,
            };
            Ok(Some((start, end)))
        }
        _ => Err(Invalid(format!(
            "its `{BEGIN}` and `{END}` lines are not one pair: take nvhook's block out by hand"
        ))),
    }
}

/// The runtime in the TOML that containerd 1 (v2 config) or containerd 2 (v3) reads, with
/// the SystemdCgroup setting k3s gives its own runc runtime.
fn block(name: &str, path: &str, containerd_2: bool, added_break: bool) -> String {
    let runtimes = match containerd_2 {
        true => "plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes",
        false => "plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes",
    };
    let note = if added_break {
        format!(" {ADDED_BREAK}")
    } else {
        String::new()
    };
    format!(
        "{BEGIN} {name:?}: `nvhook configure --remove` takes it out{note}\n\
         [{runtimes}.'{name}']\n  runtime_type = \"io.containerd.runc.v2\"\n\
         [{runtimes}.'{name}'.options]\n  BinaryName = {path:?}\n  \
         SystemdCgroup = {{{{ .SystemdCgroup }}}}\n{END}\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::configure::test_changes::{ADD, REMOVE};

    /// A template with directives of every kind, and no final newline.
    const ADMIN: &str = "{{ template \"base\" . }}\n{{ if .NodeConfig.AgentConfig.Snapshotter }}\n[plugins.\"io.containerd.grpc.v1.cri\".containerd]\n  snapshotter = \"{{ .NodeConfig.AgentConfig.Snapshotter }}\"\n{{ end }}";

    fn v2(text: Option<&str>, change: &Change) -> Option<String> {
        apply(Path::new("/k3s/config.toml.tmpl"), text, change).unwrap()
    }

    #[test]
    fn a_new_template_is_the_base_and_the_block() {
        let new = v2(None, &ADD).unwrap();
        assert!(new.starts_with(BASE), "{new}");
        assert!(new.contains("[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.'nvidia'.options]\n  BinaryName = \"/usr/bin/nvhook-runtime\"\n  SystemdCgroup = {{ .SystemdCgroup }}\n"), "{new}");
        assert_eq!(v2(Some(&new), &ADD), Some(new.clone()), "idempotent");
        assert_eq!(v2(Some(&new), &REMOVE), None, "only the base is left");
    }

    #[test]
    fn every_other_byte_of_a_template_is_kept() {
        for template in [
            ADMIN.to_string(),
            format!("{ADMIN}\n"),
            format!("{ADMIN}\n\n"),
        ] {
            let added = v2(Some(&template), &ADD).unwrap();
            assert!(added.starts_with(&template), "{added}");
            assert!(added.contains(&format!("\n{BEGIN}")), "{added}");
            assert_eq!(v2(Some(&added), &ADD).unwrap(), added, "idempotent");
            assert_eq!(v2(Some(&added), &REMOVE).unwrap(), template);
            // An admin's lines after nvhook's block stay where they are.
            let later = format!("{added}# mine\n");
            assert_eq!(
                v2(Some(&later), &REMOVE).unwrap(),
                format!("{template}# mine\n")
            );
        }
        assert_eq!(
            v2(Some(ADMIN), &REMOVE).unwrap(),
            ADMIN,
            "nothing to remove"
        );
    }

    #[test]
    fn the_template_follows_the_containerd_k3s_renders() {
        assert_eq!(name_for("version = 3\nroot = '/x'\n"), V3_NAME);
        assert_eq!(name_for("version = 2\n"), V2_NAME);
        assert_eq!(name_for("[plugins.cri]\n"), V2_NAME);
        assert!(is_containerd_2(Path::new(V3_NAME)) && !is_containerd_2(Path::new(V2_NAME)));
    }

    #[test]
    fn containerd_2_templates_get_version_3_keys() {
        let new = apply(Path::new("/rke2/config-v3.toml.tmpl"), None, &ADD)
            .unwrap()
            .unwrap();
        assert!(
            new.contains("[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.'nvidia']"),
            "{new}"
        );
    }

    #[test]
    fn a_broken_block_and_a_default_runtime_are_refused() {
        let broken = format!("{BASE}{BEGIN} x\n");
        let Invalid(message) =
            apply(Path::new("config.toml.tmpl"), Some(&broken), &ADD).unwrap_err();
        assert!(message.contains("not one pair"), "{message}");
        let default = Change::Add {
            name: "nvidia",
            path: "/usr/bin/nvhook-runtime",
            set_as_default: true,
        };
        let Invalid(message) = apply(Path::new("config.toml.tmpl"), None, &default).unwrap_err();
        assert!(message.contains("--default-runtime"), "{message}");
    }
}
