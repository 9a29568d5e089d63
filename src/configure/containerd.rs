//! containerd's config.toml: a runtime handler for the CRI plugin whose shim runs
//! nvhook-runtime instead of runc (`options.BinaryName`).
//!
//! containerd 2 (config versions 3 and 4) merges the files its main config `imports` into
//! it key by key, so where the main config imports a drop-in directory (containerd 2.3's own
//! default imports `/etc/containerd/conf.d/*.toml`), nvhook's runtime goes into a drop-in
//! there and the main file is left as it is. containerd 1 (versions 1 and 2) replaces a
//! whole plugin section with an imported one: there the main file is edited.

use super::toml::{self as edit, dotted};
use super::{Change, Invalid, NriSetting};
use crate::glob::glob_matches;
use crate::version::Version;
use std::path::{Component, Path, PathBuf};
use toml_edit::{DocumentMut, Item, Table};

const RUNC_SHIM: &str = "io.containerd.runc.v2";

/// The name of nvhook's drop-in in an imported directory; NVIDIA's toolkit writes 99-nvidia.
const DROP_IN_NAME: &str = "99-nvhook.toml";

/// Marks a runc runtime that configure had to spell out, so that `--remove` takes it too.
const RUNC_MARKER: &str = "# nvhook: containerd 1.x drops its built-in runc runtime once any runtime is listed, so it is listed too";

/// The first lines of a drop-in nvhook writes.
const DROP_IN_HEADER: &str = "# Written by `nvhook configure containerd`; `nvhook configure containerd --remove` takes it out.\n";

/// The change for a main config that holds the runtime itself.
pub(super) fn apply(current: Option<&str>, change: &Change) -> Result<Option<String>, Invalid> {
    let mut doc = edit::parse(current)?;
    if matches!(change, Change::Add { .. }) && doc.as_table().is_empty() {
        // Nothing to keep compatible with: write the current format, not the deprecated v1.
        doc.insert("version", toml_edit::value(2));
    }
    let version = version(&doc)?;
    let containerd = containerd_path(version);
    // containerd 1.x replaces (not merges) its default runtime map with the file's, so a
    // lone `nvidia` entry would leave the CRI plugin without its default `runc`.
    if matches!(change, Change::Add { .. }) && version <= 2 {
        let runtimes = edit::table_mut(doc.as_table_mut(), &runtimes_path(&containerd))?;
        if runtimes.is_empty() {
            runtimes.insert("runc", Item::Table(builtin_runc()));
        }
    }
    let runc = item_at(doc.as_item(), &runtimes_path(&containerd))
        .and_then(|runtimes| runtimes.get("runc"))
        .cloned();
    change_runtime(&mut doc, &containerd, runc.as_ref(), change)?;
    Ok(Some(doc.to_string()))
}

/// The program runtime `name` runs in `current` (its `BinaryName`), where it has one.
pub(super) fn runtime_program(current: &str, name: &str) -> Option<String> {
    let doc = edit::parse(Some(current)).ok()?;
    let containerd = containerd_path(version(&doc).ok()?);
    let runtime = item_at(doc.as_item(), &runtimes_path(&containerd))?.get(name)?;
    runtime
        .get("options")?
        .get("BinaryName")?
        .as_str()
        .map(str::to_owned)
}

/// The drop-in that nvhook's runtime belongs in, for the main config `main` at `file`: in
/// the directory of the first `imports` entry that covers a file named [`DROP_IN_NAME`],
/// for containerd 2's config versions; `None` where the main file holds the runtime.
pub(super) fn drop_in(main: Option<&str>, file: &Path) -> Result<Option<PathBuf>, Invalid> {
    let doc = edit::parse(main)?;
    if version(&doc)? < 3 {
        return Ok(None);
    }
    let Some(imports) = doc.get("imports") else {
        return Ok(None);
    };
    let entries = imports
        .as_array()
        .and_then(|a| a.iter().map(|v| v.as_str()).collect::<Option<Vec<_>>>())
        .ok_or_else(|| {
            Invalid(format!(
                "`imports = {}` is not an array of paths",
                imports.to_string().trim().escape_default()
            ))
        })?;
    let base = file.parent().unwrap_or(Path::new("/"));
    Ok(entries.into_iter().find_map(|entry| {
        // containerd cleans each entry and joins a relative one to the main file's directory.
        let entry = base.join(clean(Path::new(entry)));
        let (dir, pattern) = (entry.parent()?, entry.file_name()?.to_str()?);
        let dir_has_glob = dir.to_str()?.contains(['*', '?', '[']);
        (!dir_has_glob && glob_matches(pattern, DROP_IN_NAME)).then(|| dir.join(DROP_IN_NAME))
    }))
}

/// The change for nvhook's drop-in (`current`, `None` when it does not exist yet), for the
/// main config `main`: the runtime starts from the main config's runc settings, in the main
/// config's format version. `None`: nothing is left in the drop-in.
pub(super) fn apply_drop_in(
    main: Option<&str>,
    current: Option<&str>,
    change: &Change,
) -> Result<Option<String>, Invalid> {
    let main = edit::parse(main)?;
    let new = format!("{DROP_IN_HEADER}version = {}\n", version(&main)?);
    let mut doc = edit::parse(Some(current.unwrap_or(&new)))?;
    let containerd = containerd_path(version(&doc)?);
    // The main file's layout (indentation, comments) means nothing in a file of its own.
    let runc = item_at(
        main.as_item(),
        &runtimes_path(&containerd_path(version(&main)?)),
    )
    .and_then(|runtimes| runtimes.get("runc"))
    .and_then(Item::as_table)
    .map(|runc| Item::Table(undecorated(runc)));
    change_runtime(&mut doc, &containerd, runc.as_ref(), change)?;
    let only_version_left = doc
        .iter()
        .all(|(key, item)| key == "version" || item.as_table().is_some_and(edit::is_blank));
    Ok((!only_version_left).then(|| doc.to_string()))
}

/// Where each config version keeps the NRI plugin's section: containerd 1.x reads a version
/// 1 file's plugins by their short id.
fn nri_path(version: i64) -> [&'static str; 2] {
    match version {
        1 => ["plugins", "nri"],
        _ => ["plugins", "io.containerd.nri.v1.nri"],
    }
}

/// What `current` says about NRI. Versions 1 and 2 are containerd 1.x's (1.7 ships NRI off);
/// containerd 2 (versions 3 and 4) runs it unless told not to.
pub(super) fn nri_setting(current: Option<&str>) -> Result<NriSetting, Invalid> {
    let doc = edit::parse(current)?;
    let version = version(&doc)?;
    let disable = item_at(doc.as_item(), &nri_path(version)).and_then(|nri| nri.get("disable"));
    Ok(match disable.map(|d| d.as_bool()) {
        None if version >= 3 => NriSetting::DefaultOn,
        None => NriSetting::DefaultOff,
        Some(Some(false)) => NriSetting::On,
        Some(Some(true)) => NriSetting::Off,
        Some(None) => {
            return Err(Invalid(format!(
                "`{}.disable` is not true or false",
                dotted(&nri_path(version))
            )));
        }
    })
}

/// Whether the containerd whose `containerd --version` says `text` has NRI (1.7 or later);
/// None when the text names no version.
pub fn has_nri(text: &str) -> Option<bool> {
    let (version, _) = version_word(text)?;
    Some(version.branch() >= [1, 7])
}

/// `containerd 1.6.20~ds1` of `containerd github.com/containerd/containerd 1.6.20~ds1 <commit>`.
pub fn version_words(text: &str) -> String {
    let word = version_word(text).map_or("(an unknown version)", |(_, word)| word);
    format!("containerd {word}")
}

/// The first word of `text` that is a version, and the version.
fn version_word(text: &str) -> Option<(Version, &str)> {
    text.split_whitespace()
        .find_map(|w| Version::parse(w).map(|(v, _)| (v, w)))
}

/// Whether a config has containerd's NRI table (1.7's `containerd config default` writes one;
/// 1.6 has no NRI).
pub fn names_nri(config: &str) -> bool {
    let Ok(doc) = edit::parse(Some(config)) else {
        return false;
    };
    version(&doc).is_ok_and(|v| item_at(doc.as_item(), &nri_path(v)).is_some())
}

/// `--nri`: NRI on where the config leaves it off (`disable = false`, noting what was there);
/// `--nri --remove`: what that changed, given back.
pub(super) fn apply_nri(current: Option<&str>, on: bool) -> Result<Option<String>, Invalid> {
    let setting = nri_setting(current)?;
    let mut doc = edit::parse(current)?;
    if on && doc.as_table().is_empty() {
        doc.insert("version", toml_edit::value(2));
    }
    let path = nri_path(version(&doc)?);
    if on && !setting.enabled() {
        edit::set_noted(
            edit::table_mut(doc.as_table_mut(), &path)?,
            "disable",
            false,
        );
    } else if !on {
        edit::remove_tidily(doc.as_table_mut(), &path, |root| {
            if let Some(nri) = edit::existing_table_mut(root, &path) {
                edit::unset_noted(nri, "disable");
            }
        });
    }
    let text = doc.to_string();
    Ok((current.is_some() || !text.trim().is_empty()).then_some(text))
}

/// The config format version. containerd 1.x reads a file without `version` as version 1.
fn version(doc: &DocumentMut) -> Result<i64, Invalid> {
    let Some(item) = doc.get("version") else {
        return Ok(1);
    };
    match item.as_integer() {
        Some(v @ 1..=4) => Ok(v),
        // A table or a multi-line value would break the one-line error: show it escaped.
        _ => Err(Invalid(format!(
            "unsupported `version = {}` (nvhook knows containerd config versions 1 to 4)",
            item.to_string().trim().escape_default()
        ))),
    }
}

/// Where the CRI plugin's `containerd` section lives in each config version.
fn containerd_path(version: i64) -> [&'static str; 3] {
    let plugin = match version {
        1 => "cri",
        2 => "io.containerd.grpc.v1.cri",
        // Version 4 moved server settings into plugins; the CRI runtime plugin kept its id.
        _ => "io.containerd.cri.v1.runtime",
    };
    ["plugins", plugin, "containerd"]
}

fn runtimes_path<'a>(containerd: &[&'a str; 3]) -> [&'a str; 4] {
    [containerd[0], containerd[1], containerd[2], "runtimes"]
}

/// `table` laid out afresh: no indentation, no comments, standard headers.
fn undecorated(table: &Table) -> Table {
    let mut out = table.clone();
    fn reset(table: &mut Table) {
        table.fmt();
        table.decor_mut().clear();
        table.set_position(None);
        for (_, child) in table.iter_mut() {
            if let Item::Table(child) = child {
                reset(child);
            }
        }
    }
    reset(&mut out);
    out
}

fn item_at<'a>(root: &'a Item, path: &[&str]) -> Option<&'a Item> {
    path.iter().try_fold(root, |item, key| item.get(key))
}

/// `path` as Go's filepath.Clean leaves it, for the parts containerd's imports use.
fn clean(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::ParentDir if out.file_name().is_some() => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// Applies `change` to `doc`; a runtime it adds starts from `runc`'s settings.
fn change_runtime(
    doc: &mut DocumentMut,
    containerd: &[&str; 3],
    runc: Option<&Item>,
    change: &Change,
) -> Result<(), Invalid> {
    match *change {
        Change::Add {
            name,
            path,
            set_as_default,
        } => add(doc, containerd, runc, name, path, set_as_default),
        Change::Remove { name } => {
            remove(doc, containerd, name);
            Ok(())
        }
        Change::Nri { .. } => unreachable!("Engine::apply takes NRI changes"),
    }
}

/// Adds runtime `name` (starting from `runc`'s settings when it is new) to `doc`.
fn add(
    doc: &mut DocumentMut,
    containerd: &[&str; 3],
    runc: Option<&Item>,
    name: &str,
    path: &str,
    set_as_default: bool,
) -> Result<(), Invalid> {
    let runtimes_path = runtimes_path(containerd);
    let runtimes = edit::table_mut(doc.as_table_mut(), &runtimes_path)?;
    if !runtimes.contains_key(name) {
        // Start from runc's settings (SystemdCgroup, ...): the GPU runtime must behave the same.
        let base = match runc {
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

    #[test]
    fn nri_by_containerd_version() {
        for (text, nri, words) in [
            (
                "containerd github.com/containerd/containerd 1.6.20~ds1 1.6.20~ds1-1+b1",
                Some(false),
                "containerd 1.6.20~ds1",
            ),
            (
                "containerd containerd.io v1.7.24 88bf19b2105c8b17560993bee28a01ddc2f97182",
                Some(true),
                "containerd v1.7.24",
            ),
            (
                "containerd github.com/containerd/containerd/v2 2.1.9+unknown",
                Some(true),
                "containerd 2.1.9+unknown",
            ),
            (
                "containerd github.com/containerd/containerd v1.5.13 ",
                Some(false),
                "containerd v1.5.13",
            ),
            ("something else", None, "containerd (an unknown version)"),
        ] {
            assert_eq!(has_nri(text), nri, "{text}");
            assert_eq!(version_words(text), words, "{text}");
        }
        assert!(names_nri(
            "version = 2\n[plugins.\"io.containerd.nri.v1.nri\"]\n  disable = true\n"
        ));
        assert!(!names_nri(
            "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\"]\n"
        ));
        assert!(!names_nri("not toml ["));
    }

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

    fn drop_in_of(main: &str) -> Option<PathBuf> {
        drop_in(Some(main), Path::new("/etc/containerd/config.toml")).unwrap()
    }

    #[test]
    fn the_drop_in_is_where_containerd_2_imports_toml_files_from() {
        let conf_d = Some(PathBuf::from("/etc/containerd/conf.d/99-nvhook.toml"));
        for imports in [
            "['/etc/containerd/conf.d/*.toml']",
            // Relative entries are joined to the main file's directory, and cleaned.
            "['conf.d/*.toml']",
            "['./conf.d/../conf.d/*.toml']",
            // The first entry that covers the name wins.
            "['/etc/containerd/extra.toml', '/etc/containerd/conf.d/9?-*.toml', '/x/*.toml']",
            "['/etc/containerd/conf.d/99-nvhook.toml']",
        ] {
            for version in [3, 4] {
                let main = format!("version = {version}\nimports = {imports}\n");
                assert_eq!(drop_in_of(&main), conf_d, "{main}");
            }
        }
        for (main, why) in [
            ("version = 4\n", "no imports"),
            ("version = 4\nimports = []\n", "empty imports"),
            (
                "version = 4\nimports = ['/etc/x/*.conf']\n",
                "not a .toml glob",
            ),
            (
                "version = 4\nimports = ['/etc/*/conf.d/*.toml']\n",
                "a glob in the directory",
            ),
            (
                "version = 4\nimports = ['/etc/x/[0-9]*.toml']\n",
                "a character class",
            ),
            (
                "version = 2\nimports = ['/etc/containerd/conf.d/*.toml']\n",
                "containerd 1",
            ),
        ] {
            assert_eq!(drop_in_of(main), None, "{why}");
        }
        let Invalid(message) =
            drop_in(Some("version = 3\nimports = ['a', 1]\n"), Path::new("/c")).unwrap_err();
        assert!(message.contains("not an array of paths"), "{message}");
    }

    #[test]
    fn a_drop_in_left_with_nothing_of_ours_is_retired() {
        let main = "version = 3\n";
        let add = Change::Add {
            name: "nvidia",
            path: "/usr/bin/nvhook-runtime",
            set_as_default: true,
        };
        let written = apply_drop_in(Some(main), None, &add).unwrap().unwrap();
        assert!(written.starts_with(DROP_IN_HEADER), "{written}");
        let remove = Change::Remove { name: "nvidia" };
        assert_eq!(
            apply_drop_in(Some(main), Some(&written), &remove).unwrap(),
            None
        );
        // A key an admin added to our drop-in keeps it.
        let edited = format!("{written}[debug]\nlevel = 'info'\n");
        assert!(
            apply_drop_in(Some(main), Some(&edited), &remove)
                .unwrap()
                .is_some()
        );
    }

    #[test]
    fn unknown_version_is_refused() {
        let change = Change::Remove { name: "nvidia" };
        let Invalid(message) = apply(Some("version = 5\n"), &change).unwrap_err();
        assert!(message.contains("`version = 5`"), "{message}");
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

    #[test]
    fn nri_is_turned_on_where_containerd_leaves_it_off_and_given_back() {
        let v2 = "version = 2\n\n[plugins]\n  [plugins.\"io.containerd.grpc.v1.cri\"]\n    sandbox_image = \"pause\"\n";
        let v1 = "[plugins.cri]\n  sandbox_image = \"pause\"\n";
        let off_v3 =
            "version = 3\n[plugins.'io.containerd.nri.v1.nri']\n  disable = true # not yet\n";
        for (text, section) in [
            (v2, "[plugins.\"io.containerd.nri.v1.nri\"]"),
            (v1, "[plugins.nri]"),
            (off_v3, "[plugins.'io.containerd.nri.v1.nri']"),
        ] {
            assert!(!nri_setting(Some(text)).unwrap().enabled(), "{text}");
            let on = apply_nri(Some(text), true).unwrap().unwrap();
            assert!(on.contains(section), "{on}");
            assert_eq!(nri_setting(Some(&on)).unwrap(), NriSetting::On, "{on}");
            assert_eq!(apply_nri(Some(&on), true).unwrap().unwrap(), on);
            assert_eq!(apply_nri(Some(&on), false).unwrap().unwrap(), text);
        }
        // containerd 2 runs NRI by default: nothing to change, nothing to take out.
        let v3 = "version = 3\n";
        assert_eq!(nri_setting(Some(v3)).unwrap(), NriSetting::DefaultOn);
        assert_eq!(apply_nri(Some(v3), true).unwrap().unwrap(), v3);
        assert_eq!(apply_nri(Some(v3), false).unwrap().unwrap(), v3);
        // No file: containerd 1.x's defaults, so a version 2 file that turns NRI on.
        let new = apply_nri(None, true).unwrap().unwrap();
        assert_eq!(nri_setting(Some(&new)).unwrap(), NriSetting::On, "{new}");
        assert_eq!(apply_nri(None, false).unwrap(), None);
        let Invalid(message) = nri_setting(Some(
            "version = 2\n[plugins.\"io.containerd.nri.v1.nri\"]\ndisable = 1\n",
        ))
        .unwrap_err();
        assert!(message.contains("not true or false"), "{message}");
    }
}
