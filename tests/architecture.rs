//! nvhook's map, checked: the model is a crate without I/O; the nvhook package's modules sit in
//! layers (docs/architecture.md) and import only their own layer and the ones below; and the
//! graph of `use crate::` and `super::` edges between the files of `src/` (and the paths
//! reached through a module imported by name, `delivery::edits::...`) has no cycle. Test
//! modules are left out: they may reach anywhere.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

type Module = Vec<String>;

/// Every library file under `src/` (not the binaries, not test modules), by module path.
fn modules(src: &Path) -> BTreeMap<Module, PathBuf> {
    let mut out = BTreeMap::new();
    let mut dirs = vec![src.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                if path.file_name() != Some("bin".as_ref()) {
                    dirs.push(path);
                }
                continue;
            }
            let Some(rel) = path.strip_prefix(src).unwrap().to_str() else {
                continue;
            };
            let Some(rel) = rel.strip_suffix(".rs") else {
                continue;
            };
            let mut module: Module = rel.split('/').map(String::from).collect();
            if module.last().is_some_and(|last| last == "tests") {
                continue;
            }
            if module
                .last()
                .is_some_and(|last| last == "mod" || last == "lib")
            {
                module.pop();
            }
            out.insert(module, path);
        }
    }
    out
}

/// `a::{b, c::{d, e as f}}` → `a::b`, `a::c::d`, `a::c::e`.
fn expand(tree: &str) -> Vec<String> {
    let tree = tree.trim();
    let Some(open) = tree.find('{') else {
        let plain = tree.split(" as ").next().unwrap_or(tree).trim();
        return vec![plain.to_string()];
    };
    let prefix = &tree[..open];
    let close = tree.rfind('}').filter(|&c| c > open).unwrap_or(tree.len());
    let body = &tree[open + 1..close];
    let (mut parts, mut depth, mut current) = (Vec::new(), 0, String::new());
    for c in body.chars() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(std::mem::take(&mut current));
                continue;
            }
            _ => {}
        }
        current.push(c);
    }
    parts.push(current);
    parts
        .iter()
        .filter(|p| !p.trim().is_empty())
        .flat_map(|p| expand(p))
        .map(|p| match p.strip_suffix("self") {
            Some(parent) if parent.is_empty() || parent.ends_with("::") => {
                format!("{prefix}{parent}")
                    .trim_end_matches("::")
                    .to_string()
            }
            _ => format!("{prefix}{p}"),
        })
        .collect()
}

/// The file a path names: its longest prefix that is a module of the crate.
fn resolve(modules: &BTreeMap<Module, PathBuf>, path: &[String]) -> Option<Module> {
    (1..=path.len())
        .rev()
        .map(|n| path[..n].to_vec())
        .find(|prefix| modules.contains_key(prefix))
}

/// `crate::x` and `super::x` segments from the file of `module`, as a path from the root.
fn absolute(module: &Module, segments: &[&str]) -> Option<Vec<String>> {
    let mut base = module.clone();
    let mut rest = segments;
    match rest.first() {
        Some(&"crate") => {
            base.clear();
            rest = &rest[1..];
        }
        Some(&"super") => {
            while rest.first() == Some(&"super") {
                base.pop()?;
                rest = &rest[1..];
            }
        }
        _ => return None,
    }
    base.extend(rest.iter().filter(|s| **s != "self").map(|s| s.to_string()));
    Some(base)
}

/// The trees of the `use` declarations in `code` (each from a line that starts one).
fn use_trees(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut lines = code.lines();
    while let Some(line) = lines.next() {
        let line = line.trim_start();
        let Some(start) = ["use ", "pub use ", "pub(crate) use ", "pub(super) use "]
            .iter()
            .find_map(|keyword| line.strip_prefix(keyword))
        else {
            continue;
        };
        let mut tree = start.to_string();
        while !tree.contains(';') {
            let Some(next) = lines.next() else { break };
            tree.push(' ');
            tree.push_str(next.trim());
        }
        let tree = tree.split(';').next().unwrap_or_default();
        out.push(tree.split_whitespace().collect::<Vec<_>>().join(" "));
    }
    out
}

fn edges(modules: &BTreeMap<Module, PathBuf>) -> BTreeMap<Module, BTreeSet<Module>> {
    let mut out = BTreeMap::new();
    for (module, file) in modules {
        let text = fs::read_to_string(file).unwrap();
        let text = text
            .split("#[cfg(test)]\nmod tests")
            .next()
            .unwrap_or_default();
        let code: String = text
            .lines()
            .map(|l| l.split("//").next().unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n");
        let mut targets = BTreeSet::new();
        let mut aliases: BTreeMap<String, Module> = BTreeMap::new();
        let add = |path: Vec<String>, targets: &mut BTreeSet<Module>| {
            if let Some(target) = resolve(modules, &path).filter(|t| t != module) {
                targets.insert(target);
            }
        };
        for tree in use_trees(&code) {
            for item in expand(&tree) {
                let segments: Vec<&str> = item.split("::").map(str::trim).collect();
                let Some(path) = absolute(module, &segments) else {
                    continue;
                };
                if modules.contains_key(&path) {
                    aliases.insert(path.last().cloned().unwrap_or_default(), path.clone());
                }
                add(path, &mut targets);
            }
        }
        // Paths in the code: `crate::a::b`, `super::c`, and `alias::d` for modules used by name.
        for word in code.split(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':')) {
            let segments: Vec<&str> = word.split("::").filter(|s| !s.is_empty()).collect();
            if segments.len() < 2 {
                continue;
            }
            if let Some(path) = absolute(module, &segments) {
                add(path, &mut targets);
            } else if let Some(base) = aliases.get(segments[0]) {
                let mut path = base.clone();
                path.extend(segments[1..].iter().map(|s| s.to_string()));
                add(path, &mut targets);
            }
        }
        out.insert(module.clone(), targets);
    }
    out
}

/// A cycle in `graph`, if there is one, as the modules along it.
fn find_cycle(graph: &BTreeMap<Module, BTreeSet<Module>>) -> Option<Vec<Module>> {
    fn visit(
        node: &Module,
        graph: &BTreeMap<Module, BTreeSet<Module>>,
        state: &mut BTreeMap<Module, bool>,
        stack: &mut Vec<Module>,
    ) -> Option<Vec<Module>> {
        state.insert(node.clone(), false);
        stack.push(node.clone());
        for next in graph.get(node).into_iter().flatten() {
            match state.get(next) {
                Some(false) => {
                    let from = stack.iter().position(|m| m == next).unwrap_or(0);
                    return Some(stack[from..].to_vec());
                }
                Some(true) => {}
                None => {
                    if let Some(cycle) = visit(next, graph, state, stack) {
                        return Some(cycle);
                    }
                }
            }
        }
        stack.pop();
        state.insert(node.clone(), true);
        None
    }
    let mut state = BTreeMap::new();
    graph.keys().find_map(|node| {
        (!state.contains_key(node)).then(|| visit(node, graph, &mut state, &mut Vec::new()))?
    })
}

/// The nvhook package's layers, lowest first, by top-level module of `src/`. The model (request,
/// inventory data, config, plan) is below them all, in its own crate.
const LAYERS: &[(&str, &[&str])] = &[
    (
        "system helpers",
        &[
            "atomic_file",
            "config",
            "entry",
            "file_id",
            "glob",
            "kept_config",
            "binary_paths",
            "log_line",
            "logging",
            "oci",
            "private_file",
            "privileges",
            "rootfs",
            "stable_hash",
            "whole_file",
        ],
    ),
    (
        "host readers",
        &[
            "dev_char",
            "elf_machine",
            "host_plan",
            "inventory",
            "labels",
            "nri_handoff",
            "plan_file",
        ],
    ),
    ("delivery", &["delivery"]),
    (
        "ways in",
        &["cdi", "dra", "hook", "nri", "nvidia_cli", "runtime_create"],
    ),
    ("commands", &["configure", "doctor"]),
];

/// The layer of a module, by its top-level module.
fn layer_of(module: &Module) -> Option<usize> {
    let top = module.first()?;
    LAYERS
        .iter()
        .position(|(_, members)| members.contains(&top.as_str()))
}

/// Each import that reaches up a layer, as `from -> to (lower layer -> higher layer)`.
fn layer_violations(graph: &BTreeMap<Module, BTreeSet<Module>>) -> Vec<String> {
    let mut out = Vec::new();
    for (from, targets) in graph {
        for to in targets {
            if let (Some(a), Some(b)) = (layer_of(from), layer_of(to))
                && b > a
            {
                out.push(format!(
                    "{} -> {} ({} -> {})",
                    from.join("/"),
                    to.join("/"),
                    LAYERS[a].0,
                    LAYERS[b].0
                ));
            }
        }
    }
    out
}

#[test]
fn the_module_graph_has_no_cycle_and_no_import_up_a_layer() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let modules = modules(&src);
    assert!(modules.len() > 40, "only {} modules found", modules.len());
    let unplaced: Vec<String> = modules
        .keys()
        .filter(|m| !m.is_empty() && layer_of(m).is_none())
        .map(|m| m.join("/"))
        .collect();
    assert!(
        unplaced.is_empty(),
        "modules in no layer (place them in LAYERS and docs/architecture.md): {unplaced:?}"
    );
    let graph = edges(&modules);
    // The check itself: nvhook-runtime's create path plans through host_plan, which the hook
    // uses too, and turns the plan into edits through the delivery layer.
    let create = &graph[&vec!["runtime_create".to_string()]];
    assert!(
        create.contains(&vec!["host_plan".to_string()]),
        "{create:?}"
    );
    assert!(create.contains(&vec!["delivery".to_string()]), "{create:?}");
    let up = layer_violations(&graph);
    assert!(up.is_empty(), "imports up a layer:\n{}", up.join("\n"));
    if let Some(cycle) = find_cycle(&graph) {
        let names: Vec<String> = cycle.iter().map(|m| m.join("/")).collect();
        panic!("import cycle: {} -> back to the first", names.join(" -> "));
    }
}

#[test]
fn an_import_up_a_layer_is_found() {
    let m = |path: &str| -> Module { path.split('/').map(String::from).collect() };
    let mut graph = BTreeMap::new();
    graph.insert(
        m("hook/prestart"),
        BTreeSet::from([m("delivery"), m("rootfs")]),
    );
    graph.insert(m("delivery/edits"), BTreeSet::from([m("inventory")]));
    assert!(layer_violations(&graph).is_empty());
    graph.insert(m("delivery/edits"), BTreeSet::from([m("nri/adjust")]));
    assert_eq!(
        layer_violations(&graph),
        ["delivery/edits -> nri/adjust (delivery -> ways in)"]
    );
}

#[test]
fn a_cycle_is_found_where_there_is_one() {
    let m = |name: &str| vec![name.to_string()];
    let mut graph = BTreeMap::new();
    graph.insert(m("a"), BTreeSet::from([m("b")]));
    graph.insert(m("b"), BTreeSet::from([m("c")]));
    graph.insert(m("c"), BTreeSet::from([m("a")]));
    assert_eq!(find_cycle(&graph).map(|c| c.len()), Some(3));
    graph.insert(m("c"), BTreeSet::new());
    assert_eq!(find_cycle(&graph), None);
    assert_eq!(
        expand("crate::{a, b::{c, d as e}, f::self}"),
        ["crate::a", "crate::b::c", "crate::b::d", "crate::f"]
    );
}

/// The dependencies (normal ones, not dev or build) a crate's manifest names.
fn dependencies(manifest: &Path) -> Vec<String> {
    let text = fs::read_to_string(manifest).unwrap();
    let doc: toml::Table = toml::from_str(&text).unwrap();
    doc.get("dependencies")
        .and_then(|d| d.as_table())
        .map(|t| t.keys().cloned().collect())
        .unwrap_or_default()
}

/// What the model and the crates it builds on may depend on: data, formats and logging.
const MODEL_MAY_USE: &[&str] = &[
    "nvhook-ldcache",
    "nvhook-runtime",
    "serde",
    "serde_json",
    "thiserror",
    "toml",
    "toml_edit",
    "tracing",
];

/// Source text that would mean I/O in the model.
const IO_IN_SOURCE: &[&str] = &[
    "std::fs",
    "std::process",
    "std::net",
    "std::os::",
    "File::",
    "libc::",
    "nix::",
    "pathrs",
    "caps::",
];

/// The model is a crate with no I/O (no nix, pathrs, caps, libc, nvml-wrapper or anything of
/// nvhook's in it or in the workspace crates it builds on, and no file, process or socket call
/// in its source), and the NVML helper depends on it, not on the whole nvhook package.
#[test]
fn the_model_has_no_io_and_the_nvml_helper_depends_on_it_alone() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for krate in ["model", "ldcache", "runtime"] {
        let deps = dependencies(&root.join("crates").join(krate).join("Cargo.toml"));
        let foreign: Vec<&String> = deps
            .iter()
            .filter(|d| !MODEL_MAY_USE.contains(&d.as_str()))
            .collect();
        assert!(foreign.is_empty(), "crates/{krate} depends on {foreign:?}");
    }
    assert!(
        dependencies(&root.join("crates/model/Cargo.toml")).contains(&"serde".to_string()),
        "the manifest was not read"
    );
    let mut dirs = vec![root.join("crates/model/src")];
    let mut files = 0;
    while let Some(dir) = dirs.pop() {
        for entry in fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            files += 1;
            let text = fs::read_to_string(&path).unwrap();
            let code = text.split("#[cfg(test)]").next().unwrap_or_default();
            for line in code.lines().filter(|l| !l.trim_start().starts_with("//")) {
                if let Some(io) = IO_IN_SOURCE.iter().find(|io| line.contains(*io)) {
                    panic!("{}: `{io}` in the model: {line}", path.display());
                }
            }
        }
    }
    assert!(files > 20, "only {files} model files found");
    let nvml = dependencies(&root.join("crates/nvml/Cargo.toml"));
    assert!(nvml.iter().any(|d| d == "nvhook-model"), "{nvml:?}");
    assert!(!nvml.iter().any(|d| d == "nvhook"), "{nvml:?}");
}
