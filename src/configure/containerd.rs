//! containerd's config.toml: a runtime handler for the CRI plugin whose shim runs
//! nvhook-runtime instead of runc (`options.BinaryName`).

use super::toml::{self as edit, dotted};
use super::{Change, Invalid};
use toml_edit::{DocumentMut, Item, Table};

const RUNC_SHIM: &str = "io.containerd.runc.v2";

/// Marks a runc runtime that configure had to spell out, so that `--remove` takes it too.
const RUNC_MARKER: &str = "# nvhook: containerd 1.x drops its built-in runc runtime once any runtime is listed, so it is listed too";

pub(super) fn apply(current: Option<&str>, change: &Change) -> Result<Option<String>, Invalid> {
    let mut doc = edit::parse(current)?;
    if matches!(change, Change::Add { .. }) && doc.as_table().is_empty() {
        // Nothing to keep compatible with: write the current format, not the deprecated v1.
        doc.insert("version", toml_edit::value(2));
    }
    let version = version(&doc)?;
    let containerd = containerd_path(version);
    match *change {
        Change::Add {
            name,
            path,
            set_as_default,
        } => add(&mut doc, version, &containerd, name, path, set_as_default)?,
        Change::Remove { name } => remove(&mut doc, &containerd, name),
    }
    Ok(Some(doc.to_string()))
}

/// The config format version. containerd 1.x reads a file without `version` as version 1.
fn version(doc: &DocumentMut) -> Result<i64, Invalid> {
    let Some(item) = doc.get("version") else {
        return Ok(1);
    };
    match item.as_integer() {
        Some(v @ 1..=3) => Ok(v),
        // A table or a multi-line value would break the one-line error: show it escaped.
        _ => Err(Invalid(format!(
            "unsupported `version = {}` (nvhook knows containerd config versions 1, 2 and 3)",
            item.to_string().trim().escape_default()
        ))),
    }
}

/// Where the CRI plugin's `containerd` section lives in each config version.
fn containerd_path(version: i64) -> [&'static str; 3] {
    let plugin = match version {
        1 => "cri",
        2 => "io.containerd.grpc.v1.cri",
        _ => "io.containerd.cri.v1.runtime",
    };
    ["plugins", plugin, "containerd"]
}

fn runtimes_path<'a>(containerd: &[&'a str; 3]) -> [&'a str; 4] {
    [containerd[0], containerd[1], containerd[2], "runtimes"]
}

fn add(
    doc: &mut DocumentMut,
    version: i64,
    containerd: &[&str; 3],
    name: &str,
    path: &str,
    set_as_default: bool,
) -> Result<(), Invalid> {
    let runtimes_path = runtimes_path(containerd);
    let runtimes = edit::table_mut(doc.as_table_mut(), &runtimes_path)?;
    // containerd 1.x replaces (not merges) its default runtime map with the file's, so a
    // lone `nvidia` entry would leave the CRI plugin without its default `runc` and failing.
    if version <= 2 && runtimes.is_empty() {
        runtimes.insert("runc", Item::Table(builtin_runc()));
    }
    if !runtimes.contains_key(name) {
        // Start from runc's settings (SystemdCgroup, ...): the GPU runtime must behave the same.
        let base = match runtimes.get("runc") {
            Some(runc) if runc.is_table_like() => edit::relocatable(runc),
            _ => Item::Table(Table::new()),
        };
        runtimes.insert(name, base);
    }
    let runtime_path = [&runtimes_path[..], &[name]].concat();
    let runtime = runtimes
        .get_mut(name)
        .and_then(Item::as_table_like_mut)
        .ok_or_else(|| Invalid(format!("`{}` is not a table", dotted(&runtime_path))))?;
    // Without runtime_type containerd 2 rejects the runtime.
    edit::set_str(runtime, "runtime_type", RUNC_SHIM);
    let options_path = [&runtime_path[..], &["options"]].concat();
    let options = edit::table_like_mut(runtime, "options", &options_path)?;
    edit::set_str(options, "BinaryName", path);
    if set_as_default {
        let section = edit::table_mut(doc.as_table_mut(), containerd)?;
        edit::set_default(section, "default_runtime_name", name);
    }
    Ok(())
}

fn builtin_runc() -> Table {
    let mut runc = Table::new();
    runc.decor_mut().set_prefix(format!("\n{RUNC_MARKER}\n"));
    runc.insert("runtime_type", toml_edit::value(RUNC_SHIM));
    runc
}

fn remove(doc: &mut DocumentMut, containerd: &[&str; 3], name: &str) {
    let runtimes_path = runtimes_path(containerd);
    edit::remove_tidily(doc.as_table_mut(), &runtimes_path, |root| {
        if let Some(runtimes) = edit::existing_table_mut(root, &runtimes_path) {
            runtimes.remove(name);
            let only_our_runc = runtimes.len() == 1
                && runtimes
                    .get("runc")
                    .and_then(Item::as_table)
                    .and_then(|runc| runc.decor().prefix()?.as_str())
                    .is_some_and(|prefix| prefix.contains(RUNC_MARKER));
            if only_our_runc {
                runtimes.remove("runc");
            }
        }
        if let Some(section) = edit::existing_table_mut(root, containerd) {
            edit::unset_default(section, "default_runtime_name", name);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn add_nvidia(text: Option<&str>, set_as_default: bool) -> String {
        let change = Change::Add {
            name: "nvidia",
            path: "/usr/bin/nvhook-runtime",
            set_as_default,
        };
        apply(text, &change).unwrap().unwrap()
    }

    fn remove_nvidia(text: &str) -> String {
        apply(Some(text), &Change::Remove { name: "nvidia" })
            .unwrap()
            .unwrap()
    }

    #[test]
    fn missing_file_becomes_version_2_with_runc_kept() {
        let out = add_nvidia(None, false);
        let doc: DocumentMut = out.parse().unwrap();
        assert_eq!(doc["version"].as_integer(), Some(2));
        let runtimes = &doc["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"];
        assert_eq!(runtimes["runc"]["runtime_type"].as_str(), Some(RUNC_SHIM));
        assert_eq!(runtimes["nvidia"]["runtime_type"].as_str(), Some(RUNC_SHIM));
        assert_eq!(
            runtimes["nvidia"]["options"]["BinaryName"].as_str(),
            Some("/usr/bin/nvhook-runtime")
        );
    }

    #[test]
    fn no_version_is_version_1_and_uses_the_cri_plugin_id() {
        let text = "[plugins.cri]\n  sandbox_image = \"pause\"\n";
        let doc: DocumentMut = add_nvidia(Some(text), false).parse().unwrap();
        assert!(doc.get("version").is_none());
        let cri = &doc["plugins"]["cri"];
        assert_eq!(cri["sandbox_image"].as_str(), Some("pause"));
        assert!(cri["containerd"]["runtimes"]["nvidia"].is_table());
    }

    #[test]
    fn version_3_uses_the_runtime_plugin_and_adds_no_runc() {
        let doc: DocumentMut = add_nvidia(Some("version = 3\n"), false).parse().unwrap();
        let runtimes = &doc["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]["runtimes"];
        assert!(runtimes["nvidia"].is_table());
        assert!(runtimes.get("runc").is_none());
    }

    #[test]
    fn unknown_version_is_refused() {
        let change = Change::Remove { name: "nvidia" };
        let Invalid(message) = apply(Some("version = 4\n"), &change).unwrap_err();
        assert!(message.contains("`version = 4`"), "{message}");
        // Found by fuzzing: a `[version]` table used to print across several lines.
        let Invalid(message) = apply(Some("[version]\na = 1\nb = 2\n"), &change).unwrap_err();
        assert!(!message.contains('\n'), "{message}");
    }

    #[test]
    fn copies_runc_options_and_overrides_binary_name() {
        let text = r#"version = 2
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
    SystemdCgroup = true
    BinaryName = "/usr/sbin/runc"
"#;
        let doc: DocumentMut = add_nvidia(Some(text), false).parse().unwrap();
        let runtimes = &doc["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"];
        let options = &runtimes["nvidia"]["options"];
        assert_eq!(options["SystemdCgroup"].as_bool(), Some(true));
        assert_eq!(
            options["BinaryName"].as_str(),
            Some("/usr/bin/nvhook-runtime")
        );
        assert_eq!(
            runtimes["runc"]["options"]["BinaryName"].as_str(),
            Some("/usr/sbin/runc")
        );
    }

    #[test]
    fn inline_runtime_tables_are_edited_in_place() {
        let text = "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes]\nnvidia = { runtime_type = \"io.containerd.runc.v2\", options = { BinaryName = \"/old\" } }\n";
        let out = add_nvidia(Some(text), false);
        assert_eq!(out, text.replace("/old", "/usr/bin/nvhook-runtime"));
    }

    #[test]
    fn remove_restores_a_file_that_had_no_runtimes() {
        let text =
            "version = 2\n\n[plugins.\"io.containerd.grpc.v1.cri\"]\n  sandbox_image = \"pause\"\n";
        let configured = add_nvidia(Some(text), true);
        assert_eq!(remove_nvidia(&configured), text);
    }

    #[test]
    fn remove_keeps_a_default_that_is_not_ours() {
        let text = "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd]\n  default_runtime_name = \"crun\"\n";
        let configured = add_nvidia(Some(text), false);
        assert_eq!(remove_nvidia(&configured), text);
    }
}
