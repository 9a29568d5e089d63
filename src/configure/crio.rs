//! CRI-O: a runtime in a crio.conf.d drop-in, `[crio.runtime.runtimes.<name>]`.

use super::toml as edit;
use super::{Change, Invalid, NriSetting};
const RUNTIME: [&str; 2] = ["crio", "runtime"];

/// The program runtime `name` runs in `current`, where it has one.
pub(super) fn runtime_program(current: &str, name: &str) -> Option<String> {
    let doc = edit::parse(Some(current)).ok()?;
    let runtime = doc
        .get(RUNTIME[0])?
        .get(RUNTIME[1])?
        .get("runtimes")?
        .get(name)?;
    runtime.get("runtime_path")?.as_str().map(str::to_owned)
}

const NRI: [&str; 2] = ["crio", "nri"];

/// What `current` says about NRI: on by default since CRI-O 1.30.
pub(super) fn nri_setting(current: Option<&str>) -> Result<NriSetting, Invalid> {
    let doc = edit::parse(current)?;
    let enable = doc
        .get(NRI[0])
        .and_then(|c| c.get(NRI[1]))
        .and_then(|n| n.get("enable_nri"));
    match enable.map(|e| e.as_bool()) {
        None => Ok(NriSetting::DefaultOn),
        Some(Some(true)) => Ok(NriSetting::On),
        Some(Some(false)) => Ok(NriSetting::Off),
        Some(None) => Err(Invalid("`crio.nri.enable_nri` is not true or false".into())),
    }
}

pub(super) fn apply(current: Option<&str>, change: &Change) -> Result<Option<String>, Invalid> {
    let mut doc = edit::parse(current)?;
    let root = doc.as_table_mut();
    match *change {
        Change::Add {
            name,
            path,
            set_as_default,
        } => {
            let runtime_path = [RUNTIME[0], RUNTIME[1], "runtimes", name];
            let runtime = edit::table_mut(root, &runtime_path)?;
            // Created as implicit on the way; this one carries values and needs its header.
            runtime.set_implicit(false);
            edit::set_str(runtime, "runtime_path", path);
            edit::set_str(runtime, "runtime_type", "oci");
            if set_as_default {
                edit::set_default(edit::table_mut(root, &RUNTIME)?, "default_runtime", name);
            }
        }
        Change::Remove { name } => {
            let runtimes_path = [RUNTIME[0], RUNTIME[1], "runtimes"];
            edit::remove_tidily(root, &runtimes_path, |root| {
                if let Some(runtimes) = edit::existing_table_mut(root, &runtimes_path) {
                    runtimes.remove(name);
                }
                if let Some(section) = edit::existing_table_mut(root, &RUNTIME) {
                    edit::unset_default(section, "default_runtime", name);
                }
            });
        }
        // `enable_nri = true` in the drop-in, whatever the CRI-O version's default.
        Change::Nri { on: true } => {
            let nri = edit::table_mut(root, &NRI)?;
            nri.set_implicit(false);
            edit::set_noted(nri, "enable_nri", true);
        }
        Change::Nri { on: false } => edit::remove_tidily(root, &NRI, |root| {
            if let Some(nri) = edit::existing_table_mut(root, &NRI) {
                edit::unset_noted(nri, "enable_nri");
            }
        }),
    }
    let text = doc.to_string();
    // CRI-O reads a missing drop-in as an empty one: give back the file's absence.
    Ok((!text.trim().is_empty()).then_some(text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drop_in_from_nothing() {
        let change = Change::Add {
            name: "nvidia",
            path: "/usr/bin/nvhook-runtime",
            set_as_default: true,
        };
        let out = apply(None, &change).unwrap().unwrap();
        let expected = "[crio.runtime]\ndefault_runtime = \"nvidia\"\n\n[crio.runtime.runtimes.nvidia]\nruntime_path = \"/usr/bin/nvhook-runtime\"\nruntime_type = \"oci\"\n";
        assert_eq!(out, expected);
        assert_eq!(
            apply(Some(&out), &Change::Remove { name: "nvidia" }).unwrap(),
            None
        );
    }

    #[test]
    fn nri_drop_in_from_nothing_and_back() {
        let out = apply(None, &Change::Nri { on: true }).unwrap().unwrap();
        assert_eq!(out, "[crio.nri]\nenable_nri = true # nvhook: was unset\n");
        assert_eq!(nri_setting(Some(&out)).unwrap(), NriSetting::On);
        assert_eq!(apply(Some(&out), &Change::Nri { on: false }).unwrap(), None);
        assert_eq!(nri_setting(None).unwrap(), NriSetting::DefaultOn);
    }
}
